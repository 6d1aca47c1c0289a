"""The journal seam: where loop events are written (Symbiont's ``JournalWriter``)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from shared.events import JournalEntry

__all__ = ["JournalWriter"]


@runtime_checkable
class JournalWriter(Protocol):
    """Appends journal entries; the caller sets each entry's sequence from ``next_sequence``."""

    async def append(self, entry: JournalEntry) -> None:
        """Write one entry."""
        ...

    async def next_sequence(self) -> int:
        """The sequence number the next entry must carry (the count ever appended)."""
        ...
