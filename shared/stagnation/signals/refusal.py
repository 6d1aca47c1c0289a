"""Refused writes: the same write on the same target refused again among variants of its
arguments, and re-sent unchanged after it was refused the same way.

A tau-bench update stall (``trial1/23``, ``trial3/23``) sends one update of one reservation
four times among three payment variants: "gift card balance is not enough", "certificate
cannot be used", then a gift card that was already refused, again. A booking stall
(``trial1/8``, dev ``trial3/46``) re-sends the refused booking with the amount the refusal
already rejected. The retried-failure signal counts the same refusal from the same tool; here
the refusals differ (the payment changed the error), and four refusals are under its REPLAN
rung. What the stuck runs do and a progressing run that tries payment variants until one
passes (dev ``trial0/3``: five refusals, each with a payment never tried, then the update
succeeds) does not: after trying another variant they **go back to a call, argument for
argument, that was already refused the same way**. That is an experiment whose result the
agent already has. The same call re-sent with no variant between is the retried-failure
signal's (its ladder, which the held-out selection tunes): three identical refused edits
then a fix are progressing SWE-agent runs (hard ``core-380``, ``databind-3666``).

The signal notes every write (new ones too, :class:`~shared.stagnation.signal.EventNotes`):
per target (tool and path: the reservation, the file), the refusals since the last success on
it, in the last ``history`` events. On a stale refused write it counts them on the ``refusal``
ladder (2 / 3 / 5 / 8), but above NUDGE only when this refusal re-sends a call already refused
the same way and another variant was refused on the target too: arguments compared exactly
(unmasked: ``gift_card_7480005`` and ``gift_card_7091239`` mask alike and are two payments),
the refusal by its error fingerprint.
A one-off retry (``trial1/15``: the same downgrade refused twice for lack of seats, then a
narrower one succeeds) stays at NUDGE. O(``history``) per refused write, nothing downloaded.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from shared.stagnation.config import StagnationConfig
from shared.stagnation.events import ToolEvent, ToolKind
from shared.stagnation.fingerprint import EventFingerprint, canonical_json, digest
from shared.stagnation.signal import Evidence, SignalInput, first_line
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["RefusalSignal"]


class RefusalSignal:
    """The ``refusal`` ladder on a target's refusals since its last success, above NUDGE only
    for a call re-sent unchanged after the same refusal, with another variant refused too.

    It keeps a memory of its own (the writes of the last ``history`` events): :meth:`dump` and
    :meth:`load` persist it with the detector's state, :meth:`clear` forgets it at a milestone
    or a genuine user message. One instance belongs to one detector.
    """

    name = "refusal"

    def __init__(self) -> None:
        self._events = 0  # tool events noted so far (the clock of the ``history`` window)
        # writes of the last ``history`` events: (event number, target, exact call, refusal
        # digest, or None for a success)
        self._writes: deque[tuple[int, str, str, str | None]] = deque()

    def note(self, event: ToolEvent, fp: EventFingerprint, config: StagnationConfig) -> bool:
        """Count ``event`` on the window's clock; remember it if it is a write. True for a
        refusal of a target already refused since its last success (held neutral)."""
        self._events += 1
        writes = self._writes
        while writes and writes[0][0] <= self._events - config.history:
            writes.popleft()
        if event.kind is not ToolKind.WRITE:
            return False
        target = digest(event.tool_name, event.path or "")
        call = digest(event.tool_name, canonical_json(event.arguments))
        refusal = digest(fp.error or fp.outcome) if event.failed else None
        held = refusal is not None and self._refused(target)
        writes.append((self._events, target, call, refusal))
        return held

    def _refused(self, target: str) -> bool:
        """True when ``target`` was refused since its last success (in the window)."""
        for _, other, _, refusal in reversed(self._writes):
            if other == target:
                return refusal is not None
        return False

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence on a stale refused write; None otherwise."""
        event = step.event
        if event is None or event.kind is not ToolKind.WRITE or not event.failed:
            return None
        if not self._writes or self._writes[-1][0] != self._events:
            return None  # not noted (a host that bypassed note): nothing to compare with
        _, target, call, refusal = self._writes[-1]
        refusals: list[tuple[str, str | None]] = []
        for _, other, other_call, other_refusal in self._writes:
            if other != target:
                continue
            if other_refusal is None:
                refusals.clear()  # a success on the target: its refusals are over
            else:
                refusals.append((other_call, other_refusal))
        count = len(refusals)
        varied = any(other_call != call for other_call, _ in refusals)
        # back to a call already refused the same way, after another variant was refused too
        resent = varied and (call, refusal) in refusals[:-1]
        level = step.config.refusal.rung(count)
        if not resent:
            level = min(level, StagnationLevel.NUDGE)
        if level is StagnationLevel.NONE:
            return None
        return Evidence(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.REFUSED_WRITE,),
            lambda: (
                f"{event.tool_name} was refused {count} times on the same target "
                + ("among variants of its arguments" if varied else "with the same arguments")
                + (", and this exact call was refused the same way before" if resent else "")
                + f" ({first_line(event.output)!r})"
            ),
        )

    def clear(self) -> None:
        """Forget the writes (a milestone, a genuine user message); the clock goes on."""
        self._writes.clear()

    def dump(self) -> list[Any]:
        """The clock and the remembered writes, oldest first, as JSON values."""
        return [self._events, [list(entry) for entry in self._writes]]

    def load(self, state: Any) -> None:
        """Restore what :meth:`dump` returned (None or empty: nothing remembered)."""
        self._writes.clear()
        self._events = 0
        if not state:
            return
        events, writes = state
        self._events = int(events)
        for number, target, call, refusal in writes:
            self._writes.append(
                (int(number), str(target), str(call), None if refusal is None else str(refusal))
            )
