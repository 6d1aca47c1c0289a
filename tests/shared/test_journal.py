"""The in-memory ring-buffer journal (Symbiont's ``BufferedJournal``, §2 and §13.6)."""

from __future__ import annotations

import asyncio

import pytest

from shared.events import JournalEntry, ObservationsCollected
from shared.journal import (
    BufferedJournal,
    JournalReadError,
    JournalSequenceError,
    JournalWriter,
    journal_dicts,
    journal_records,
    journal_stream_entry,
)


def _entry(sequence: int) -> JournalEntry:
    return JournalEntry(
        sequence=sequence,
        agent_id="agent-1",
        iteration=sequence,
        event=ObservationsCollected(iteration=sequence, observation_count=1),
    )


async def _append_all(journal: BufferedJournal, count: int) -> None:
    for _ in range(count):
        await journal.append(_entry(await journal.next_sequence()))


def test_buffered_journal_retains_entries() -> None:
    """A new journal starts at 0; two appends give next_sequence 2 and entries [0, 1]."""
    journal = BufferedJournal(100)
    assert asyncio.run(journal.next_sequence()) == 0
    asyncio.run(_append_all(journal, 2))
    assert asyncio.run(journal.next_sequence()) == 2
    assert [e.sequence for e in journal.entries()] == [0, 1]


def test_buffered_journal_overflow_evicts_oldest() -> None:
    """Capacity 3 after five appends holds sequences [2, 3, 4] and still counts 5."""
    journal = BufferedJournal(3)
    asyncio.run(_append_all(journal, 5))
    assert [e.sequence for e in journal.entries()] == [2, 3, 4]
    assert asyncio.run(journal.next_sequence()) == 5
    assert len(journal) == 3


def test_buffered_journal_drain_empties_buffer() -> None:
    """drain returns the entries and empties the buffer without resetting the counter."""
    journal = BufferedJournal()
    asyncio.run(_append_all(journal, 2))
    drained = journal.drain()
    assert [e.sequence for e in drained] == [0, 1]
    assert journal.entries() == []
    assert asyncio.run(journal.next_sequence()) == 2


def test_buffered_journal_entries_returns_all() -> None:
    """Ten appends come back as ten entries in order, as a copy."""
    journal = BufferedJournal()
    asyncio.run(_append_all(journal, 10))
    entries = journal.entries()
    assert [e.sequence for e in entries] == list(range(10))
    entries.clear()
    assert len(journal.entries()) == 10


def test_buffered_journal_defaults_and_protocol() -> None:
    """The default capacity is 1000 and the journal is a JournalWriter."""
    journal = BufferedJournal()
    assert journal.capacity == 1000
    assert isinstance(journal, JournalWriter)


def test_buffered_journal_rejects_zero_capacity() -> None:
    """A capacity below 1 is refused with the value."""
    with pytest.raises(ValueError, match="got 0"):
        BufferedJournal(0)


def test_sequence_error_names_both_sequences() -> None:
    """JournalSequenceError carries and prints the expected and actual sequences."""
    error = JournalSequenceError(expected=3, actual=5)
    assert (error.expected, error.actual) == (3, 5)
    assert "expected sequence 3, got 5" in str(error)


def test_one_stream_entry_carries_a_commits_records() -> None:
    """One record keeps the old fields (``sequence``, ``data``); several share one entry of id
    ``0-{last+1}`` with ``first`` and ``entries``; readers skip the records at or below
    ``after``; sequences that are not consecutive are refused, naming them."""
    made = {n: _entry(n) for n in range(4, 8)}
    one = journal_stream_entry([(4, made[4].model_dump_json())])
    assert one == ("0-5", ["sequence", "4", "data", made[4].model_dump_json()])
    entry_id, flat = journal_stream_entry([(n, made[n].model_dump_json()) for n in (5, 6, 7)])
    fields = dict(zip(flat[0::2], flat[1::2], strict=True))
    assert entry_id == "0-8" and fields["sequence"] == "7" and fields["first"] == "5"
    assert journal_records(fields) == [made[5], made[6], made[7]]
    assert journal_records(fields, after=5) == [made[6], made[7]]
    raw = {k.encode(): v.encode() for k, v in fields.items()}  # as redis-py returns them
    assert [r["sequence"] for r in journal_dicts(raw, after=6)] == [7]
    assert journal_records(dict(zip(one[1][0::2], one[1][1::2], strict=True))) == [made[4]]
    with pytest.raises(ValueError, match=r"consecutive sequences; got \[1, 3\]"):
        journal_stream_entry([(1, "{}"), (3, "{}")])
    with pytest.raises(JournalReadError, match="neither 'data' nor 'entries'"):
        journal_records({"sequence": "1"})
