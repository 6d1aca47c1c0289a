"""The journal seam: where loop events are written (Symbiont's ``JournalWriter``).

The caller sets each entry's sequence from ``next_sequence()``; a journal never assigns one.

    OrgaError
     +-- JournalError
          +-- JournalWriteError      the backend could not store an entry
          +-- JournalReadError       a stored entry could not be read back
          +-- JournalSequenceError   an entry's sequence is not the next one (gap or reordering)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import orjson
from pydantic import TypeAdapter

from shared.errors import OrgaError
from shared.events import JournalEntry

__all__ = [
    "BufferedJournal",
    "JournalError",
    "JournalReadError",
    "JournalSequenceError",
    "JournalStreamEntry",
    "JournalWriteError",
    "JournalWriter",
    "journal_dicts",
    "journal_records",
    "journal_stream_entry",
]


class JournalError(OrgaError):
    """Base class of journal failures."""


class JournalWriteError(JournalError):
    """The backend could not store an entry."""


class JournalReadError(JournalError):
    """A stored entry could not be read back."""


class JournalSequenceError(JournalError):
    """An entry's sequence is not the one the journal expects next."""

    def __init__(self, expected: int, actual: int, detail: str = "") -> None:
        self.expected = expected
        self.actual = actual
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"journal expected sequence {expected}, got {actual}{suffix}; "
            "take the sequence from next_sequence() just before appending"
        )


@runtime_checkable
class JournalWriter(Protocol):
    """Appends journal entries; the caller sets each entry's sequence from ``next_sequence``."""

    async def append(self, entry: JournalEntry) -> None:
        """Write one entry."""
        ...

    async def next_sequence(self) -> int:
        """The sequence number the next entry must carry (the count ever appended)."""
        ...


class BufferedJournal:
    """An in-memory ring buffer of the newest ``capacity`` entries (Symbiont's semantics).

    ``next_sequence`` is the number of entries ever appended: eviction and ``drain`` do not
    reset it. Sequences are not checked; the caller sets them.
    """

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError(f"BufferedJournal capacity must be >= 1, got {capacity}")
        self._entries: deque[JournalEntry] = deque(maxlen=capacity)
        self._appended = 0

    @property
    def capacity(self) -> int:
        """How many entries the buffer holds before evicting the oldest."""
        return self._entries.maxlen or 0

    async def append(self, entry: JournalEntry) -> None:
        """Store ``entry``, evicting the oldest one when full."""
        self._entries.append(entry)
        self._appended += 1

    async def next_sequence(self) -> int:
        """How many entries were ever appended."""
        return self._appended

    def entries(self) -> list[JournalEntry]:
        """A copy of the buffered entries, oldest first."""
        return list(self._entries)

    def drain(self) -> list[JournalEntry]:
        """Remove and return the buffered entries, oldest first; the counter is kept."""
        drained = list(self._entries)
        self._entries.clear()
        return drained

    def __len__(self) -> int:
        return len(self._entries)


# -- the journal stream's entries (docs/protocol.md section 7) ---------------------------------

JournalStreamEntry = tuple[str, list[str]]
"""A stream id and the flattened fields (name, value, ...) of one journal stream entry."""

_ENTRIES = TypeAdapter(list[JournalEntry])


def journal_stream_entry(records: Sequence[tuple[int, str]]) -> JournalStreamEntry:
    """The one stream entry that carries the journal records a commit writes, given as
    ``(sequence, JournalEntry JSON)`` in order, their sequences consecutive.

    Its id is ``0-{last sequence + 1}``, so ids still are sequences: a reader resuming after
    sequence *n* reads from ``0-{n+2}`` and skips the records of the first entry it gets
    whose sequence is not above *n*. One record: fields ``sequence`` and ``data`` (the record),
    as before several records shared an entry. Several: ``sequence`` (the last), ``first``
    (the first) and ``entries`` (a JSON array of the records).
    """
    if not records:
        raise ValueError("a journal stream entry carries at least one record")
    first, last = records[0][0], records[-1][0]
    if last - first != len(records) - 1:
        raise ValueError(
            f"the records of one journal stream entry have consecutive sequences; got "
            f"{[sequence for sequence, _ in records]}"
        )
    if len(records) == 1:
        return f"0-{last + 1}", ["sequence", str(last), "data", records[0][1]]
    entries = "[" + ",".join(text for _, text in records) + "]"
    return f"0-{last + 1}", ["sequence", str(last), "first", str(first), "entries", entries]


def _field(fields: Mapping[Any, Any], name: str) -> Any:
    value = fields.get(name)
    return fields.get(name.encode()) if value is None else value


def journal_records(fields: Mapping[Any, Any], after: int = -1) -> list[JournalEntry]:
    """The records of one journal stream entry (fields as read, bytes or text) whose sequence
    is above ``after``, validated; raises pydantic's ``ValidationError`` for a malformed one
    and ``JournalReadError`` for an entry with neither ``data`` nor ``entries``."""
    data = _field(fields, "data")
    if data is not None:
        records = [JournalEntry.model_validate_json(data)]
    else:
        entries = _field(fields, "entries")
        if entries is None:
            raise JournalReadError(
                f"a journal stream entry has neither 'data' nor 'entries': {sorted(fields)!r}"
            )
        records = _ENTRIES.validate_json(entries)
    return [r for r in records if r.sequence > after]


def journal_dicts(fields: Mapping[Any, Any], after: int = -1) -> list[dict[str, Any]]:
    """As :func:`journal_records`, the records as parsed JSON objects, unvalidated (what a
    watcher passes on as it is); a record without a ``sequence`` is kept."""
    data = _field(fields, "data")
    if data is not None:
        records = [orjson.loads(data)]
    else:
        entries = _field(fields, "entries")
        records = orjson.loads(entries) if entries is not None else [{}]
    return [r for r in records if not isinstance(r.get("sequence"), int) or r["sequence"] > after]
