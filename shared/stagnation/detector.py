"""The output-side stagnation detector: counters first, signatures as complementary signals.

For each observed :class:`~shared.stagnation.events.ToolEvent` the detector decides, from digests
of masked outputs and host-supplied content hashes only, whether the event is

- **neutral**: an empty acknowledgement, or a patient tool still waiting. Neither progress nor
  evidence of a loop; the level is held;
- **a new state change**: a read of content not seen before, a command whose (tool, exit code,
  output) was not seen before, a write whose after-state differs from its before-state and was
  not reached before, a failure (other than a write) never met before. The stale run ends and
  the level drops to NONE;
- **stale**: anything else, including every failed write and an identical call already made in
  the same batch.

Stale events extend the current episode. The level follows the highest rung reached by four
signals (see :class:`~shared.stagnation.config.StagnationConfig`), one rung per stale event at
most, is never lowered within an episode, and never above NONE while
``steps_since_milestone <= min_steps``: the composite trigger is
*steps > N and no milestone since the window start and no new state change in the window*.
A verified milestone (:meth:`StagnationDetector.milestone`) resets the step counter and the
episode. :meth:`StagnationDetector.compacted` opens a new epoch, so that re-reading content first
seen before it is classified as amnesia.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.stagnation.config import StagnationConfig
from shared.stagnation.events import ToolEvent, ToolKind
from shared.stagnation.fingerprint import EventFingerprint, fingerprint
from shared.stagnation.memory import BoundedLru, StaleWindow
from shared.stagnation.messages import MessageContext, render_message
from shared.stagnation.state import (
    MAX_DETAIL_CHARS,
    MAX_MILESTONE_NAMES,
    DetectorState,
    EpisodeState,
)
from shared.stagnation.verdict import (
    ReasonCode,
    StagnationKind,
    StagnationLevel,
    StagnationVerdict,
)

__all__ = ["StagnationDetector"]

# When two signals reach the same rung on one event, the more specific one names the kind.
_KIND_PRIORITY = {
    StagnationKind.CYCLE: 3,
    StagnationKind.REPEAT: 2,
    StagnationKind.AMNESIA: 1,
    StagnationKind.NO_GRADIENT: 0,
}


@dataclass(frozen=True, slots=True)
class _Signal:
    """One signal's rung; ``detail`` renders its sentence only if the signal is kept."""

    level: StagnationLevel
    kind: StagnationKind
    reasons: tuple[ReasonCode, ...]
    detail: Callable[[], str]

    def rank(self) -> tuple[int, int]:
        """Higher rung first; on the same rung, the more specific kind."""
        return self.level.rank, _KIND_PRIORITY[self.kind]


@dataclass(slots=True)
class _Episode:
    stale_steps: int = 0
    amnesia_steps: int = 0
    level: StagnationLevel = StagnationLevel.NONE
    kind: StagnationKind | None = None
    reasons: set[ReasonCode] = field(default_factory=set)
    detail: str = ""

    def dump(self) -> EpisodeState:
        return EpisodeState(
            stale_steps=self.stale_steps,
            amnesia_steps=self.amnesia_steps,
            level=self.level,
            kind=self.kind,
            reasons=sorted(self.reasons, key=_reason_order),
            detail=self.detail,
        )

    @classmethod
    def load(cls, state: EpisodeState) -> _Episode:
        return cls(
            stale_steps=state.stale_steps,
            amnesia_steps=state.amnesia_steps,
            level=state.level,
            kind=state.kind,
            reasons=set(state.reasons),
            detail=state.detail,
        )


_LEVELS = list(StagnationLevel)
_REASON_ORDER = {reason: index for index, reason in enumerate(ReasonCode)}


def _reason_order(reason: ReasonCode) -> int:
    return _REASON_ORDER[reason]


def _first_line(text: str, limit: int = 100) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


class StagnationDetector:
    """Watches tool events and answers a :class:`StagnationVerdict` after each one.

    Pure and synchronous: no I/O, O(1) work per event besides masking and hashing its output
    once. :meth:`to_state` / :meth:`from_state` persist and restore it exactly.
    """

    def __init__(self, config: StagnationConfig | None = None) -> None:
        self.config = config if config is not None else StagnationConfig()
        cfg = self.config
        self._total_steps = 0
        self._since_milestone = 0
        self._new_changes = 0
        self._epoch = 0
        self._milestones_total = 0
        self._milestones: deque[str] = deque(maxlen=MAX_MILESTONE_NAMES)
        self._seen: BoundedLru[int] = BoundedLru(cfg.max_seen_hashes)
        self._paths: BoundedLru[str] = BoundedLru(cfg.max_paths)
        self._window = StaleWindow(cfg.history, cfg.max_period)
        self._episode = _Episode()

    # -- public API --------------------------------------------------------------------------

    def observe(self, event: ToolEvent) -> StagnationVerdict:
        """Account for one tool event and say how stagnant the run is now."""
        return self._observe(event, batch=None)

    def observe_batch(self, events: Sequence[ToolEvent]) -> StagnationVerdict:
        """Account for the events of one model response; identical calls in it are repeats.

        Returns the verdict of the highest level met in the batch (``escalated`` if any event
        escalated), or the current verdict for an empty batch.
        """
        batch: dict[str, str] = {}
        worst: StagnationVerdict | None = None
        escalated = False
        for event in events:
            verdict = self._observe(event, batch=batch)
            escalated = escalated or verdict.escalated
            if worst is None or verdict.level >= worst.level:
                worst = verdict
        if worst is None:
            return self.verdict()
        return worst.model_copy(update={"escalated": escalated})

    def milestone(self, name: str) -> None:
        """A verified milestone was reached: the step counter and the episode start again."""
        self._milestones.append(name)
        self._milestones_total += 1
        self._since_milestone = 0
        self._new_changes = 0
        self._window.clear()
        self._episode = _Episode()

    def reset_window(self) -> None:
        """Start a new episode after a genuine user message (a reviewer's hint, say).

        The stale run, the repeat and cycle window and the level go back to zero; the step
        counter keeps counting, since no milestone was verified. Runtime nudges must not call
        this, or a loop would never escalate past them.
        """
        self._window.clear()
        self._episode = _Episode()

    def counters(self) -> dict[str, int | str]:
        """The counters and the current level, for an operator or a review screen."""
        return {
            "level": self.verdict().level.value,
            "steps_since_milestone": self._since_milestone,
            "new_state_changes": self._new_changes,
            "stale_steps": self._episode.stale_steps,
            "total_steps": self._total_steps,
            "milestones": self._milestones_total,
            "compactions": self._epoch,
        }

    def compacted(self) -> None:
        """The model's context was compacted: content seen until now becomes 'before'."""
        self._epoch += 1

    def verdict(self) -> StagnationVerdict:
        """The current verdict, without observing anything."""
        return self._verdict(escalated=False)

    @property
    def milestones(self) -> list[str]:
        """The names of the last milestones reached (at most 32), oldest first."""
        return list(self._milestones)

    # -- one event ---------------------------------------------------------------------------

    def _observe(self, event: ToolEvent, batch: dict[str, str] | None) -> StagnationVerdict:
        fp = fingerprint(event, self.config.acknowledgements)
        self._total_steps += 1
        self._since_milestone += 1
        duplicate = self._batch_duplicate(fp, batch)
        if duplicate is None and fp.is_ack:
            return self._verdict(escalated=False)
        first_epoch = self._seen.remember(fp.outcome, self._epoch)
        if duplicate is None and self._is_new_state(event, fp, first_epoch):
            self._new_changes += 1
            self._window.restart(fp.pair, fp.error)
            self._episode = _Episode()
            return self._verdict(escalated=False)
        if duplicate is None and self._is_waiting(event):
            return self._verdict(escalated=False)
        return self._stale(event, fp, first_epoch, duplicate)

    def _batch_duplicate(self, fp: EventFingerprint, batch: dict[str, str] | None) -> str | None:
        """The pair of the same call made earlier in this batch, or None."""
        if batch is None:
            return None
        earlier = batch.get(fp.call)
        if earlier is None:
            batch[fp.call] = fp.pair
        return earlier

    def _is_new_state(
        self, event: ToolEvent, fp: EventFingerprint, first_epoch: int | None
    ) -> bool:
        if event.kind is ToolKind.WRITE:
            # A failed write has no after-state: it changed nothing, whatever its error says.
            return fp.after is not None and self._write_changed(fp) and first_epoch is None
        if fp.state is not None and fp.path is not None:
            self._paths.set(fp.path, fp.state)
        return first_epoch is None

    def _write_changed(self, fp: EventFingerprint) -> bool:
        """False when the write left its target as it was (after-state equals before-state)."""
        before = fp.before
        if before is None and fp.path is not None:
            before = self._paths.get(fp.path)
        if fp.path is not None and fp.after is not None:
            self._paths.set(fp.path, fp.after)
        return before is None or before != fp.after

    def _is_waiting(self, event: ToolEvent) -> bool:
        return event.tool_name in self.config.patient_tools and not event.failed

    def _stale(
        self, event: ToolEvent, fp: EventFingerprint, first_epoch: int | None, duplicate: str | None
    ) -> StagnationVerdict:
        pair = duplicate if duplicate is not None else fp.pair
        self._window.push(pair, fp.error)
        episode = self._episode
        episode.stale_steps += 1
        if first_epoch is not None and first_epoch < self._epoch:
            episode.amnesia_steps += 1
        signals = self._signals(event, fp, pair)
        strongest = max(signals, key=_Signal.rank)
        firing = [sig for sig in signals if sig.level is not StagnationLevel.NONE]
        reasons = {reason for sig in firing for reason in sig.reasons}
        if duplicate is not None:
            reasons.add(ReasonCode.BATCH_DUPLICATE)
        return self._escalate(strongest, reasons)

    # -- signals -----------------------------------------------------------------------------

    def _signals(self, event: ToolEvent, fp: EventFingerprint, pair: str) -> list[_Signal]:
        """The stale-window signal and whichever input-side signals reach a rung."""
        candidates = (
            self._cycle_signal(),
            self._repeat_signal(event, pair),
            self._error_signal(event, fp),
        )
        return [self._stale_signal(), *(sig for sig in candidates if sig is not None)]

    def _stale_signal(self) -> _Signal:
        ep, cfg = self._episode, self.config
        level = cfg.stale.rung(ep.stale_steps)
        stale, amnesia = ep.stale_steps, ep.amnesia_steps
        if amnesia and amnesia * 2 >= stale:
            reasons = (ReasonCode.STALE_WINDOW, ReasonCode.AMNESIA_REREAD)
            return _Signal(
                level,
                StagnationKind.AMNESIA,
                reasons,
                lambda: (
                    f"{amnesia} of the last {stale} steps re-read content first seen before "
                    "your context was compacted"
                ),
            )
        return _Signal(
            level,
            StagnationKind.NO_GRADIENT,
            (ReasonCode.STALE_WINDOW,),
            lambda: f"the last {stale} steps returned nothing you had not already seen",
        )

    def _repeat_signal(self, event: ToolEvent, pair: str) -> _Signal | None:
        count = self._window.count(pair)
        level = self.config.repeat.rung(count)
        if level is StagnationLevel.NONE:
            return None
        return _Signal(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.REPEATED_RESULT,),
            lambda: f"{event.describe()} returned the same result {count} times",
        )

    def _error_signal(self, event: ToolEvent, fp: EventFingerprint) -> _Signal | None:
        count = self._window.error_count(fp.error)
        level = self.config.error.rung(count)
        if level is StagnationLevel.NONE:
            return None
        return _Signal(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.SAME_ERROR,),
            lambda: (
                f"{event.tool_name} failed {count} times with the same error "
                f"({_first_line(event.output)!r}) whatever the arguments"
            ),
        )

    def _cycle_signal(self) -> _Signal | None:
        found = self._window.cycle()
        if found is None:
            return None
        period, repetitions = found
        level = self.config.cycle.rung(repetitions)
        if level is StagnationLevel.NONE:
            return None
        return _Signal(
            level,
            StagnationKind.CYCLE,
            (ReasonCode.CYCLE,),
            lambda: f"the same {period} calls with the same results came round {repetitions} times",
        )

    def _escalate(self, signal: _Signal, reasons: set[ReasonCode]) -> StagnationVerdict:
        """Raise the episode's level toward the signal's, behind the step gate.

        The level never goes down within an episode and climbs at most one rung per stale
        event, so the model always gets a NUDGE and a REPLAN before a human is asked, even
        when the gate opens on a loop that is already long. The kind and the detail line stay
        those of the signal that last raised the level, so an episode does not flip between
        kinds while it holds a rung.
        """
        ep = self._episode
        if not self.config.enabled or self._since_milestone <= self.config.min_steps:
            return self._verdict(escalated=False)
        if signal.level is StagnationLevel.NONE:
            return self._verdict(escalated=False)
        escalated = signal.level > ep.level
        if escalated:  # the kind and detail are those of the signal that raised the level
            ep.level, ep.kind = _LEVELS[ep.level.rank + 1], signal.kind
            ep.detail = signal.detail()[:MAX_DETAIL_CHARS]
        ep.reasons.update(reasons)
        return self._verdict(escalated=escalated)

    # -- verdicts ----------------------------------------------------------------------------

    def _verdict(self, escalated: bool) -> StagnationVerdict:
        ep = self._episode
        level = ep.level if self.config.enabled else StagnationLevel.NONE
        reasons = tuple(sorted(ep.reasons, key=_reason_order)) if level.rank else ()
        kind = ep.kind if level.rank else None
        message = render_message(
            MessageContext(
                level=level,
                kind=kind,
                steps_since_milestone=self._since_milestone,
                new_state_changes=self._new_changes,
                stale_steps=ep.stale_steps,
                detail=ep.detail,
                reasons=reasons,
                milestones=list(self._milestones),
            )
        )
        # Every value is produced here, already valid: skip validation on this hot path.
        return StagnationVerdict.model_construct(
            level=level,
            kind=kind,
            steps_since_milestone=self._since_milestone,
            new_state_changes=self._new_changes,
            stale_steps=ep.stale_steps,
            reason_codes=reasons,
            message=message,
            escalated=escalated,
        )

    # -- persistence -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot; :meth:`from_state` restores it exactly."""
        window, recent, runs = self._window.dump()
        state = DetectorState(
            config=self.config,
            total_steps=self._total_steps,
            steps_since_milestone=self._since_milestone,
            new_state_changes=self._new_changes,
            epoch=self._epoch,
            milestones_total=self._milestones_total,
            milestones=list(self._milestones),
            seen=self._seen.items(),
            paths=self._paths.items(),
            window=window,
            recent_pairs=recent,
            cycle_runs=runs,
            episode=self._episode.dump(),
        )
        return state.model_dump(mode="json")

    @classmethod
    def from_state(
        cls, config: StagnationConfig | None, state: Mapping[str, Any] | None
    ) -> StagnationDetector:
        """A detector that continues from ``state`` (what :meth:`to_state` returned).

        ``config`` wins over the configuration saved in the state (a task may retune its
        thresholds); None keeps the saved one. An empty or None ``state`` gives a fresh
        detector. Raises pydantic's ValidationError when the state is malformed.
        """
        if not state:
            return cls(config)
        saved = DetectorState.model_validate(state)
        cfg = config if config is not None else saved.config
        detector = cls(cfg)
        detector._total_steps = saved.total_steps
        detector._since_milestone = saved.steps_since_milestone
        detector._new_changes = saved.new_state_changes
        detector._epoch = saved.epoch
        detector._milestones_total = saved.milestones_total
        detector._milestones.extend(saved.milestones)
        detector._seen = BoundedLru(cfg.max_seen_hashes, saved.seen)
        detector._paths = BoundedLru(cfg.max_paths, saved.paths)
        detector._window.load(saved.window, saved.recent_pairs, saved.cycle_runs)
        detector._episode = _Episode.load(saved.episode)
        return detector
