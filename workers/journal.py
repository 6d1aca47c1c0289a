"""The journal of a task on Redis Streams: gap-free, idempotent, trimmed by length.

One stream per task (``orga:journal:{task_id}``, from ``shared.keys``). Each entry is one
stream message with two fields, ``sequence`` and ``data`` (the ``JournalEntry`` as JSON), and
the stream id ``0-{sequence + 1}``: ids are the sequence, so a reader can resume after any
sequence and a re-append can be checked against what is stored.

``append`` runs one Lua script that reads the last sequence from the stream's own last entry
(its id is ``0-{last + 1}``; ``XREVRANGE ... COUNT 1``) and then, atomically:

- sequence == last + 1: ``XADD ... MAXLEN ~ maxlen``;
- sequence <= last with the same JSON as the stored entry: nothing (at-least-once delivery
  upstream may append the same entry twice);
- anything else (a gap, a different entry under a used sequence, or an old sequence already
  trimmed away): ``JournalSequenceError(expected, actual)``.

``MAXLEN ~`` trims whole nodes from the head and keeps at least ``maxlen`` (>= 1) entries, so
the last entry, and with it ``next_sequence``, outlives trimming however long the journal; a
coordinator's commit (several records in one entry of id ``0-{last + 1}``) keeps the same rule.
No companion key: an older version's ``orga:journal_seq:{task_id}`` is no longer read or
written (the retention purge deletes what one left). Only Redis 6.2 commands are used.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.events import JournalEntry
from shared.journal import (
    JournalReadError,
    JournalSequenceError,
    JournalWriteError,
    journal_records,
)
from shared.keys import journal_stream, partition_of

__all__ = [
    "DEFAULT_JOURNAL_MAXLEN",
    "JournalReader",
    "RedisStreamJournal",
]

DEFAULT_JOURNAL_MAXLEN = 10_000
"""Entries kept per task stream (approximately: ``MAXLEN ~`` trims whole stream nodes)."""

_APPEND_SCRIPT = """
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local expected = 0
if #newest > 0 then expected = tonumber(string.match(newest[1][1], '^0%-(%d+)$')) end
local sequence = tonumber(ARGV[1])
if sequence == expected then
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], ARGV[2], 'sequence', ARGV[1], 'data', ARGV[3])
  return {1, expected}
end
if sequence > expected then return {-1, expected} end
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found == 0 then return {-3, expected} end
local fields = found[1][2]
for i = 1, #fields, 2 do
  if fields[i] == 'data' and fields[i + 1] == ARGV[3] then return {0, expected} end
end
return {-2, expected}
"""

_APPENDED, _DUPLICATE, _GAP, _CONFLICT, _TRIMMED = 1, 0, -1, -2, -3

_REJECTIONS = {
    _GAP: "the entries in between are missing",
    _CONFLICT: "a different entry already holds this sequence",
    _TRIMMED: "this sequence was trimmed from the stream and cannot be compared",
}


def _stream_id(sequence: int) -> str:
    return f"0-{sequence + 1}"


def _sequence_after(stream_id: bytes | str | None) -> int:
    """The sequence after the last one an entry of id ``0-{last + 1}`` holds: ``last + 1``."""
    return int(_text(stream_id or "0-0").partition("-")[2])


class RedisStreamJournal:
    """A ``JournalWriter`` for one task, on a Redis stream trimmed to about ``maxlen`` entries."""

    def __init__(
        self,
        redis: Redis,
        task_id: str,
        *,
        maxlen: int = DEFAULT_JOURNAL_MAXLEN,
        partitions: int = 1,
    ) -> None:
        if maxlen < 1:
            raise ValueError(f"journal maxlen must be >= 1, got {maxlen}")
        self._redis = redis
        self._task_id = task_id
        self._partition = partition_of(task_id, partitions)
        self._maxlen = maxlen
        self._reader = JournalReader(redis, partitions=partitions)
        self._append = redis.register_script(_APPEND_SCRIPT)

    @property
    def task_id(self) -> str:
        """The task whose journal this is."""
        return self._task_id

    async def append(self, entry: JournalEntry) -> None:
        """Append ``entry``; a re-append of the same entry is a no-op, anything else out of
        order raises ``JournalSequenceError``."""
        self._check_task(entry)
        p = self._partition
        keys = [journal_stream(self._task_id, p)]
        args: list[str | int] = [
            entry.sequence,
            _stream_id(entry.sequence),
            entry.model_dump_json(),
            self._maxlen,
        ]
        try:
            status, expected = await self._append(keys=keys, args=args)
        except RedisError as exc:
            raise JournalWriteError(
                f"journal of task {self._task_id!r}: Redis refused sequence {entry.sequence}: {exc}"
            ) from exc
        if int(status) < _DUPLICATE:
            raise JournalSequenceError(int(expected), entry.sequence, _REJECTIONS[int(status)])

    async def next_sequence(self) -> int:
        """One more than the last appended sequence; 0 for a new journal."""
        stream = journal_stream(self._task_id, self._partition)
        try:
            newest = await self._redis.xrevrange(stream, count=1)
        except RedisError as exc:
            raise JournalReadError(
                f"journal of task {self._task_id!r}: cannot read the last sequence: {exc}"
            ) from exc
        return _sequence_after(newest[0][0]) if newest else 0

    async def read(
        self, after_sequence: int | None = None, count: int | None = None
    ) -> list[JournalEntry]:
        """The retained entries of this task after ``after_sequence``, oldest first."""
        return await self._reader.read(self._task_id, after_sequence, count)

    def follow(
        self,
        after_sequence: int | None = None,
        *,
        block_ms: int = 1000,
        idle_timeout_ms: int | None = None,
        until: Callable[[JournalEntry], bool] | None = None,
    ) -> AsyncIterator[JournalEntry]:
        """Entries of this task as they are appended (see ``JournalReader.follow``)."""
        return self._reader.follow(
            self._task_id,
            after_sequence,
            block_ms=block_ms,
            idle_timeout_ms=idle_timeout_ms,
            until=until,
        )

    def _check_task(self, entry: JournalEntry) -> None:
        if entry.task_id is not None and entry.task_id != self._task_id:
            raise JournalWriteError(
                f"entry {entry.sequence} belongs to task {entry.task_id!r} but this is the "
                f"journal of task {self._task_id!r}; append it to that task's journal"
            )


class JournalReader:
    """Reads and follows any task's journal stream."""

    def __init__(self, redis: Redis, *, batch_size: int = 100, partitions: int = 1) -> None:
        if batch_size < 1:
            raise ValueError(f"journal batch_size must be >= 1, got {batch_size}")
        self._redis = redis
        self._partitions = partitions
        self._batch_size = batch_size

    async def read(
        self, task_id: str, after_sequence: int | None = None, count: int | None = None
    ) -> list[JournalEntry]:
        """Up to ``count`` retained entries after ``after_sequence`` (all when None)."""
        start = "-" if after_sequence is None else _stream_id(after_sequence + 1)
        try:
            stream = journal_stream(task_id, partition_of(task_id, self._partitions))
            messages = await self._redis.xrange(stream, start, "+", count)
        except RedisError as exc:
            raise JournalReadError(f"journal of task {task_id!r}: cannot read: {exc}") from exc
        after = -1 if after_sequence is None else after_sequence
        entries = [
            entry
            for _, fields in messages or []
            if fields is not None
            for entry in _decode(task_id, fields, after)
        ]
        return entries if count is None else entries[:count]

    async def follow(
        self,
        task_id: str,
        after_sequence: int | None = None,
        *,
        block_ms: int = 1000,
        idle_timeout_ms: int | None = None,
        until: Callable[[JournalEntry], bool] | None = None,
    ) -> AsyncIterator[JournalEntry]:
        """Yield entries after ``after_sequence`` as they arrive (XREAD BLOCK ``block_ms``).

        Ends after an entry for which ``until`` is true, or once ``idle_timeout_ms`` pass with
        no new entry; with neither it runs until the consumer stops iterating.
        """
        last_id = "0-0" if after_sequence is None else _stream_id(after_sequence)
        seen = -1 if after_sequence is None else after_sequence
        idle_since = time.monotonic()
        while True:
            batch = await self._next_batch(task_id, last_id, block_ms)
            for stream_id, fields in batch:
                last_id = _text(stream_id)
                for entry in _decode(task_id, fields, seen):
                    seen = entry.sequence
                    yield entry
                    if until is not None and until(entry):
                        return
            if batch:
                idle_since = time.monotonic()
            elif _idle_expired(idle_since, idle_timeout_ms):
                return

    async def _next_batch(
        self, task_id: str, last_id: str, block_ms: int
    ) -> list[tuple[bytes | str, dict[Any, Any]]]:
        stream = journal_stream(task_id, partition_of(task_id, self._partitions))
        try:
            response: Any = await self._redis.xread(
                {stream: last_id}, count=self._batch_size, block=block_ms
            )
        except RedisError as exc:
            raise JournalReadError(f"journal of task {task_id!r}: cannot follow: {exc}") from exc
        if not response:
            return []
        if isinstance(response, dict):  # RESP3 replies map stream names to message lists
            return list(next(iter(response.values()))[0])
        return list(response[0][1])


def _idle_expired(idle_since: float, idle_timeout_ms: int | None) -> bool:
    if idle_timeout_ms is None:
        return False
    return (time.monotonic() - idle_since) * 1000 >= idle_timeout_ms


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode(task_id: str, fields: dict[Any, Any], after: int = -1) -> list[JournalEntry]:
    """The entries of one stream message above sequence ``after``: its ``data``, or the
    ``entries`` of a coordinator's commit (:func:`shared.journal.journal_records`)."""
    if not any(name in fields for name in (b"data", "data", b"entries", "entries")):
        raise JournalReadError(
            f"journal of task {task_id!r}: a stream message has no 'data' field: {fields!r}"
        )
    try:
        return journal_records(fields, after)
    except ValidationError as exc:
        raise JournalReadError(
            f"journal of task {task_id!r}: a stored entry is not a JournalEntry: {exc}"
        ) from exc
