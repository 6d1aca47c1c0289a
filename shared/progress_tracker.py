"""Per-step retry limits and stuck detection on consecutive errors (Symbiont §10).

A step is stopped when it reaches ``max_reattempts_per_step`` attempts, or earlier when two
consecutive errors are at least ``similarity_threshold`` similar (normalised Levenshtein), which
means the step is stuck. With ``normalize_volatile`` (the default) both errors are compared after
:func:`shared.volatile.normalize_volatile`, so ``/bin/bash: line 334`` and ``line 352`` count as
the same error.

Cost is bounded. Plain normalised Levenshtein is quadratic (seconds, up to tens of seconds, for
two 1 MB errors), so the tracker decides "similar enough?" in three tiers:

1. **Exact and cheap**: identical errors are 1.0; a length ratio below the threshold is a "no",
   since ``similarity <= min(len) / max(len)``.
2. **Exact, banded** (both errors up to :data:`EXACT_SIMILARITY_MAX_CHARS` code points): the
   threshold becomes the largest edit distance that still passes, and rapidfuzz computes the
   distance only inside that band (``score_cutoff``), growing the band from small
   (``score_hint``) so that near-identical errors cost almost nothing. The decision and the
   reported percentage are exactly those of :func:`normalized_similarity` (of the normalised
   errors, when normalising).
3. **Estimated, bounded** (either error longer): tier 2 runs on a sample of fixed size, the
   head, the tail and evenly spaced windows of the previous error (cut at line ends, so that no
   volatile token is split), each window matched in the current error by a digit-free probe
   found verbatim, and the result is capped by the length ratio of the whole errors. Heads and
   tails carry the exception, its message and the innermost frames of a stack trace; the probes
   keep the middle windows aligned when text was inserted or removed upstream. The percentage
   reported for such errors is this estimate. Anything that reads the whole error would break
   the budget (masking volatile tokens alone costs about 140 ms per MB, hashing every line about
   4 ms), whereas the sample costs the same at 100 KB as at 100 MB. A difference that falls
   between the windows is missed, and one that falls inside them weighs more than its share;
   when the estimate misses a stuck step, the attempt limit still stops it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from itertools import islice
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rapidfuzz.distance import Levenshtein

from shared.volatile import normalize_volatile

__all__ = [
    "ANCHOR_PROBE_CHARS",
    "EXACT_SIMILARITY_MAX_CHARS",
    "SAMPLE_WINDOWS",
    "SAMPLE_WINDOW_CHARS",
    "LimitAction",
    "ProgressTracker",
    "ProgressTrackerState",
    "StepDecision",
    "StepIterationConfig",
    "StepProgress",
    "normalized_similarity",
    "similarity_at_least",
]

EXACT_SIMILARITY_MAX_CHARS = 64 * 1024
"""Errors up to this many code points are compared exactly; longer ones through a sample."""

SAMPLE_WINDOWS = 8
"""Windows sampled from a long error: the head, the tail and evenly spaced ones between."""

SAMPLE_WINDOW_CHARS = 512
"""Code points per sampled window (so a sample holds at most 4 KB of each error)."""

ANCHOR_PROBE_CHARS = 32
"""Length of the digit-free probe that locates a window of the previous error in the current."""

_ANCHOR_PROBES_PER_WINDOW = 4
_ANCHOR_SEARCH_CHARS = 8 * 1024
_ANCHOR_PROBE = re.compile(rf"\D{{{ANCHOR_PROBE_CHARS}}}")
_SAMPLE_SEPARATOR = "\n"
_WINDOW_SLACK_CHARS = SAMPLE_WINDOW_CHARS // 4
# Start the banded computation small: near-identical errors then cost almost nothing.
_DISTANCE_HINT = 32
# The last errors of the live steps, normalised once each: every error is compared twice.
_NORMALIZED_CACHE_SIZE = 8


class LimitAction(StrEnum):
    """What the coordinator does when a step reaches its limit."""

    SKIP_STEP = "skip_step"
    ABORT_TASK = "abort_task"
    ESCALATE = "escalate"


_LIMIT_ALIASES = {
    "skipstep": LimitAction.SKIP_STEP,
    "aborttask": LimitAction.ABORT_TASK,
    "escalate": LimitAction.ESCALATE,
}


class StepIterationConfig(BaseModel):
    """Limits of one step: reattempts, the stuck threshold, and what to do at the limit."""

    model_config = ConfigDict(frozen=True)

    max_reattempts_per_step: int = Field(default=2, ge=0)
    similarity_threshold: float = Field(default=0.85, ge=0.0, le=1.0)
    on_limit_reached: LimitAction = LimitAction.SKIP_STEP
    normalize_volatile: bool = True

    @field_validator("on_limit_reached", mode="before")
    @classmethod
    def _accept_symbiont_spelling(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.replace("_", "").replace("-", "").lower()
            if key in _LIMIT_ALIASES:
                return _LIMIT_ALIASES[key]
        return value


class StepDecision(BaseModel):
    """Continue (``stop`` False) or Stop with a ``reason`` that says why."""

    model_config = ConfigDict(frozen=True)

    stop: bool = False
    reason: str | None = None

    @classmethod
    def continue_(cls) -> StepDecision:
        """Go on with the step."""
        return cls()

    @classmethod
    def stop_because(cls, reason: str) -> StepDecision:
        """Stop the step for ``reason``."""
        return cls(stop=True, reason=reason)


# --- similarity ---------------------------------------------------------------------------


def _similarity_from_distance(distance: int, longest: int) -> float:
    return 1.0 - distance / longest


def normalized_similarity(a: str, b: str) -> float:
    """``1 - levenshtein(a, b) / max(len)`` over code points; 1.0 when both are empty.

    Classic edit distance (insert, delete, substitute, no transpositions), case-sensitive and
    without any normalisation: ``kitten``/``sitting`` is 4/7, ``error A``/``error B`` 6/7.
    """
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    return _similarity_from_distance(Levenshtein.distance(a, b), longest)


def _distance_budget(threshold: float, longest: int) -> int:
    """The largest distance ``d`` with ``1 - d/longest >= threshold``, or -1 when there is none.

    The predicate is the very expression :func:`normalized_similarity` evaluates, and it only
    turns false as ``d`` grows, so a bisection finds its edge exactly, float rounding included.
    """
    first_failing = bisect.bisect_left(
        range(longest + 1),
        True,
        key=lambda d: _similarity_from_distance(d, longest) < threshold,
    )
    return first_failing - 1


def _exact_similarity_at_least(a: str, b: str, threshold: float) -> float | None:
    if a == b:
        return 1.0
    longest = max(len(a), len(b))
    budget = _distance_budget(threshold, longest)
    if abs(len(a) - len(b)) > budget:  # the length ratio alone is below the threshold
        return None
    distance = Levenshtein.distance(a, b, score_cutoff=budget, score_hint=_DISTANCE_HINT)
    return _similarity_from_distance(distance, longest) if distance <= budget else None


def _nearest_occurrence(text: str, needle: str, around: int) -> int:
    """Where ``needle`` occurs in ``text`` closest to ``around`` (within the search span), or -1."""
    low = max(0, around - _ANCHOR_SEARCH_CHARS)
    high = min(len(text), around + _ANCHOR_SEARCH_CHARS + len(needle))
    after = text.find(needle, max(low, around), high)
    before = text.rfind(needle, low, min(high, around + len(needle)))
    found = [pos for pos in (after, before) if pos >= 0]
    return min(found, key=lambda pos: abs(pos - around)) if found else -1


def _locate(
    previous: str, current: str, window: tuple[int, int], guesses: Iterable[int]
) -> tuple[int, int] | None:
    """A digit-free probe of ``previous[start:end]`` found verbatim in ``current`` near a guess.

    Returns where the probe starts in ``previous`` and in ``current``; None when no probe of
    the window is found.
    """
    start, end = window
    probes = _ANCHOR_PROBE.finditer(previous, start, end)
    for probe in islice(probes, _ANCHOR_PROBES_PER_WINDOW):
        for guess in guesses:
            found = _nearest_occurrence(current, probe.group(), guess + probe.start() - start)
            if found >= 0:
                return probe.start(), found
    return None


@dataclass(frozen=True, slots=True)
class _WindowPair:
    """A window of the previous error and the matching stretch of the current one.

    ``current`` is longer by a slack, to be cut to the length of ``previous`` once both are
    normalised, from its start, or from its end for the tail (``from_end``): the volatile tokens
    of one error may be longer than those of the other.
    """

    previous: str
    current: str
    from_end: bool = False

    def comparable(self, normalize: bool) -> tuple[str, str]:
        """Both sides, normalised when asked, cut to the same length."""
        previous, current = self.previous, self.current
        if normalize:
            previous, current = normalize_volatile(previous), normalize_volatile(current)
        if self.from_end:
            return previous, current[max(0, len(current) - len(previous)) :]
        return previous, current[: len(previous)]


def _line_end(text: str, start: int, end: int) -> int:
    """``end``, moved back to just after the last newline of its second half if there is one.

    Volatile tokens never span lines, so a window cut at a line end cuts none of them.
    """
    newline = text.rfind("\n", (start + end) // 2, end)
    return end if newline < 0 else newline + 1


def _line_start(text: str, start: int, end: int) -> int:
    """``start``, moved on to just after the first newline of its first half if there is one."""
    newline = text.find("\n", start, (start + end) // 2)
    return start if newline < 0 else newline + 1


def _middle_windows(previous: str, current: str, width: int) -> list[_WindowPair]:
    """Evenly spaced windows of ``previous``, each matched in ``current`` by a probe.

    The probe is looked for at the shift the window before was found at, then as if only the
    head were aligned, then only the tail (one insertion or deletion anywhere leaves every
    window aligned one way or the other); the proportional position is the fallback.
    """
    reach = width + _WINDOW_SLACK_CHARS
    tail_shift = len(current) - len(previous)
    shift = 0
    pairs = []
    for index in range(1, SAMPLE_WINDOWS - 1):
        start = index * (len(previous) - width) // (SAMPLE_WINDOWS - 1)
        guesses = dict.fromkeys((start + shift, start, start + tail_shift))
        located = _locate(previous, current, (start, start + width), guesses)
        if located is None:
            matched = start * len(current) // len(previous)
        else:
            start, matched = located
            shift = matched - start
        end = _line_end(previous, start, start + width)
        pairs.append(_WindowPair(previous[start:end], current[matched : matched + reach]))
    return pairs


def _sample(previous: str, current: str, normalize: bool) -> tuple[str, str]:
    """The head, the tail and aligned windows between, of both errors, comparable and joined."""
    width = min(SAMPLE_WINDOW_CHARS, len(previous), len(current))
    reach = width + _WINDOW_SLACK_CHARS
    head_end = _line_end(previous, 0, width)
    tail_start = _line_start(previous, len(previous) - width, len(previous))
    head = _WindowPair(previous[:head_end], current[:reach])
    tail = _WindowPair(previous[tail_start:], current[-reach:], from_end=True)
    pairs = [head, *_middle_windows(previous, current, width), tail]
    sides = [pair.comparable(normalize) for pair in pairs]
    previous_side = _SAMPLE_SEPARATOR.join(side for side, _ in sides)
    current_side = _SAMPLE_SEPARATOR.join(side for _, side in sides)
    return previous_side, current_side


def _estimated_similarity_at_least(
    a: str, b: str, threshold: float, normalize: bool
) -> float | None:
    length_ratio = min(len(a), len(b)) / max(len(a), len(b))
    if length_ratio < threshold:
        return None
    sample_a, sample_b = _sample(a, b, normalize)
    sampled = _exact_similarity_at_least(sample_a, sample_b, threshold)
    return None if sampled is None else min(sampled, length_ratio)


@lru_cache(maxsize=_NORMALIZED_CACHE_SIZE)
def _normalized(text: str) -> str:
    return normalize_volatile(text)


def similarity_at_least(
    previous: str, current: str, threshold: float, *, normalize: bool = True
) -> float | None:
    """The similarity of two errors when it reaches ``threshold``, else None, at bounded cost.

    Up to :data:`EXACT_SIMILARITY_MAX_CHARS` code points each, the answer is exactly that of
    :func:`normalized_similarity` (after :func:`normalize_volatile` when ``normalize``). Beyond,
    it is estimated from a fixed-size sample (see the module docstring); the cost stays in the
    low milliseconds whatever the length. Not symmetric beyond the exact range: the windows are
    taken from ``previous`` and located in ``current``.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"similarity threshold must be within [0, 1], got {threshold!r}")
    if previous == current:
        return 1.0
    if max(len(previous), len(current)) > EXACT_SIMILARITY_MAX_CHARS:
        return _estimated_similarity_at_least(previous, current, threshold, normalize)
    if normalize:
        previous, current = _normalized(previous), _normalized(current)
    return _exact_similarity_at_least(previous, current, threshold)


# --- state --------------------------------------------------------------------------------


class StepProgress(BaseModel):
    """What the tracker remembers of one step: its attempts and its last error."""

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=0, ge=0)
    last_error: str | None = None


class ProgressTrackerState(BaseModel):
    """Everything a tracker knows, as JSON-ready data (the coordinator keeps it in Redis)."""

    model_config = ConfigDict(frozen=True)

    steps: dict[str, StepProgress] = Field(default_factory=dict)


@dataclass(slots=True)
class _Step:
    attempts: int = 0
    last_error: str | None = None


def _stuck_reason(step_id: str, similarity: float, threshold: float) -> str:
    return (
        f"Step '{step_id}' appears stuck: consecutive errors are {similarity * 100:.0f}% similar"
        f" (threshold: {threshold * 100:.0f}%)"
    )


# --- tracker ------------------------------------------------------------------------------


class ProgressTracker:
    """Counts the attempts of each step and stops a step that is over its limit or stuck.

    Only consecutive errors are compared: the last one stored against the new one.
    """

    def __init__(self, config: StepIterationConfig | None = None) -> None:
        self._config = config or StepIterationConfig()
        self._steps: dict[str, _Step] = {}

    @property
    def config(self) -> StepIterationConfig:
        """The limits this tracker enforces."""
        return self._config

    @property
    def limit_action(self) -> LimitAction:
        """What the coordinator should do with a stopped step."""
        return self._config.on_limit_reached

    def begin_step(self, step_id: str) -> None:
        """Start (or restart) tracking ``step_id`` with no attempt and no error."""
        self._steps[step_id] = _Step()

    def record_attempt(self, step_id: str, error: str | None) -> None:
        """Count one attempt of ``step_id`` and remember its error; unknown steps are ignored."""
        step = self._steps.get(step_id)
        if step is None:
            return
        step.attempts += 1
        step.last_error = error

    def should_continue(self, step_id: str) -> StepDecision:
        """Stop once the attempts reach ``max_reattempts_per_step``; unknown steps continue."""
        step = self._steps.get(step_id)
        limit = self._config.max_reattempts_per_step
        if step is not None and step.attempts >= limit:
            return StepDecision.stop_because(f"Step '{step_id}' reached max reattempts ({limit})")
        return StepDecision.continue_()

    def record_and_check(self, step_id: str, error: str) -> StepDecision:
        """Record a failed attempt, then stop if it repeats the last error or hits the limit.

        The stuck check comes first, so its message wins when both apply.
        """
        step = self._steps.get(step_id)
        if step is not None and step.last_error is not None:
            similarity = similarity_at_least(
                step.last_error,
                error,
                self._config.similarity_threshold,
                normalize=self._config.normalize_volatile,
            )
            if similarity is not None:
                step.attempts += 1
                step.last_error = error
                threshold = self._config.similarity_threshold
                return StepDecision.stop_because(_stuck_reason(step_id, similarity, threshold))
        self.record_attempt(step_id, error)
        return self.should_continue(step_id)

    def attempt_count(self, step_id: str) -> int:
        """Attempts recorded for ``step_id`` (0 when unknown)."""
        step = self._steps.get(step_id)
        return 0 if step is None else step.attempts

    def reset_step(self, step_id: str) -> None:
        """Forget ``step_id``."""
        self._steps.pop(step_id, None)

    def to_state(self) -> dict[str, Any]:
        """A JSON-ready snapshot, a dumped :class:`ProgressTrackerState`.

        :meth:`from_state` restores it exactly.
        """
        steps = {
            step_id: StepProgress(attempts=step.attempts, last_error=step.last_error)
            for step_id, step in self._steps.items()
        }
        return ProgressTrackerState(steps=steps).model_dump(mode="json")

    @classmethod
    def from_state(
        cls,
        config: StepIterationConfig | None,
        state: ProgressTrackerState | dict[str, Any],
    ) -> ProgressTracker:
        """A tracker with ``config`` that continues from ``state``.

        ``state`` is what :meth:`to_state` returned, or the model; ``{}`` gives a tracker with
        no step. A malformed state raises pydantic's ``ValidationError``.
        """
        snapshot = ProgressTrackerState.model_validate(state)
        tracker = cls(config)
        for step_id, progress in snapshot.steps.items():
            tracker._steps[step_id] = _Step(progress.attempts, progress.last_error)
        return tracker
