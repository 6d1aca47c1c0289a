"""The output-side stagnation detector: counters first, signatures as complementary signals.

For each observed :class:`~shared.stagnation.events.ToolEvent` the detector decides, from digests
of masked outputs and host-supplied content hashes only, whether the event is

- **neutral**: an empty acknowledgement of an *other* tool, a patient tool still waiting, a read
  of the content the agent itself just wrote, or a write *pending* its outcome. Neither progress
  nor evidence of a loop; the level is held;
- **new**: a read, a command or a failure whose (masked) result was never seen. It ends the
  stale run, and confirms the writes pending since the last result: the level drops to NONE;
- **stale**: anything else: a result already seen, a read or search that showed nothing, a
  failed write, a write that left its target as it was, put back a state already seen or
  re-applied an edit already made, and an identical call already made in the same batch. When
  a stale result follows pending writes, they changed bytes but not the outcome: they join the
  stale run.

For each :class:`~shared.stagnation.plans.ModelTurn` (an assistant message) it decides whether
the model re-issued a plan with nothing new since, or said it is stuck: a *stale turn*, counted
on a leaky count of its own that new tool results do not drain (:meth:`observe_turn`).

Stale events and stale turns extend the current episode. The level follows the highest rung
reached by the signals (see :class:`~shared.stagnation.config.StagnationConfig`), one rung per
iteration (a turn with the results of its calls, one ``observe`` or one ``observe_batch``) at
most, is never lowered within an episode, and, while no more than ``min_steps`` tool events
and turns have passed since the last milestone, never above NONE on the tool side's evidence
nor above NUDGE on the model's stale turns (re-issued plans, self-reports; and those only
after at least one tool result since the last milestone or the task's start): the composite
trigger is *steps > N and no milestone since the window start and no new result in the window*
(or stale turns on the model's side).
A verified milestone (:meth:`StagnationDetector.milestone`) resets the step counter and the
episode. A stale result first seen before the episode began, or before the last
:meth:`StagnationDetector.compacted`, is an *amnesia* step: the agent re-learns what it knew.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from shared.stagnation.config import StagnationConfig
from shared.stagnation.events import ToolEvent, ToolKind
from shared.stagnation.fingerprint import EventFingerprint, digest, fingerprint
from shared.stagnation.memory import BoundedLru, StaleWindow
from shared.stagnation.messages import MessageContext, render_message
from shared.stagnation.plans import ModelTurn, PlanMemory, Reissue, plan_of
from shared.stagnation.shell import as_shell_event, is_restore
from shared.stagnation.signal import (
    KIND_PRIORITY,
    EventNotes,
    Evidence,
    Signal,
    SignalInput,
    SignalMemory,
    recurrence_key,
    world_error,
)
from shared.stagnation.signals import default_signals
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


@dataclass(slots=True)
class _Episode:
    stale_steps: int = 0
    amnesia_steps: int = 0
    level: StagnationLevel = StagnationLevel.NONE
    kind: StagnationKind | None = None
    reasons: set[ReasonCode] = field(default_factory=set)
    detail: str = ""
    started_at: int = 0  # total steps when the episode began (the last new result)

    def dump(self) -> EpisodeState:
        return EpisodeState(
            stale_steps=self.stale_steps,
            amnesia_steps=self.amnesia_steps,
            level=self.level,
            kind=self.kind,
            reasons=sorted(self.reasons, key=_reason_order),
            detail=self.detail,
            started_at=self.started_at,
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
            started_at=state.started_at,
        )


_LEVELS = list(StagnationLevel)
_STALE_TURN_REASONS = frozenset({ReasonCode.REISSUED_PLAN, ReasonCode.SELF_REPORTED_STALL})
"""The evidence of the model's own stale turns, which may NUDGE behind the step gate."""
_REASON_ORDER = {reason: index for index, reason in enumerate(ReasonCode)}


def _reason_order(reason: ReasonCode) -> int:
    return _REASON_ORDER[reason]


_MEMORY_KINDS: dict[type, bool] = {}
"""Signal class -> whether it is a :class:`SignalMemory`, as ``isinstance`` said of its first
instance seen (a check against a runtime protocol walks the protocol's members each time:
about 10 µs per signal, for each detector a coordinator restores)."""

_NOTING_KINDS: dict[type, bool] = {}
"""Signal class -> whether it is an :class:`EventNotes`, as for :data:`_MEMORY_KINDS`."""


def _keeps_memory(signal: Signal) -> TypeGuard[SignalMemory]:
    """Whether ``signal`` keeps a memory of its own (:class:`SignalMemory`); asked once per
    signal class."""
    kind = type(signal)
    keeps = _MEMORY_KINDS.get(kind)
    if keeps is None:
        keeps = _MEMORY_KINDS[kind] = isinstance(signal, SignalMemory)
    return keeps


def _notes_events(signal: Signal) -> TypeGuard[EventNotes]:
    """Whether ``signal`` is told of every tool event (:class:`EventNotes`); asked once per
    signal class (each detector built asked it of its seven signals: about 0.1 ms per task a
    coordinator starts or loads again)."""
    kind = type(signal)
    notes = _NOTING_KINDS.get(kind)
    if notes is None:
        notes = _NOTING_KINDS[kind] = isinstance(signal, EventNotes)
    return notes


class StagnationDetector:
    """Watches tool events and answers a :class:`StagnationVerdict` after each one.

    Pure and synchronous: no I/O, O(1) work per event besides masking and hashing its output
    once. :meth:`to_state` / :meth:`from_state` persist and restore it exactly.
    """

    def __init__(
        self, config: StagnationConfig | None = None, signals: Sequence[Signal] | None = None
    ) -> None:
        self.config = config if config is not None else StagnationConfig()
        self.signals: tuple[Signal, ...] = (
            tuple(signals) if signals is not None else default_signals()
        )
        cfg = self.config
        self._total_steps = 0
        self._since_milestone = 0
        self._new_changes = 0
        self._epoch = 0
        self._milestones_total = 0
        self._milestones: deque[str] = deque(maxlen=MAX_MILESTONE_NAMES)
        # digest -> (compaction epoch, total steps) when first seen
        self._seen: BoundedLru[tuple[int, int]] = BoundedLru(cfg.max_seen_hashes)
        # path -> last known state, "w:" when a write of ours produced it, "r:" when read
        self._paths: BoundedLru[str] = BoundedLru(cfg.max_paths)
        self._window = StaleWindow(cfg.history, cfg.max_period)
        self._episode = _Episode()
        self._pending_writes = 0
        # the model's side: recent plans, the leaky count of stale turns and what named it
        self._plans = PlanMemory(cfg.plan_memory)
        self._plan_stale = 0
        self._plan_kind: StagnationKind | None = None
        self._turn_mark: int | None = None  # the plan memory's mark at the last turn
        self._turns_since_milestone = 0
        self._turn_open = False  # a turn opened this iteration; its calls' results belong to it
        self._climbed = False  # the level rose in the current iteration
        self._report_open = False  # a self-report awaits the first result that answers it
        # the comparison on a restored workspace (_compares): the after-state of the last
        # successful write, whether it put back a state (a revert) and no result came since,
        # and the last result's call, pair and the last write's after-state when it came
        self._last_write: str | None = None
        self._restored = False
        self._last_result: tuple[str, str, str | None] | None = None
        self._config_dump: tuple[StagnationConfig, dict[str, Any]] | None = None
        self._memories: tuple[SignalMemory, ...] | None = None
        self._notes: tuple[EventNotes, ...] | None = None
        self._remembering: tuple[Signal, ...] | None = None

    # -- public API --------------------------------------------------------------------------

    def observe(self, event: ToolEvent) -> StagnationVerdict:
        """Account for one tool event, an iteration of its own (or of the turn observed just
        before it), and say how stagnant the run is."""
        carried = self._start_iteration()
        verdict = self._observe(event, batch=None)
        return verdict.model_copy(update={"escalated": True}) if carried else verdict

    def observe_turn(self, turn: ModelTurn) -> StagnationVerdict:
        """Account for one assistant message; it opens an iteration, which the results of the
        calls it proposed (the next :meth:`observe` or :meth:`observe_batch`) continue.

        A turn is **stale** when it re-issues one of the last ``plan_memory`` plans,
        near-identical (masked, the same calls, the text at least ``plan_similarity`` alike),
        with nothing new come back since (no new result that is not a near-duplicate, no
        write), or when the model says it is stuck (:attr:`ModelTurn.stuck`); it adds one to
        the leaky count of stale turns, which feeds the ``plan`` ladder. Any other turn of at
        least ``plan_min_chars`` takes one off. New tool results do not: an orchestrator that
        sends the same instruction again while every page it gets back differs by OCR noise is
        not learning from those pages. Nor does a turn that follows no news: a reply with nothing
        new come back since the previous turn (an agent answering the user's side questions
        between requests for the same missing id) neither adds nor takes off; nor does an
        *echo*, the same request as a plan made before the last news (content words at least
        ``plan_echo`` alike, or near-identical): the news did not change what is asked. A turn
        that follows a self-report with no result between, proposes no call and says nothing
        of its progress, first counts that report once more (``plan_unanswered``,
        :meth:`_report_stands`); one that proposes calls leaves the report open for their first
        result, and :meth:`report_answered` closes it.
        """
        return self._verdict(escalated=self._turn(turn))

    def note_turn(self, turn: ModelTurn) -> None:
        """Account for one assistant message as :meth:`observe_turn` does, without building its
        verdict: for a host that applies the verdict of the results that follow instead (the
        turn proposed calls; that verdict says ``escalated`` when this turn raised the level)."""
        self._turn(turn)

    def _turn(self, turn: ModelTurn) -> bool:
        """The turn accounted for; True when it raised the level."""
        self._climbed = False
        self._turn_open = True
        self._turns_since_milestone += 1
        cfg = self.config
        # a turn of calls alone, or a word ("TERMINATE"), is too short to say anything as a
        # plan: the output side judges its calls, and it neither adds nor takes off
        plan = plan_of(turn, cfg.plan_min_chars)
        # a self-report that no result answered, and the model speaks again, a plan that says
        # nothing of its progress: nothing came back to contradict the report (_report_stands).
        # A turn that proposes calls does not count it: the report stays open through that
        # turn, and the first of its results decides (_observe)
        pending = self._report_open and cfg.plan_unanswered and turn.stuck is None
        awaits_result = pending and bool(turn.calls)
        unanswered = pending and not awaits_result and plan is not None
        raised = self._report_stands() if unanswered else False
        comparable = plan is not None
        reissue = (
            self._plans.reissue(
                plan, cfg.plan_similarity, cfg.plan_paraphrase, cfg.plan_echo, cfg.plan_target
            )
            if plan is not None
            else Reissue.NEW
        )
        reissued = reissue is Reissue.STALE
        news = self._plans.mark != self._turn_mark
        self._turn_mark = self._plans.mark
        stale = reissued or turn.stuck is True
        self._report_open = turn.stuck is True or awaits_result
        if stale:
            self._plan_stale += 1
            self._plan_kind = StagnationKind.REPEAT if reissued else StagnationKind.NO_GRADIENT
        elif comparable and news and reissue is not Reissue.ECHO:
            self._plan_stale = max(0, self._plan_stale - 1)
        # every turn reaches the signals (a re-asked slot is no stale turn of the plan rules)
        evidence = self._evidence(self._signal_input(turn=turn, stale_turn=stale))
        if not evidence:
            return raised
        strongest = max(evidence, key=Evidence.rank)
        reasons = {reason for e in evidence for reason in e.reasons}
        return self._climb(strongest, reasons, model_side=True) or raised

    def observe_batch(self, events: Sequence[ToolEvent]) -> StagnationVerdict:
        """Account for the events of one model response (one iteration).

        Identical calls in it are repeats, and the level rises at most one rung for the whole
        batch: three parallel copies of a looping call still get a NUDGE, then a REPLAN, before
        a human is asked. Returns the verdict of the highest level met in the batch
        (``escalated`` if any event escalated), or the current verdict for an empty batch.
        """
        carried = self._start_iteration()
        batch: dict[str, str] = {}
        worst: StagnationVerdict | None = None
        escalated = carried
        for event in events:
            verdict = self._observe(event, batch=batch)
            escalated = escalated or verdict.escalated
            if worst is None or verdict.level >= worst.level:
                worst = verdict
        if worst is None:
            return self._verdict(escalated=escalated)
        if worst.escalated == escalated:  # a verdict of this call's own: no copy needed
            return worst
        return worst.model_copy(update={"escalated": escalated})

    def _start_iteration(self) -> bool:
        """Tool results open an iteration of their own unless a turn opened it; True when that
        turn raised the level (the results' verdict then says ``escalated``, so a host that
        holds the text of a turn with calls until their results are in injects it once)."""
        carried = self._turn_open and self._climbed
        if not self._turn_open:
            self._climbed = False
        self._turn_open = False
        return carried

    def milestone(self, name: str) -> None:
        """A verified milestone was reached: the step counter and the episode start again."""
        self._milestones.append(name)
        self._milestones_total += 1
        self._since_milestone = 0
        self._turns_since_milestone = 0
        self._new_changes = 0
        self._pending_writes = 0
        self._window.clear()
        self._forget_plans()
        self._episode = _Episode(started_at=self._total_steps)

    def _forget_plans(self) -> None:
        self._plans.clear()
        self._plan_stale = 0
        self._report_open = False
        self._plan_kind = None
        for memory in self._signal_memories():
            memory.clear()

    def _signal_memories(self) -> tuple[SignalMemory, ...]:
        """The signals that keep a memory of their own (saved with the state), found once: the
        coordinator snapshots the detector at every observation."""
        if self._memories is None:
            self._memories = tuple(s for s in self.signals if _keeps_memory(s))
        return self._memories

    def _remembering_signals(self) -> tuple[Signal, ...]:
        """The signals that keep a memory (:meth:`_signal_memories`), as signals, in order."""
        if self._remembering is None:
            memories = {id(memory) for memory in self._signal_memories()}
            self._remembering = tuple(s for s in self.signals if id(s) in memories)
        return self._remembering

    def _noting_signals(self) -> tuple[EventNotes, ...]:
        """The signals told of every tool event (:class:`EventNotes`), found once per detector
        (and each signal class judged once per process: :func:`_notes_events`)."""
        if self._notes is None:
            self._notes = tuple(s for s in self.signals if _notes_events(s))
        return self._notes

    def report_answered(self) -> None:
        """The host answered the model's last self-report itself: it injected a message of
        its own (the ladder's NUDGE or REPLAN) or started a step, so the model's next turn
        answers that message, and the report no longer stands (``plan_unanswered`` does not
        count it at that turn, nor does its first result corroborate it). The counts and the
        level stay: unlike :meth:`reset_window`, a runtime message may call this.
        """
        self._report_open = False

    def reset_window(self) -> None:
        """Start a new episode after a genuine user message (a reviewer's hint, say).

        The stale run, the repeat and cycle window and the level go back to zero; the step
        counter keeps counting, since no milestone was verified. Runtime nudges must not call
        this, or a loop would never escalate past them.
        """
        self._window.clear()
        self._pending_writes = 0
        self._forget_plans()
        self._episode = _Episode(started_at=self._total_steps)

    def counters(self) -> dict[str, int | str]:
        """The counters and the current level, for an operator or a review screen."""
        return {
            "level": self.verdict().level.value,
            "steps_since_milestone": self._since_milestone,
            "new_state_changes": self._new_changes,
            "stale_steps": self._episode.stale_steps,
            "pending_writes": self._pending_writes,
            "stale_turns": self._plan_stale,
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
        """One tool event judged; then, if it is the first result after a self-report, whether
        it corroborates the report (:meth:`_corroborate`)."""
        report, self._report_open = self._report_open, False
        mark, changes = self._plans.mark, self._new_changes
        verdict = self._judge(event, batch)
        if report and self._new_changes > changes and self._plans.mark == mark:
            return self._corroborate(verdict)
        return verdict

    def _corroborate(self, verdict: StagnationVerdict) -> StagnationVerdict:
        """The first result after the model said it is stuck is new to the output side (another
        hash: a page re-rendered, the same link clicked again) but tells the model nothing new
        (the plan memory's mark did not move): the tool side agrees with the report, so it adds
        one to the count of stale turns, as a stale turn does, and the signals are asked again.
        """
        climbed = self._report_stands()
        return self._verdict(escalated=climbed or verdict.escalated)

    def _report_stands(self) -> bool:
        """A self-report is corroborated: one more stale turn, and the signals asked again on
        it; True when the level rose.

        By its first result, when that result is new to the output side but tells the model
        nothing new (:meth:`_corroborate`), or by no result at all: the model speaks again
        (another agent answers in its place, a new ledger follows a replan) before anything
        came back, in a plan with no call that says nothing of its progress
        (``plan_unanswered``; a report, which counts by itself, a word too short to compare,
        or a turn after the host answered the report, :meth:`report_answered`, does not; a turn
        that proposes calls leaves it to their first result). A reply from a model
        shows nothing of the world (turns never move the plan memory's mark), so nothing
        contradicted the report. Hard Who&When ``37``: the ledger reports a loop and hands
        the search to the Assistant, which can only say it will search ("Please hold on a
        moment"); the ledger reports again.
        """
        self._report_open = False
        self._plan_stale += 1
        evidence = self._evidence(self._signal_input(stale_turn=True))
        if not evidence:
            return False
        strongest = max(evidence, key=Evidence.rank)
        reasons = {reason for e in evidence for reason in e.reasons}
        return self._climb(strongest, reasons, model_side=True)

    def _judge(self, event: ToolEvent, batch: dict[str, str] | None) -> StagnationVerdict:
        event = as_shell_event(event)
        fp = fingerprint(event, self.config.acknowledgements)
        self._total_steps += 1
        self._since_milestone += 1
        duplicate = self._batch_duplicate(fp, batch)
        if duplicate is None and fp.is_ack:
            return self._verdict(escalated=False)
        if self._compares(event, fp, duplicate):
            # the answer the changed workspace gave, given again once it is put back: what
            # was asked (does this failure predate the edits?) is answered, which is news;
            # what came back before it no longer counts as a retry
            self._window.forget_recurrences()
            self._seen.remember(fp.outcome, (self._epoch, self._total_steps))
            return self._new_result(fp)
        first_seen = self._seen.remember(fp.outcome, (self._epoch, self._total_steps))
        self._window.note(recurrence_key(event, fp), world_error(event, fp))
        held = False
        for noting in self._noting_signals():
            held = noting.note(event, fp, self.config) or held
        if event.kind is ToolKind.WRITE:
            return self._write(event, fp, first_seen, duplicate, held=held)
        if duplicate is not None:
            return self._stale(event, fp, first_seen, duplicate)
        return self._result(event, fp, first_seen)

    def _compares(self, event: ToolEvent, fp: EventFingerprint, duplicate: str | None) -> bool:
        """True for a **comparison on a restored workspace**: the same call as the last result,
        with the same answer, run again right after writes whose last one put back a state (a
        revert: a state already seen, or a ``git checkout|restore|stash|reset`` line), and the
        workspace is not where it stood at that last result.

        The agent asks whether what it sees predates its edits (Gemini ``astropy-13236`` runs a
        test file with its fix, reverts, runs it again, gets the same failure: the failure is
        not its doing). A stuck run's cycle (paste, run, clean, paste, run) re-runs on the
        state it ran on before, and negative-result debugging runs after new edits, not after
        a revert: neither is such a comparison, and nor is the same comparison made again
        (the same call and answer on the same two states: a fix applied and reverted in
        turn). Remembers what the next call needs.
        """
        if event.kind is ToolKind.WRITE:
            if not event.failed and fp.after is not None:
                command = event.arguments.get("command")
                self._restored = (isinstance(command, str) and is_restore(command)) or (
                    self._seen.get(fp.after) is not None
                )
                self._last_write = fp.after
            return False
        if duplicate is not None:
            return False
        last, restored = self._last_result, self._restored
        self._last_result = (fp.call, fp.pair, self._last_write)
        self._restored = False
        if not restored or last is None or last[:2] != (fp.call, fp.pair):
            return False
        states = sorted((last[2] or "", self._last_write or ""))
        if states[0] == states[1]:
            return False
        # the same comparison made again (fix, run, revert, run, fix, run...) answers nothing
        return not self._remembered(digest("compared", fp.pair, *states))

    def _result(
        self, event: ToolEvent, fp: EventFingerprint, first_seen: tuple[int, int] | None
    ) -> StagnationVerdict:
        """A read, a command or an other tool's answer: neutral, new or stale."""
        if self._is_read_back(fp):
            return self._verdict(escalated=False)
        answers_writes = self._answers_writes(fp)
        if (first_seen is None and not fp.info_free) or answers_writes:
            return self._new_result(fp)
        if self._is_waiting(event):
            return self._verdict(escalated=False)
        return self._stale(event, fp, first_seen, None)

    def _batch_duplicate(self, fp: EventFingerprint, batch: dict[str, str] | None) -> str | None:
        """The pair of the same call made earlier in this batch, or None."""
        if batch is None:
            return None
        earlier = batch.get(fp.call)
        if earlier is None:
            batch[fp.call] = fp.pair
        return earlier

    def _answers_writes(self, fp: EventFingerprint) -> bool:
        """With writes pending: True when this call never returned this result before.

        Such a result is their outcome: what they could affect came out differently (the search
        that found one match now finds none, a new check script's first answer), even when the
        text itself was seen elsewhere. The same result from the same call (the test after each
        edit, failing the same way, or toggling back to a failure it already gave) says the
        writes changed nothing. Every call's pairs are remembered, pending writes or not.
        """
        return not self._remembered(fp.pair) and self._pending_writes > 0

    def _new_result(self, fp: EventFingerprint) -> StagnationVerdict:
        """Something never seen came back: pending writes count as changes, the stale run drains.

        The stale run is a leaky count (Magentic-One's stall counter leaks the same way): a new
        result takes ``recovery`` steps, or ``recovery_share`` of the run if that is more, off
        it. A stall broken by one new fact among many re-reads keeps its pressure; steady work
        drains it. The episode, its window and its level end when the run is empty.
        """
        self._new_changes += 1 + self._pending_writes
        self._pending_writes = 0
        cfg = self.config
        self._plans.result(fp.gist, cfg.plan_similarity, fp.head, cfg.plan_novelty)
        episode = self._episode
        recovery = max(cfg.recovery, int(episode.stale_steps * cfg.recovery_share))
        if cfg.recovery and episode.stale_steps > recovery:
            episode.stale_steps -= recovery
            episode.amnesia_steps = min(episode.amnesia_steps, episode.stale_steps)
            return self._verdict(escalated=False)
        if self._plan_stale:  # the model's side still stalls: the episode goes on
            episode.stale_steps = episode.amnesia_steps = 0
            return self._verdict(escalated=False)
        self._window.restart(fp.pair, fp.error)
        self._episode = _Episode(started_at=self._total_steps)
        return self._verdict(escalated=False)

    def _write(
        self,
        event: ToolEvent,
        fp: EventFingerprint,
        first_seen: tuple[int, int] | None,
        duplicate: str | None,
        *,
        held: bool = False,
    ) -> StagnationVerdict:
        """A write is pending until a result shows what it changed, or stale right away.

        Stale right away: a failed write whose refusal was met before (it changed nothing; its
        error is compared by its first and last lines, since a linter's message quotes the
        rejected code in between), one that left its target as it was, one that put back a
        state already seen, and the same edit of the same path made again (each application
        may change the bytes, as an insertion duplicated, but not what the agent knows). A
        refusal never met before is a new result: the world said something new, unless a
        signal ``held`` it (:class:`~shared.stagnation.signal.EventNotes`): the same target was
        refused before since its last success, so another reason for the same refusal (the
        certificate, after the gift card) is no progress; it is neutral.
        """
        if event.failed:
            refusal = digest("refused", event.tool_name, fp.error or fp.outcome)
            known = self._seen.remember(refusal, (self._epoch, self._total_steps))
            if duplicate is None and known is None:
                return self._verdict(escalated=False) if held else self._new_result(fp)
            return self._stale(event, fp, first_seen, duplicate)
        reapplied = fp.write_call is not None and self._remembered(fp.write_call)
        reverted = fp.after is not None and self._remembered(fp.after)
        changed = fp.after is not None and self._write_changed(fp)
        if duplicate is None and changed and not reverted and not reapplied:
            self._pending_writes += 1
            self._plans.changed()
            return self._verdict(escalated=False)
        return self._stale(event, fp, first_seen, duplicate)

    def _remembered(self, key: str) -> bool:
        """True when ``key`` was seen before; it is remembered from now on either way."""
        return self._seen.remember(key, (self._epoch, self._total_steps)) is not None

    def _write_changed(self, fp: EventFingerprint) -> bool:
        """False when the write left its target as it was (after-state equals before-state)."""
        before = fp.before
        if before is None and fp.path is not None:
            known = self._paths.get(fp.path)
            before = known[2:] if known is not None else None
        if fp.path is not None and fp.after is not None:
            self._paths.set(fp.path, "w:" + fp.after)
        return before is None or before != fp.after

    def _is_read_back(self, fp: EventFingerprint) -> bool:
        """A read of the state one of our writes left: what it shows, the agent wrote.

        Otherwise a read with a whole-content state records it as the path's last known state.
        """
        if fp.state is None:
            return False
        self._remembered(fp.state)  # a later write putting this content back is a revert
        if fp.path is None:
            return False
        known = self._paths.get(fp.path)
        if known == "w:" + fp.state:
            return True
        self._paths.set(fp.path, "r:" + fp.state)
        return False

    def _is_waiting(self, event: ToolEvent) -> bool:
        return event.tool_name in self.config.patient_tools and not event.failed

    def _stale(
        self,
        event: ToolEvent,
        fp: EventFingerprint,
        first_seen: tuple[int, int] | None,
        duplicate: str | None,
    ) -> StagnationVerdict:
        pair = duplicate if duplicate is not None else fp.pair
        self._window.push(pair, fp.error)
        episode = self._episode
        tested = 0  # the new, distinct writes whose outcome this result shows unchanged
        if event.kind is not ToolKind.WRITE:
            tested = self._pending_writes
            # The writes pending since the last result changed bytes, not the outcome: they are
            # no progress (nor a loop of their own; the stale result counts).
            self._pending_writes = 0
        episode.stale_steps += 1
        if self._is_amnesia(event, fp, first_seen):
            episode.amnesia_steps += 1
        signals = self._evidence(self._signal_input(event, fp, pair, tested_writes=tested))
        if not signals:
            return self._verdict(escalated=False)
        strongest = self._naming_signal(signals)
        firing = [sig for sig in signals if sig.level is not StagnationLevel.NONE]
        reasons = {reason for sig in firing for reason in sig.reasons}
        if duplicate is not None:
            reasons.add(ReasonCode.BATCH_DUPLICATE)
        return self._escalate(strongest, reasons)

    def _naming_signal(self, signals: list[Evidence]) -> Evidence:
        """The signal that drives the level: the highest rung, but when the level is to rise by
        one rung, the most specific of the signals that reach that rung names it (a cycle says
        more than "nothing new")."""
        strongest = max(signals, key=Evidence.rank)
        target = _LEVELS[min(self._episode.level.rank + 1, len(_LEVELS) - 1)]
        reaching = [sig for sig in signals if sig.level >= target]
        if not reaching:
            return strongest
        specific = max(reaching, key=lambda sig: KIND_PRIORITY[sig.kind])
        return Evidence(strongest.level, specific.kind, specific.reasons, specific.detail)

    def _is_amnesia(
        self, event: ToolEvent, fp: EventFingerprint, first_seen: tuple[int, int] | None
    ) -> bool:
        """Content (not an error, not nothing) first seen long ago, or before a compaction.

        Long ago: at least twice ``max_period`` steps back, beyond what a repeat or a cycle
        explains; the agent is re-learning what it knew before this stall began.
        """
        if first_seen is None or event.failed or fp.info_free:
            return False
        epoch, step = first_seen
        long_ago = self._total_steps - step >= 2 * self.config.max_period
        return epoch < self._epoch or (long_ago and step <= self._episode.started_at)

    # -- signals ---------------------------------------------------------------------------

    def _signal_input(
        self,
        event: ToolEvent | None = None,
        fp: EventFingerprint | None = None,
        pair: str | None = None,
        *,
        turn: ModelTurn | None = None,
        stale_turn: bool = False,
        tested_writes: int = 0,
    ) -> SignalInput:
        """What the signals see of this step (a stale tool event, or a turn)."""
        return SignalInput(
            config=self.config,
            window=self._window,
            stale_steps=self._episode.stale_steps,
            amnesia_steps=self._episode.amnesia_steps,
            plan_stale=self._plan_stale,
            plan_kind=self._plan_kind,
            event=event,
            fingerprint=fp,
            pair=pair,
            turn=turn,
            stale_turn=stale_turn,
            mark=self._plans.mark,
            tested_writes=tested_writes,
        )

    def _evidence(self, step: SignalInput) -> list[Evidence]:
        """Every signal's evidence on ``step``, in the signals' order (ties go to the first).

        With the detector disabled, or behind the closed step gate for a tool event, no evidence
        can raise the level (:meth:`_climb`): only the signals that keep a memory are shown the
        step, for what they remember of it; the others keep nothing, and are not asked (none).
        The model's stale turns (a turn, or a result that corroborates a self-report: no event)
        may raise it to NUDGE behind the gate, so every signal is asked then.
        """
        if not self.config.enabled or (step.event is not None and not self._gate_open()):
            for signal in self._remembering_signals():
                signal.observe(step)
            return []
        return [e for signal in self.signals if (e := signal.observe(step)) is not None]

    def _gate_open(self) -> bool:
        """More than ``min_steps`` tool events, or model turns, since the last milestone (a
        conversation that stalls may call no tool at all)."""
        gate = self.config.min_steps
        return self._since_milestone > gate or self._turns_since_milestone > gate

    def _escalate(self, signal: Evidence, reasons: set[ReasonCode]) -> StagnationVerdict:
        """:meth:`_climb`, and the verdict after it."""
        return self._verdict(escalated=self._climb(signal, reasons))

    def _climb(
        self, signal: Evidence, reasons: set[ReasonCode], *, model_side: bool = False
    ) -> bool:
        """Raise the episode's level toward the signal's; True when it rose.

        The level never goes down within an episode and climbs at most one rung per iteration,
        so the model always gets a NUDGE and a REPLAN before a human is asked, even when the
        gate opens on a loop that is already long or one response holds many stale calls.
        Behind the closed step gate nothing raises it but the model's own stale turns (a
        ``model_side`` step whose evidence is a re-issued plan or a self-report, once at least
        one tool result came in since the last milestone or the task's start), and those to
        NUDGE at most: the advice may come before ``min_steps`` steps, the alarm (REPLAN and
        above) not; a progress ledger's "no progress yet" before any tool ran is not a stall;
        the tool side and a re-asked slot (a conversation's start) wait for the
        gate. The kind and the detail line stay those of the signal that last raised the level,
        so an episode does not flip between kinds while it holds a rung.
        """
        ep = self._episode
        if not self.config.enabled or signal.level is StagnationLevel.NONE:
            return False
        if not self._gate_open() and (
            not model_side
            or self._since_milestone == 0
            or ep.level is not StagnationLevel.NONE
            or _STALE_TURN_REASONS.isdisjoint(signal.reasons)
        ):
            return False
        escalated = signal.level > ep.level and not self._climbed
        if escalated:
            self._climbed = True  # kind and detail: those of the signal that raised the level
            ep.level, ep.kind = _LEVELS[ep.level.rank + 1], signal.kind
            ep.detail = signal.detail()[:MAX_DETAIL_CHARS]
        ep.reasons.update(reasons)
        return escalated

    # -- verdicts ----------------------------------------------------------------------------

    def _verdict(self, escalated: bool) -> StagnationVerdict:
        ep = self._episode
        level = ep.level if self.config.enabled else StagnationLevel.NONE
        reasons = tuple(sorted(ep.reasons, key=_reason_order)) if level.rank else ()
        kind = ep.kind if level.rank else None
        message = (
            render_message(
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
            if level.rank
            else ""  # render_message's text for NONE, without building what it would quote
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
        """A JSON-serialisable snapshot; :meth:`from_state` restores it exactly.

        Built as plain JSON values directly: it equals ``DetectorState(...).model_dump(mode=
        "json")`` (the test suite checks it), without validating every collection again on
        each decision (the coordinator snapshots the detector at every observation). The
        config's part is dumped once per config object and shared by this detector's
        snapshots: read a snapshot, do not change it.
        """
        window, recent, runs = self._window.dump()
        plans, gists, mark = self._plans.dump()
        ep = self._episode
        return {
            "version": 2,
            "config": self._config_state(),
            "total_steps": self._total_steps,
            "steps_since_milestone": self._since_milestone,
            "new_state_changes": self._new_changes,
            "epoch": self._epoch,
            "milestones_total": self._milestones_total,
            "milestones": list(self._milestones),
            "seen": [[k, [v[0], v[1]]] for k, v in self._seen.items()],
            "paths": [[k, v] for k, v in self._paths.items()],
            "window": [[pair, error] for pair, error in window],
            "recent_pairs": recent,
            "cycle_runs": runs,
            "episode": {
                "stale_steps": ep.stale_steps,
                "amnesia_steps": ep.amnesia_steps,
                "level": ep.level.value,
                "kind": ep.kind.value if ep.kind is not None else None,
                "reasons": [r.value for r in sorted(ep.reasons, key=_reason_order)],
                "detail": ep.detail,
                "started_at": ep.started_at,
            },
            "pending_writes": self._pending_writes,
            "recent_failures": self._window.dump_failures(),
            "recent_errors": self._window.dump_errors(),
            "plans": [[plan, calls, news] for plan, calls, news in plans],
            "result_gists": gists,
            "result_words": self._plans.dump_words(),
            "plan_mark": mark,
            "plan_stale": self._plan_stale,
            "plan_kind": self._plan_kind.value if self._plan_kind is not None else None,
            "turn_mark": self._turn_mark,
            "turns_since_milestone": self._turns_since_milestone,
            "turn_open": self._turn_open,
            "climbed": self._climbed,
            "report_open": self._report_open,
            "last_write": self._last_write,
            "restored": self._restored,
            "last_result": list(self._last_result) if self._last_result is not None else None,
            "signal_memory": {memory.name: memory.dump() for memory in self._signal_memories()},
        }

    def _config_state(self) -> dict[str, Any]:
        """``self.config`` as JSON values, dumped once per config object (it is frozen)."""
        kept = self._config_dump
        if kept is None or kept[0] is not self.config:
            kept = (self.config, self.config.model_dump(mode="json"))
            self._config_dump = kept
        return kept[1]

    @classmethod
    def from_state(
        cls,
        config: StagnationConfig | None,
        state: Mapping[str, Any] | None,
        signals: Sequence[Signal] | None = None,
    ) -> StagnationDetector:
        """A detector that continues from ``state`` (what :meth:`to_state` returned).

        ``config`` wins over the configuration saved in the state (a task may retune its
        thresholds); None keeps the saved one. An empty or None ``state`` gives a fresh
        detector. ``signals`` as for the constructor (the signals keep no state of their own: the
        detector's memories are what is saved). Raises pydantic's ValidationError when the state
        is malformed.
        """
        if not state:
            return cls(config, signals)
        saved = DetectorState.model_validate(state)
        cfg = config if config is not None else saved.config
        detector = cls(cfg, signals)
        detector._total_steps = saved.total_steps
        detector._since_milestone = saved.steps_since_milestone
        detector._new_changes = saved.new_state_changes
        detector._epoch = saved.epoch
        detector._milestones_total = saved.milestones_total
        detector._milestones.extend(saved.milestones)
        detector._seen = BoundedLru(cfg.max_seen_hashes, saved.seen)
        detector._paths = BoundedLru(cfg.max_paths, saved.paths)
        detector._window.load(
            saved.window,
            saved.recent_pairs,
            saved.cycle_runs,
            saved.recent_failures,
            saved.recent_errors,
        )
        detector._episode = _Episode.load(saved.episode)
        detector._pending_writes = saved.pending_writes
        detector._plans = PlanMemory(
            cfg.plan_memory, saved.plans, saved.result_gists, saved.plan_mark, saved.result_words
        )
        detector._plan_stale = saved.plan_stale
        detector._plan_kind = saved.plan_kind
        detector._turn_mark = saved.turn_mark
        detector._turns_since_milestone = saved.turns_since_milestone
        detector._turn_open = saved.turn_open
        detector._climbed = saved.climbed
        detector._report_open = saved.report_open
        detector._last_write = saved.last_write
        detector._restored = saved.restored
        detector._last_result = saved.last_result
        for memory in detector._signal_memories():
            memory.load(saved.signal_memory.get(memory.name))
        return detector
