"""Held-out figures for the stagnation detector: leave-one-source-out tuning and a bootstrap.

The dev-set figure of ``bench/stagnation_eval.py`` is read on the runs its thresholds were
chosen on. This module answers what a held-out set would: for each source (dataset) in turn,
the thresholds are chosen by a small grid search on the *other* sources' labelled runs and the
chosen configuration is scored on the held-out source; the held-out runs of every fold are
pooled into one recall-within-8 and one false-alarm rate, with a percentile bootstrap interval.

Pure functions over per-run :class:`RunRecord` values (what a replay found on one labelled
run under one configuration), so the folds, the selection rule and the bootstrap are tested
without trajectories. Standard library only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "FA_TARGET",
    "Fold",
    "Interval",
    "LosoResult",
    "RunRecord",
    "bootstrap_interval",
    "false_alarm_rate",
    "leave_one_source_out",
    "recall_within",
    "record_for",
    "select_config",
]

WITHIN = 8
"""Recall within 8 steps: a fire in ``[onset, min(end + 2, onset + 8)]``."""

FA_TARGET = 0.03
"""The selection rule's ceiling on the training false-alarm rate (the issue's target)."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One labelled run under one configuration: its source, its label and what was caught.

    ``detected8`` (stuck runs): a fire within 8 steps of onset. ``false_alarm`` (progressing
    runs): any fire at all.
    """

    key: tuple[str, str, str]
    source: str
    stuck: bool
    detected8: bool = False
    false_alarm: bool = False


def record_for(
    key: tuple[str, str, str], label: Mapping[str, object], fires: Sequence[int]
) -> RunRecord:
    """The record of a run from its label (the labelled set's schema) and the steps it fired
    at, by the scorer's own definitions (``score_stagnation.evaluate``)."""
    source = key[0]
    if label["label"] != "stuck":
        return RunRecord(key, source, stuck=False, false_alarm=bool(fires))
    onset, end = label["onset_step"], label["end_step"]
    if not isinstance(onset, int) or not isinstance(end, int):
        raise ValueError(
            f"stuck run {key} has onset_step={onset!r}, end_step={end!r}; a stuck label needs "
            "both as step indices"
        )
    last = min(end + 2, onset + WITHIN)
    return RunRecord(key, source, stuck=True, detected8=any(onset <= f <= last for f in fires))


def recall_within(records: Sequence[RunRecord]) -> float:
    """Share of stuck runs caught within 8 steps of onset (NaN without stuck runs)."""
    stuck = [r for r in records if r.stuck]
    return sum(r.detected8 for r in stuck) / len(stuck) if stuck else float("nan")


def false_alarm_rate(records: Sequence[RunRecord]) -> float:
    """Share of progressing runs with any alarm (NaN without progressing runs)."""
    progressing = [r for r in records if not r.stuck]
    return (
        sum(r.false_alarm for r in progressing) / len(progressing) if progressing else float("nan")
    )


def _score(records: Sequence[RunRecord]) -> tuple[float, float]:
    recall, fa = recall_within(records), false_alarm_rate(records)
    return (0.0 if math.isnan(recall) else recall), (0.0 if math.isnan(fa) else fa)


def select_config(
    records_by_config: Mapping[str, Sequence[RunRecord]], training: Callable[[RunRecord], bool]
) -> str:
    """The configuration a tuner would pick on the ``training`` runs.

    Among configurations whose training false-alarm rate is at most :data:`FA_TARGET`, the one
    with the highest recall within 8; when none meets the ceiling, the lowest false-alarm rate,
    then the highest recall. Ties go to the first in ``records_by_config`` order (put the
    defaults first: a change must beat them, not tie them).
    """
    best: tuple[bool, float, float] | None = None
    chosen = ""
    for name, records in records_by_config.items():
        recall, fa = _score([r for r in records if training(r)])
        within = fa <= FA_TARGET
        rank = (within, recall, -fa) if within else (within, -fa, recall)
        if best is None or rank > best:
            best, chosen = rank, name
    if best is None:
        raise ValueError("select_config needs at least one configuration; pass the grid")
    return chosen


@dataclass(frozen=True, slots=True)
class Fold:
    """One fold: the held-out source, the configuration chosen on the others, and its
    training and held-out figures."""

    source: str
    chosen: str
    train_recall: float
    train_fa: float
    held_out: tuple[RunRecord, ...]

    @property
    def recall(self) -> float:
        """Recall within 8 on the held-out source."""
        return recall_within(self.held_out)

    @property
    def false_alarms(self) -> float:
        """False-alarm rate on the held-out source's progressing runs."""
        return false_alarm_rate(self.held_out)


@dataclass(frozen=True, slots=True)
class LosoResult:
    """Every fold, and the held-out runs of all folds pooled."""

    folds: tuple[Fold, ...]

    @property
    def pooled(self) -> list[RunRecord]:
        """Each labelled run once, scored under the configuration chosen without its source."""
        return [record for fold in self.folds for record in fold.held_out]

    @property
    def recall(self) -> float:
        """Pooled held-out recall within 8."""
        return recall_within(self.pooled)

    @property
    def false_alarms(self) -> float:
        """Pooled held-out false-alarm rate."""
        return false_alarm_rate(self.pooled)


def _not_from(source: str) -> Callable[[RunRecord], bool]:
    def training(record: RunRecord) -> bool:
        return record.source != source

    return training


def leave_one_source_out(records_by_config: Mapping[str, Sequence[RunRecord]]) -> LosoResult:
    """For each source, choose on the others (:func:`select_config`), score on it.

    Every configuration's records must list the same runs in the same order.
    """
    lists = list(records_by_config.values())
    if not lists:
        raise ValueError("leave_one_source_out needs at least one configuration; pass the grid")
    keys = [r.key for r in lists[0]]
    for name, records in records_by_config.items():
        if [r.key for r in records] != keys:
            raise ValueError(
                f"configuration {name!r} was scored on other runs than the first one; replay "
                "every configuration on the same labelled runs, in the same order"
            )
    sources = sorted({r.source for r in lists[0]})
    folds = []
    for source in sources:
        chosen = select_config(records_by_config, _not_from(source))
        records = records_by_config[chosen]
        train = [r for r in records if r.source != source]
        train_recall, train_fa = recall_within(train), false_alarm_rate(train)
        held = tuple(r for r in records if r.source == source)
        folds.append(Fold(source, chosen, train_recall, train_fa, held))
    return LosoResult(tuple(folds))


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def bootstrap_interval(
    outcomes: Sequence[bool], *, resamples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """The share of True in ``outcomes`` and its percentile bootstrap interval.

    ``outcomes`` are per-run hits (a stuck run caught within 8, or a progressing run alarmed);
    runs are resampled with replacement ``resamples`` times with a :class:`random.Random`
    seeded by ``seed``, so the interval is reproducible. An empty sequence gives NaNs.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}; use e.g. 2000")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}; use e.g. 0.95")
    n = len(outcomes)
    if n == 0:
        nan = float("nan")
        return Interval(nan, nan, nan)
    hits = [1 if outcome else 0 for outcome in outcomes]
    rng = random.Random(seed)
    shares = sorted(sum(rng.choices(hits, k=n)) / n for _ in range(resamples))
    tail = (1.0 - confidence) / 2
    low = shares[int(tail * (resamples - 1))]
    high = shares[round((1.0 - tail) * (resamples - 1))]
    return Interval(sum(hits) / n, low, high)
