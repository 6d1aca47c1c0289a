"""The Redis Streams journal on a real Redis: gap-free, idempotent, trimmed, followable."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.events import JournalEntry, ObservationsCollected, Terminated
from shared.inference import Usage
from shared.journal import (
    JournalSequenceError,
    JournalWriteError,
    JournalWriter,
    journal_stream_entry,
)
from shared.keys import journal_sequence_key, journal_stream
from shared.loop_types import TerminationReason
from tests.conftest import RedisClientFactory
from workers.journal import JournalReader, RedisStreamJournal

pytestmark = pytest.mark.redis

TASK = "task-1"
_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _entry(sequence: int, *, count: int = 1, task_id: str | None = TASK) -> JournalEntry:
    return JournalEntry(
        sequence=sequence,
        timestamp=_T0 + timedelta(seconds=sequence),
        agent_id="agent-1",
        iteration=sequence,
        event=ObservationsCollected(iteration=sequence, observation_count=count),
        task_id=task_id,
    )


def _terminated(sequence: int) -> JournalEntry:
    event = Terminated(
        reason=TerminationReason.completed(),
        iterations=sequence,
        total_usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
        duration=timedelta(seconds=1),
    )
    return JournalEntry(sequence=sequence, agent_id="agent-1", event=event, task_id=TASK)


async def _fill(journal: RedisStreamJournal, count: int) -> None:
    for _ in range(count):
        await journal.append(_entry(await journal.next_sequence()))


def test_append_then_read_round_trips(redis_client: RedisClientFactory) -> None:
    """Appended entries come back equal, in order, and next_sequence counts them."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            assert isinstance(journal, JournalWriter)
            assert await journal.next_sequence() == 0
            entries = [_entry(0), _entry(1), _terminated(2)]
            for entry in entries:
                await journal.append(entry)
            assert await journal.next_sequence() == 3
            assert await journal.read() == entries
            assert await JournalReader(client).read(TASK) == entries

    asyncio.run(scenario())


def test_stream_layout(redis_client: RedisClientFactory) -> None:
    """One stream per task; ids are 0-(sequence+1) with sequence and JSON data fields."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            journal = RedisStreamJournal(client, TASK)
            await _fill(journal, 2)
            messages: Any = await client.xrange(journal_stream(TASK, 0))
            assert [stream_id for stream_id, _ in messages] == ["0-1", "0-2"]
            assert messages[1][1]["sequence"] == "1"
            assert JournalEntry.model_validate_json(messages[1][1]["data"]) == _entry(1)
            assert await client.exists(journal_sequence_key(TASK, 0)) == 0  # the ids say it
            assert journal_stream(TASK, 0) == "orga:{p:00}:journal:task-1"

    asyncio.run(scenario())


def test_gap_is_refused(redis_client: RedisClientFactory) -> None:
    """An entry ahead of the next sequence raises with expected and actual; nothing is written."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            with pytest.raises(JournalSequenceError) as first:
                await journal.append(_entry(1))
            assert (first.value.expected, first.value.actual) == (0, 1)
            await journal.append(_entry(0))
            with pytest.raises(JournalSequenceError, match="missing") as gap:
                await journal.append(_entry(2))
            assert (gap.value.expected, gap.value.actual) == (1, 2)
            assert await client.xlen(journal_stream(TASK, 0)) == 1
            assert await journal.next_sequence() == 1

    asyncio.run(scenario())


def test_identical_reappend_is_a_no_op(redis_client: RedisClientFactory) -> None:
    """Re-appending a stored entry (at-least-once delivery) changes nothing."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            await _fill(journal, 3)
            await journal.append(_entry(2))
            await journal.append(_entry(0))
            assert await client.xlen(journal_stream(TASK, 0)) == 3
            assert await journal.next_sequence() == 3

    asyncio.run(scenario())


def test_different_entry_under_used_sequence_is_refused(redis_client: RedisClientFactory) -> None:
    """A used sequence with other content is a conflict, not a duplicate."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            await _fill(journal, 2)
            with pytest.raises(JournalSequenceError, match="different entry") as conflict:
                await journal.append(_entry(1, count=99))
            assert (conflict.value.expected, conflict.value.actual) == (2, 1)
            assert (await journal.read())[1] == _entry(1)

    asyncio.run(scenario())


def test_read_after_sequence_and_count(redis_client: RedisClientFactory) -> None:
    """read resumes after a sequence and honours count."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            await _fill(journal, 6)
            assert [e.sequence for e in await journal.read(after_sequence=2)] == [3, 4, 5]
            assert [e.sequence for e in await journal.read(after_sequence=0, count=2)] == [1, 2]
            assert await journal.read(after_sequence=5) == []
            assert await JournalReader(client).read("no-such-task") == []

    asyncio.run(scenario())


def test_stream_is_trimmed_by_length_and_sequence_survives(
    redis_client: RedisClientFactory,
) -> None:
    """MAXLEN ~ trims old entries; the sequence keeps counting and the tail stays contiguous."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK, maxlen=10)
            await _fill(journal, 250)
            length = await client.xlen(journal_stream(TASK, 0))
            assert 10 <= length < 250
            assert await journal.next_sequence() == 250
            kept = [e.sequence for e in await journal.read()]
            assert kept == list(range(250 - length, 250))
            with pytest.raises(JournalSequenceError, match="trimmed"):
                await journal.append(_entry(0))

    asyncio.run(scenario())


def test_a_commits_entry_of_several_records_sets_the_next_sequence(
    redis_client: RedisClientFactory,
) -> None:
    """After a coordinator's entry of records 0-2 (id 0-3), the next sequence is 3 with no
    companion key: a gap or a used sequence is refused, 3 is appended."""

    async def scenario() -> None:
        async with redis_client() as client:
            records = [(n, _entry(n).model_dump_json()) for n in range(3)]
            entry_id, fields = journal_stream_entry(records)
            await client.xadd(
                journal_stream(TASK, 0),
                dict(zip(fields[::2], fields[1::2], strict=True)),
                id=entry_id,
            )
            journal = RedisStreamJournal(client, TASK)
            assert await journal.next_sequence() == 3
            with pytest.raises(JournalSequenceError) as gap:
                await journal.append(_entry(4))
            assert (gap.value.expected, gap.value.actual) == (3, 4)
            await journal.append(_entry(3))
            assert [e.sequence for e in await journal.read()] == [0, 1, 2, 3]
            assert await client.exists(journal_sequence_key(TASK, 0)) == 0

    asyncio.run(scenario())


def test_concurrent_appends_of_one_sequence_admit_exactly_one(
    redis_client: RedisClientFactory,
) -> None:
    """Racing writers of the same sequence: one wins, every other one is refused."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            results = await asyncio.gather(
                *(journal.append(_entry(0, count=n)) for n in range(20)), return_exceptions=True
            )
            assert sum(r is None for r in results) == 1
            assert all(isinstance(r, JournalSequenceError) for r in results if r is not None)
            assert await client.xlen(journal_stream(TASK, 0)) == 1

    asyncio.run(scenario())


def test_journals_of_two_tasks_are_independent(redis_client: RedisClientFactory) -> None:
    """Each task has its own stream and sequence."""

    async def scenario() -> None:
        async with redis_client() as client:
            first = RedisStreamJournal(client, "a")
            second = RedisStreamJournal(client, "b")
            await first.append(_entry(0, task_id=None))
            await second.append(_entry(0, task_id="b"))
            await second.append(_entry(1, task_id="b"))
            assert (await first.next_sequence(), await second.next_sequence()) == (1, 2)

    asyncio.run(scenario())


def test_entry_of_another_task_is_refused(redis_client: RedisClientFactory) -> None:
    """An entry naming another task is not written to this task's journal."""

    async def scenario() -> None:
        async with redis_client() as client:
            journal = RedisStreamJournal(client, TASK)
            with pytest.raises(JournalWriteError, match="other"):
                await journal.append(_entry(0, task_id="other"))

    asyncio.run(scenario())


def test_follow_yields_entries_as_they_arrive(redis_client: RedisClientFactory) -> None:
    """follow sees earlier and later appends in order and stops at the chosen entry."""

    async def scenario() -> None:
        async with redis_client() as writer_client, redis_client() as reader_client:
            journal = RedisStreamJournal(writer_client, TASK)
            await _fill(journal, 2)

            async def write_more() -> None:
                for sequence in (2, 3):
                    await asyncio.sleep(0.05)
                    await journal.append(_entry(sequence))
                await asyncio.sleep(0.05)
                await journal.append(_terminated(4))

            writer = asyncio.create_task(write_more())
            follower = JournalReader(reader_client).follow(
                TASK, block_ms=50, until=lambda e: isinstance(e.event, Terminated)
            )
            seen = [entry.sequence async for entry in follower]
            await writer
            assert seen == [0, 1, 2, 3, 4]

    asyncio.run(scenario())


def test_follow_resumes_after_sequence_and_ends_when_idle(
    redis_client: RedisClientFactory,
) -> None:
    """follow after a sequence skips older entries and returns after the idle timeout."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            journal = RedisStreamJournal(client, TASK)
            await _fill(journal, 4)
            follower = journal.follow(after_sequence=1, block_ms=20, idle_timeout_ms=100)
            assert [entry.sequence async for entry in follower] == [2, 3]

    asyncio.run(scenario())


def test_invalid_settings_are_refused() -> None:
    """maxlen and batch_size below 1 are refused with the value."""
    client = Redis()
    with pytest.raises(ValueError, match="got 0"):
        RedisStreamJournal(client, TASK, maxlen=0)
    with pytest.raises(ValueError, match="got 0"):
        JournalReader(client, batch_size=0)


def test_the_reader_reads_a_coordinators_commit_entries_from_any_sequence(
    redis_client: RedisClientFactory,
) -> None:
    """A coordinator writes a commit's records in one stream entry (``shared.journal``):
    read and follow give each record once, in order, after any sequence (one inside an entry
    too), and ``count`` counts records."""
    commits = [[0], [1, 2, 3], [4], [5, 6]]
    made = {n: _entry(n) for commit in commits for n in commit}

    async def scenario() -> None:
        async with redis_client() as client:
            stream = journal_stream(TASK, 0)
            for commit in commits:
                entry_id, flat = journal_stream_entry(
                    [(n, made[n].model_dump_json()) for n in commit]
                )
                await client.xadd(
                    stream, dict(zip(flat[::2], flat[1::2], strict=True)), id=entry_id
                )
            reader = JournalReader(client)
            for after in [None, *range(7)]:
                start = -1 if after is None else after
                expected = [made[n] for n in range(start + 1, 7)]
                assert await reader.read(TASK, after) == expected, after
                assert await reader.read(TASK, after, count=2) == expected[:2], after
                followed = [
                    e async for e in reader.follow(TASK, after, block_ms=20, idle_timeout_ms=50)
                ]
                assert followed == expected, after

    asyncio.run(scenario())
