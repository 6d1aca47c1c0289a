"""Re-asked slots: the agent asks the user again for the same item (an id, a number, a code)
with nothing new come back since it last asked.

A tau-bench conversation stall (``trial0/9``, ``trial0/23``, ``trial1/9``) calls no tool: the
agent asks for "the reservation ID" or "your user ID", the user says they do not have it, and
the agent answers every side question by asking for it again. As whole messages the re-asks are
0.2 to 0.4 alike (each also answers something else), so neither plan rule sees them; the item
asked for is the same every time. :func:`asked_slots` reads it from the message: a noun phrase
ending in *id*, *number* or *code* (plurals too; the three read as one, so "the reservation
number" is "the reservation ID") after *your*, *the*, *a* or *an*, in a message addressed to
the reader (it says *you*, *your* or *please*). A coding agent's own notes ("let me check the
line number") address nobody and are left out.

The signal remembers, per slot, the plan memory's mark when it was last asked (the mark moves
when a new result comes back or a write changes something) and how often it was asked again at
that same mark; the most re-asked slot of a turn climbs the ``plan`` ladder. Regular
expressions only: a few microseconds per turn, nothing downloaded.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from shared.stagnation.signal import Evidence, SignalInput
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["MAX_SLOTS", "MAX_SLOT_CHARS", "SlotSignal", "asked_slots"]

MAX_SLOTS = 16
"""Slots remembered at once (the least recently asked is forgotten first)."""

MAX_SLOT_CHARS = 2_000
"""Only the beginning of a message is read for slots (a long message costs what this costs)."""

_ADDRESSED = re.compile(r"\b(?:you|your|yours|please)\b")
_SLOT = re.compile(r"\b(?:your|the|a|an)\s+((?:[a-z][a-z0-9_-]*\s+){0,2}?)(?:id|number|code)s?\b")
_NOT_MODIFIERS = frozenset({"same", "correct", "right", "exact", "new", "following", "other"})


def asked_slots(text: str) -> frozenset[str]:
    """The slots ``text`` asks its reader for: ``"reservation id"``, ``"user id"``, ``"iata
    id"``; lower-cased, *number* and *code* read as *id*, a few qualifiers that do not name
    the item ("the same", "the correct") dropped."""
    message = text[:MAX_SLOT_CHARS].lower()
    if not _ADDRESSED.search(message):
        return frozenset()
    found = set()
    for match in _SLOT.finditer(message):
        words = [w for w in match.group(1).split() if w not in _NOT_MODIFIERS]
        found.add(" ".join([*words, "id"]))
    return frozenset(found)


class SlotSignal:
    """The ``plan`` ladder on the times a slot was asked for again with nothing new since.

    It keeps a memory of its own (bounded to :data:`MAX_SLOTS`): :meth:`dump` and
    :meth:`load` persist it with the detector's state, :meth:`clear` forgets it at a
    milestone or a genuine user message. One instance belongs to one detector.
    """

    name = "slot"

    def __init__(self) -> None:
        # slot -> (the mark when it was last asked, how often it was asked again at that mark)
        self._asked: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence on a turn that asks again for a slot; None otherwise and for tool events."""
        if step.turn is None:
            return None
        reasked, slot = 0, ""
        for name in sorted(asked_slots(step.turn.text)):
            mark, count = self._asked.pop(name, (-1, 0))
            count = count + 1 if mark == step.mark else 0
            self._asked[name] = (step.mark, count)
            if count > reasked:
                reasked, slot = count, name
        while len(self._asked) > MAX_SLOTS:
            self._asked.popitem(last=False)
        level = step.config.plan.rung(reasked)
        if level is StagnationLevel.NONE:
            return None
        return Evidence(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.REASKED_SLOT,),
            lambda: (
                f"you asked for the {slot[:-2]}ID {reasked + 1} times with nothing new come "
                "back in between"
            ),
        )

    def clear(self) -> None:
        """Forget every slot (a milestone, a genuine user message)."""
        self._asked.clear()

    def dump(self) -> list[Any]:
        """The slots, least recently asked first, as JSON values."""
        return [[name, mark, count] for name, (mark, count) in self._asked.items()]

    def load(self, state: Any) -> None:
        """Restore what :meth:`dump` returned (the last :data:`MAX_SLOTS` of it)."""
        self._asked.clear()
        for name, mark, count in list(state or [])[-MAX_SLOTS:]:
            self._asked[str(name)] = (int(mark), int(count))
