"""The seam every stagnation signal plugs into: :class:`Signal` observes one step, answers
:class:`Evidence` (or None).

A signal is a module of :mod:`shared.stagnation.signals`, not a private method of the detector:
the detector keeps the shared memories (what was seen, the stale window, the episode's counts,
the model's stale turns), hands each signal a read-only :class:`SignalInput` for the step it
just judged, and takes the strongest :class:`Evidence` to the ladder. A tool event reaches every
signal when it was judged stale; every model turn reaches every signal (``event`` is None then:
the tool-side signals answer None; ``stale_turn`` says whether the plan rules found it stale).

A signal that needs a memory of its own (the slots asked for, :mod:`.signals.slot`) also
implements :class:`SignalMemory`: the detector saves it with its state and clears it at a
milestone or a genuine user message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from shared.stagnation.config import StagnationConfig
from shared.stagnation.events import ToolEvent, ToolKind
from shared.stagnation.fingerprint import EventFingerprint, digest
from shared.stagnation.memory import StaleWindow
from shared.stagnation.plans import ModelTurn
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = [
    "KIND_PRIORITY",
    "EventNotes",
    "Evidence",
    "Signal",
    "SignalInput",
    "SignalMemory",
    "first_line",
    "occurrences",
    "recurrence_key",
    "world_error",
]

KIND_PRIORITY = {
    StagnationKind.CYCLE: 3,
    StagnationKind.REPEAT: 2,
    StagnationKind.AMNESIA: 1,
    StagnationKind.NO_GRADIENT: 0,
}
"""When two signals reach the same rung on one step, the more specific kind names it."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One signal's rung on one step; ``detail`` renders its sentence only if it is kept."""

    level: StagnationLevel
    kind: StagnationKind
    reasons: tuple[ReasonCode, ...]
    detail: Callable[[], str]

    def rank(self) -> tuple[int, int]:
        """Higher rung first; on the same rung, the more specific kind."""
        return self.level.rank, KIND_PRIORITY[self.kind]


@dataclass(frozen=True, slots=True)
class SignalInput:
    """What a signal sees of one step, read-only: the event and its fingerprint (None for a
    model turn), the pair it was counted under, the detector's stale window, the episode's
    stale and amnesia counts, and the model side's stale-turn count and kind; for a turn, the
    turn itself, whether it was a stale turn, and the plan memory's mark (it moves when a new
    result comes back or a write changes something: the same mark means nothing new since).

    ``window`` is the detector's own memory: read it, never change it.
    """

    config: StagnationConfig
    window: StaleWindow
    stale_steps: int
    amnesia_steps: int
    plan_stale: int
    plan_kind: StagnationKind | None
    event: ToolEvent | None = None
    fingerprint: EventFingerprint | None = None
    pair: str | None = None
    turn: ModelTurn | None = None
    stale_turn: bool = False
    mark: int = 0
    tested_writes: int = 0


class Signal(Protocol):
    """A source of evidence that the agent is stuck: one method, one step in, evidence out."""

    def observe(self, step: SignalInput) -> Evidence | None:
        """The rung this signal reaches on ``step`` (None: it has nothing to say)."""
        ...


@runtime_checkable
class SignalMemory(Protocol):
    """A signal with a memory of its own, persisted with the detector's state under ``name``.

    ``dump`` returns JSON values, ``load`` restores them, ``clear`` forgets everything (a
    milestone, a genuine user message). Such a signal instance belongs to one detector.
    """

    name: str

    def dump(self) -> Any:
        """The memory as JSON values."""
        ...

    def load(self, state: Any) -> None:
        """Restore what :meth:`dump` returned."""
        ...

    def clear(self) -> None:
        """Forget everything."""
        ...


@runtime_checkable
class EventNotes(Protocol):
    """A signal that must see every tool event, new ones too: the detector hands signals only
    the stale ones, so one that counts across new results (refusals among variants, the first
    of which was news) is also told of each event, before it is judged."""

    def note(self, event: ToolEvent, fp: EventFingerprint, config: StagnationConfig) -> bool:
        """Remember what this signal needs of ``event`` (called for every non-acknowledgement
        tool event, new, neutral or stale). True when a refused write continues a run this
        signal counts (its target was refused before since its last success): a refusal never
        met before is then held neutral instead of news, so the episode and its level go on."""
        ...


def first_line(text: str, limit: int = 100) -> str:
    """The first non-blank line of ``text``, cut to ``limit`` characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def occurrences(event: ToolEvent, count: int) -> int:
    """The count a repeat ladder (repeated result, retried failure, same error) reads for
    ``event`` that came back ``count`` times: a refused write's first refusal is not counted.

    The same edit refused by a linter is re-sent while the model reads a message that hides what
    is wrong (gpt-4o-mini ``core-380``, ``databind-3666``: three retries of the identical edit,
    then a fix); by the labelling rules a stall is at least 4 steps from the first re-send, so
    REPLAN comes at the fifth refusal (the fourth re-send), not the fourth. A refused write
    changes nothing in the world, so waiting one more costs no state. Reads and commands keep
    the fourth: the dev set's gpt-4o-mini ``databind-4249`` needs it within 8 steps.
    """
    if event.failed and event.kind is ToolKind.WRITE:
        return max(count - 1, 0)
    return count


def recurrence_key(event: ToolEvent, fp: EventFingerprint) -> str | None:
    """What counts as the same result coming back, whatever came between: the same (call,
    result) pair; for a refused write, the same refusal from the same tool whatever the
    arguments (a booking refused for the same reason again and again). None for a successful
    write, which is judged by the state it leaves."""
    if not event.failed:
        return None if event.kind is ToolKind.WRITE else fp.pair
    if event.kind is ToolKind.WRITE and fp.error is not None:
        return digest("refused", event.tool_name, fp.error)
    return fp.pair


def world_error(event: ToolEvent, fp: EventFingerprint) -> str | None:
    """The error a read, a command or a write met, counted across new results.

    An *other* tool's error (a web page that failed to load, a harness refusing the model's
    reply) is counted within the episode only: an agent at work meets those now and then, and
    fourteen isolated format errors in a 145-step run are no loop (Gemini ``django-14351``).
    """
    return fp.error if event.kind is not ToolKind.OTHER else None
