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
from typing import Protocol, runtime_checkable

from shared.errors import OrgaError
from shared.events import JournalEntry

__all__ = [
    "BufferedJournal",
    "JournalError",
    "JournalReadError",
    "JournalSequenceError",
    "JournalWriteError",
    "JournalWriter",
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
