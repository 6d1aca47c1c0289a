"""Task state in Redis: created once, updated by compare-and-set together with its effects.

``commit`` runs one Lua script that, atomically, checks the record's version (and creation
time: a task of that id created anew after a purge may reach the same version), writes the new
state, acknowledges the stream entry that caused the change (an observation: left pending,
deleted with others once the commit is written, :meth:`TaskStore.delete_applied`; an outage
report, which a second application would count again, deleted by the script), appends
the commit's journal
records (in one stream entry of id ``0-{last sequence+1}``,
:func:`shared.journal.journal_stream_entry`), the lifecycle events, the review items and the
dead letters, the sub-agent tasks it submits to the intake, a finished sub-agent's result for
its parent (on the observations stream) and the cancellations of its running children (on the
control stream), and appends the dispatches the
new state awaits to the commits' outbox stream (:mod:`shared.outbox`; a relay sends them to
Celery, :mod:`coordinator.relay`, handed them in-process through
:attr:`TaskStore.dispatched`), or, when the broker is this Redis (:attr:`TaskStore.inline`),
pushes them onto their Celery queues itself. A coordinator killed at any moment therefore
leaves either the old state with the entry still pending (it is redelivered and applied) or
the new state with the entry acknowledged and its work in the outbox (or on its queue): never
half of it, and never twice (an observation applied and not deleted yet is claimed again, a
duplicate the fences ignore).
"""

from __future__ import annotations

import logging
import operator
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import orjson
from pydantic import TypeAdapter
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from coordinator.machine import Effects
from coordinator.state import TERMINAL_STATUSES, ReviewItem, TaskRecord
from shared import keys
from shared.conversation import ConversationMessage
from shared.errors import OrgaError
from shared.journal import journal_stream_entry
from shared.outbox import OutboxEntry
from shared.protocol import encode_entry
from shared.task_spec import TaskSpec

__all__ = [
    "CommitConflictError",
    "ConversationDelta",
    "CreateOutcome",
    "PendingCommit",
    "TaskStore",
]


log = logging.getLogger("orga.coordinator.store")


class CommitConflictError(OrgaError):
    """Another coordinator changed the task first; reload and apply again."""


_COMMIT = """
local extra = cjson.decode(ARGV[8])
local previous
local stamp = false  -- the record's created_at is written with it (its first write)
local create = extra.create
-- ARGV[5]: the entry acknowledged here, if any ('' for a create whose acknowledgement is
-- deferred: TaskStore.create_started_many acknowledges a chunk's entries in one XACK after it).
local ack = ARGV[5] ~= ''
if create then
  -- A new task created started (TaskStore.create_started): _CREATE's checks, then its start
  -- commit as the record's first write (no version 0 written, read and rewritten).
  -- KEYS[16]: the idempotency key, KEYS[17]: the task index. The record keeps the intake
  -- entry that created it (field entry): that entry delivered again (its acknowledgement
  -- deferred and lost) is answered 4, acknowledged and nothing else, not told a duplicate.
  if create.idem ~= '' then
    local existing = redis.call('GET', KEYS[16])
    if existing then
      local code = 0
      if existing ~= extra.task_id and redis.call('HGET', KEYS[1], 'alias_of') ~= existing then
        if redis.call('EXISTS', KEYS[1]) == 1 then return {2, existing} end
        redis.call('HSET', KEYS[1], 'alias_of', existing)
        redis.call('EXPIRE', KEYS[1], create.idem_ttl)
      elseif existing == extra.task_id and create.entry ~= ''
          and redis.call('HGET', KEYS[1], 'entry') == create.entry then
        code = 4
      end
      if ack then redis.call('XACK', KEYS[tonumber(ARGV[6])], ARGV[7], ARGV[5]) end
      return {code, existing}
    end
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local code = 0
    if create.entry ~= '' and redis.call('HGET', KEYS[1], 'entry') == create.entry then
      code = 4
    end
    if ack then redis.call('XACK', KEYS[tonumber(ARGV[6])], ARGV[7], ARGV[5]) end
    return {code, extra.task_id}
  end
  -- Someone holds the lease of a task not created yet: nothing written (created apart).
  if not redis.call('SET', KEYS[14], create.owner, 'NX', 'PX', create.lease_ms) then
    return {3, extra.task_id}
  end
  if create.idem ~= '' then
    redis.call('SET', KEYS[16], extra.task_id, 'EX', create.idem_ttl)
  end
  redis.call('ZADD', KEYS[17], create.created_at, extra.task_id)
  stamp = true
  previous = false  -- no status before: counted in ARGV[4], indexed below
else
  -- The version and the creation time: a task of this id created anew (the one this record
  -- is of purged) may reach the same version. A record without created_at (written before it
  -- was stored) is confirmed by its version alone, and has it written with this commit.
  local held = redis.call('HMGET', KEYS[1], 'version', 'status', 'created_at')
  local current = held[1]
  if (current or '') ~= ARGV[1] then return {0, current or ''} end
  if held[3] and held[3] ~= extra.created_at then return {0, current} end
  previous = held[2]
  if not held[3] then stamp = true end
end
-- The status counts (keys.status_counts_key): a change of status is one HINCRBY of the field
-- "{previous}>{status}" (read as -1 previous, +1 status); a new status alone is "{status}".
if previous ~= ARGV[4] then
  redis.call('HINCRBY', KEYS[8], previous and (previous .. '>' .. ARGV[4]) or ARGV[4], 1)
end
-- One HSET: the state, with the end's time and the creation time when they are written.
local fields = {'version', ARGV[2], 'state', ARGV[3], 'status', ARGV[4]}
if extra.terminal then
  fields[#fields + 1] = 'finished_at'
  fields[#fields + 1] = extra.now
end
if stamp then
  fields[#fields + 1] = 'created_at'
  fields[#fields + 1] = extra.created_at
end
if create and create.entry ~= '' then
  fields[#fields + 1] = 'entry'
  fields[#fields + 1] = create.entry
end
redis.call('HSET', KEYS[1], unpack(fields))
-- An applied observation (a tool output, maybe large) is in the conversation now: it is not
-- touched here, the store deletes the observations applied in one XDEL per partition a little
-- later (TaskStore.delete_applied); until then it stays pending, and a claim of it (its
-- coordinator killed meanwhile) is a duplicate answer the fences ignore. One whose second
-- application is no duplicate (an outage report: the held dispatch keeps its fence) is deleted
-- here (delete_now), not acknowledged on Redis 7.0.4 and later: the next claim (XAUTOCLAIM)
-- drops its delivery; older Redis do not (6.2 keeps it pending for ever; 7.0.0-7.0.3 crash on
-- many): acknowledged too. Any other entry (ARGV[6]: which of KEYS is its stream, every key in
-- KEYS: Redis Cluster) is acknowledged.
if ack then
  local acked = KEYS[tonumber(ARGV[6])]
  if extra.delete_now then
    if extra.ack_deleted then redis.call('XACK', acked, ARGV[7], ARGV[5]) end
    redis.call('XDEL', acked, ARGV[5])
  elseif not extra.delete_entry then
    redis.call('XACK', acked, ARGV[7], ARGV[5])
  end
end
-- The commit's journal records in one stream entry (shared.journal.journal_stream_entry).
-- Its id 0-{last sequence+1} is the journal's last sequence: no companion key (Redis refuses
-- an id not above the stream's last one, trimmed or not, and the version check fences it).
local journal = extra.journal
if journal.id ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', extra.journal_maxlen, journal.id,
             unpack(journal.fields))
end
for _, ev in ipairs(extra.events) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', extra.events_maxlen, '*', unpack(ev))
end
for _, r in ipairs(extra.reviews) do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', extra.events_maxlen, '*',
             'review_id', r[1], 'item', r[2])
  redis.call('HSET', KEYS[5], r[1], r[2])
end
for _, id in ipairs(extra.closed_reviews) do redis.call('HDEL', KEYS[5], id) end
for _, d in ipairs(extra.dead_letters) do
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', extra.events_maxlen, '*', unpack(d))
end
for _, c in ipairs(extra.children) do
  redis.call('XADD', KEYS[11], 'MAXLEN', '~', extra.intake_maxlen, '*', unpack(c))
end
for _, o in ipairs(extra.child_results) do
  redis.call('XADD', KEYS[12], 'MAXLEN', '~', extra.observations_maxlen, '*', unpack(o))
end
for _, c in ipairs(extra.cancels) do
  redis.call('XADD', KEYS[13], 'MAXLEN', '~', extra.control_maxlen, '*', unpack(c))
end
local sent = {}  -- the outbox entries' ids, returned: the relay is handed them in-process
local inline = extra.inline  -- per dispatch, its queue's place in KEYS: pushed there itself
for i, head in ipairs(extra.outbox) do
  if inline then
    redis.call('LPUSH', KEYS[inline[i]], ARGV[8 + i])
  else
    sent[i] = redis.call('XADD', KEYS[15], '*', 'payload', ARGV[8 + i], unpack(head))
  end
end
local conversation = extra.conversation
-- A record at version 0 was never committed: no commit wrote its conversation, nothing to delete.
if conversation.rewrite and ARGV[1] ~= '0' then redis.call('DEL', KEYS[10]) end
local first = 8 + #extra.outbox
-- One RPUSH per 256 messages (unpack's stack stays small).
for j = 1, conversation.count, 256 do
  local last = first + math.min(j + 255, conversation.count)
  redis.call('RPUSH', KEYS[10], unpack(ARGV, first + j, last))
end
if extra.terminal then
  redis.call('ZADD', KEYS[9], extra.now, extra.task_id)
  redis.call('ZREM', KEYS[7], extra.task_id)
  -- The lease of a task that ended guards nothing (no deadline is left to look at): not
  -- deleted, it expires by its TTL (its holder stops renewing it; one taken over meanwhile
  -- is dropped by its holder's next renewal, which finds the task inactive).
else
  -- The deadline index holds the task from its creation (or this commit, for a task created
  -- started) to its end: a task is active if and only if it is indexed (keys.deadlines_key).
  redis.call('ZADD', KEYS[7], extra.deadline, extra.task_id)
end
return {1, ARGV[2], sent}
"""

_CREATE = """
-- 4: the task exists, created by this very intake entry (_COMMIT's field entry), delivered
-- again after its acknowledgement was lost (TaskStore.create_started_many): no duplicate.
if ARGV[1] ~= '' then
  local existing = redis.call('GET', KEYS[2])
  if existing then
    local code = 0
    if existing ~= ARGV[2] and redis.call('HGET', KEYS[1], 'alias_of') ~= existing then
      if redis.call('EXISTS', KEYS[1]) == 1 then return {2, existing} end
      redis.call('HSET', KEYS[1], 'alias_of', existing)
      redis.call('EXPIRE', KEYS[1], ARGV[5])
    elseif existing == ARGV[2] and ARGV[7] ~= ''
        and redis.call('HGET', KEYS[1], 'entry') == ARGV[7] then
      code = 4
    end
    if ARGV[7] ~= '' then redis.call('XACK', KEYS[7], ARGV[9], ARGV[7]) end
    return {code, existing}
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local code = 0
  if ARGV[7] ~= '' and redis.call('HGET', KEYS[1], 'entry') == ARGV[7] then code = 4 end
  if ARGV[7] ~= '' then redis.call('XACK', KEYS[7], ARGV[9], ARGV[7]) end
  return {code, ARGV[2]}
end
redis.call('HSET', KEYS[1], 'version', '0', 'state', ARGV[3], 'status', ARGV[4],
           'created_at', ARGV[6])
redis.call('HINCRBY', KEYS[5], ARGV[4], 1)
if ARGV[1] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[5]) end
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[2])  -- active from now: in the deadline index
if ARGV[7] ~= '' then redis.call('XACK', KEYS[7], ARGV[9], ARGV[7]) end
local leased = 0
if ARGV[10] ~= '' and redis.call('SET', KEYS[6], ARGV[10], 'NX', 'PX', ARGV[11]) then leased = 1 end
return {1, ARGV[2], leased}
"""

_PURGE = """
redis.call('ZREM', KEYS[6], ARGV[2])
local finished = redis.call('HGET', KEYS[1], 'finished_at')
if not finished or tonumber(finished) > tonumber(ARGV[1]) then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status then redis.call('HINCRBY', KEYS[5], status, -1) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[7])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_RENEW_HELD = """
local active = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 3))
local owners = redis.call('MGET', unpack(KEYS, 2))
local out = {}
for i = 1, #ARGV - 2 do
  local mine = owners[i] == ARGV[1]
  if not active[i] then
    if mine then redis.call('DEL', KEYS[i + 1]) end
    out[i] = 2
  elseif mine then
    redis.call('PEXPIRE', KEYS[i + 1], ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""
"""The leases of one partition's held tasks in one call (KEYS: the partition's deadline index,
then the tasks' leases; ARGV: owner, TTL in ms, then the task ids): which are active (indexed:
a score, not nil) and who holds each lease read with one ``ZMSCORE`` and one ``MGET``; each
task still active has its lease renewed if ``owner`` holds it (1) or is reported lost (0);
each task that has ended has its lease released if ``owner`` holds it (2)."""

RENEW_HELD_CHUNK: Final = 256
"""At most this many tasks per call of the batched renewal (a Lua ``unpack`` stays small)."""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_ACQUIRE = """
local owner = redis.call('GET', KEYS[1])
if owner == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


_JSON_STRING = TypeAdapter(str)

STORED_CONVERSATIONS_KEPT = 20_000
"""Tasks whose stored conversation a store remembers (by reference: no copy of a message)."""


@dataclass(frozen=True, slots=True)
class ConversationDelta:
    """The part of a conversation one commit writes: appended ``messages`` (JSON), or all
    of them after a ``rewrite``; ``size`` in bytes."""

    rewrite: bool
    messages: list[str]
    size: int


@dataclass(frozen=True, slots=True)
class CreateOutcome:
    """``created`` is False when the idempotency key or the id named an existing task.

    ``conflict``: the idempotency key names task ``task_id`` while the submitted id is another
    task (or another key's alias); nothing was written and the intake entry is still pending.
    Otherwise a new id resubmitted with a used key is stored as an alias of the key's task
    (``alias_of``, expiring with the key).
    """

    created: bool
    task_id: str
    conflict: bool = False
    leased: bool = False
    """The task was created and its lease taken for the ``lease`` owner given to ``create``."""
    started: bool = False
    """The task was created with its start committed (:meth:`TaskStore.create_started`)."""
    redelivered: bool = False
    """Not created: the task exists, created by this very intake entry, delivered again (its
    acknowledgement deferred, :meth:`TaskStore.create_started_many`, and not made): no
    duplicate, nothing to tell; the entry is acknowledged."""


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A commit prepared by :meth:`TaskStore.prepare`: the script's keys and arguments."""

    record: TaskRecord
    effects: Effects
    keys: list[str]
    args: list[str | bytes]
    size: int
    """JSON size of the record and of the conversation it appends (what keeping it costs)."""
    stored: list[ConversationMessage] | None = None
    """The stored conversation remembered when it was prepared (its delta's base)."""
    dispatches: Sequence[OutboxEntry] = ()
    """The outbox entries the commit appends, in order."""
    spec_json: tuple[TaskSpec, bytes] | None = None
    """A new task's spec and its JSON (prepared with ``create``): cached once it is created."""
    applied_entry: str = ""
    """The observation the commit applies (its stream id), deleted once the commit is written
    (:meth:`TaskStore.delete_applied`); empty for a commit of anything else."""
    ack_after: tuple[str, str, str] | None = None
    """A create whose intake entry (stream, group, id) its script does not acknowledge
    (prepared with ``ack_after``): :meth:`TaskStore.create_started_many` does, once answered."""
    inline: bool = False
    """Its dispatches are pushed onto their queues by the script itself (:attr:`TaskStore.inline`),
    not appended to the outbox: nothing to hand to the relay."""


@dataclass
class TaskStore:
    """Loads, creates and commits task records; holds and renews leases.

    A record this store created or committed is kept parsed (up to ``record_cache_bytes`` of
    JSON, least recently written evicted first; terminal records are not kept): the next ``load``
    of the task then reads only its ``version`` and ``created_at`` and, when no one committed
    since (and the task was not purged and created anew), hands that record back instead of
    reading and parsing the whole state again, which is the largest part of an apply for a
    long conversation. A record returned by ``load`` belongs to the caller;
    it is kept again only once committed.
    """

    redis: Redis
    journal_maxlen: int = 10_000
    partitions: int = 1
    """The deployment's partition count (``ORGA_PARTITIONS``): a task's keys are in
    :func:`shared.keys.partition_of` its id, the deployment-wide views merge every partition."""
    events_maxlen: int = 100_000
    record_cache_bytes: int = 4 * 1024 * 1024
    """JSON size of the records kept parsed (their parsed form takes about ten times more)."""
    spec_cache_bytes: int = 4 * 1024 * 1024
    """JSON size of the task specs kept encoded (with their parsed form) for live tasks."""
    _kept: OrderedDict[str, tuple[TaskRecord, int]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _kept_bytes: int = field(default=0, init=False, repr=False)
    _stored: OrderedDict[str, list[ConversationMessage]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _specs: OrderedDict[str, tuple[TaskSpec, bytes]] = field(
        default_factory=OrderedDict, init=False, repr=False
    )
    _specs_bytes: int = field(default=0, init=False, repr=False)
    _partitions_keys: dict[int, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False
    )
    acknowledge_deleted: bool = True
    """Whether an observation applied or dropped is acknowledged as well as deleted: needed on a
    Redis before 7.0.4, whose ``XAUTOCLAIM`` does not drop the delivery of an entry deleted
    while pending (6.2 keeps it pending for ever, with no id to acknowledge it by; 7.0.0-7.0.3
    overrun a buffer on many: CVE-2022-31144). The coordinator turns it off at its start on
    7.0.4 and later (:func:`coordinator.streams.claim_drops_deleted`): one command less per
    call. On (the default) for whoever does not know the server's version."""
    _applied: dict[int, list[str]] = field(default_factory=dict, init=False, repr=False)
    """The observations applied (committed) and not deleted yet, by partition."""
    _applied_since: float | None = field(default=None, init=False, repr=False)
    """When the oldest of ``_applied`` was noted (``time.monotonic``); None when none waits."""
    dispatched: Callable[[int, Sequence[tuple[str, OutboxEntry]]], None] | None = None
    """Told of each commit written with dispatches: the partition and each outbox entry with its
    stream id (the coordinator's relay, :meth:`coordinator.relay.OutboxRelay.hand`)."""
    inline: Callable[[Sequence[OutboxEntry]], list[tuple[str, bytes]]] | None = None
    """When the broker is this Redis (:class:`coordinator.transport.InlineQueues`): each
    dispatch's queue and broker message, which the commit script pushes there (``LPUSH``) in
    the same atomic step as the state, instead of appending it to the commits' outbox for the
    relay: a dispatch is on its queue once, exactly when its commit is written. A dispatch this
    cannot lay out goes through the outbox (logged)."""

    def __post_init__(self) -> None:
        self._commit = self.redis.register_script(_COMMIT)
        self._create = self.redis.register_script(_CREATE)
        self._renew = self.redis.register_script(_RENEW)
        self._purge = self.redis.register_script(_PURGE)
        self._release = self.redis.register_script(_RELEASE)
        self._renew_held = self.redis.register_script(_RENEW_HELD)
        self._acquire = self.redis.register_script(_ACQUIRE)

    def _partition_keys(self, p: int) -> tuple[str, ...]:
        """The keys of partition ``p`` every commit names, in the commit script's order
        (computed once per partition)."""
        found = self._partitions_keys.get(p)
        if found is None:
            found = self._partitions_keys[p] = (
                keys.events_stream(p),
                keys.review_stream(p),
                keys.open_reviews_key(p),
                keys.dead_letter_stream(p),
                keys.deadlines_key(p),
                keys.status_counts_key(p),
                keys.finished_tasks_key(p),
                keys.intake_stream(p),
                keys.observations_stream(p),
                keys.control_stream(p),
                keys.commit_outbox_stream(p),
            )
        return found

    def partition(self, task_id: str) -> int:
        """The partition of a task (:func:`shared.keys.partition_of`)."""
        return keys.partition_of(task_id, self.partitions)

    async def load(self, task_id: str) -> TaskRecord | None:
        """The stored record, or None when there is no such task."""
        p = self.partition(task_id)
        key = keys.task_key(task_id, p)
        kept = self._take(task_id)
        if kept is not None and _confirms(kept, await self.redis.hmget(key, _IDENTITY)):
            return kept
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(key, "state")
        pipe.lrange(keys.conversation_key(task_id, p), 0, -1)
        state, stored = await pipe.execute()
        if state is None:
            return None
        record = TaskRecord.model_validate_json(state)
        if record.restore_conversation(stored):
            self._remember(record)
        return record

    def conversation_delta(self, record: TaskRecord) -> ConversationDelta:
        """What the next commit writes of the conversation: the messages added since the last
        load or commit, or (after a compaction, or for a record this store has not seen) the
        whole conversation, with ``conversation_epoch`` bumped."""
        messages = record.conversation.messages
        stored = self._stored.get(record.task_id)
        appended = (
            stored is not None
            and len(messages) >= len(stored)
            and all(map(operator.is_, messages, stored))  # C-speed: no Python loop per message
        )
        if not appended:
            record.conversation_epoch += 1
        fresh = messages[len(stored) :] if appended and stored is not None else messages
        encoded = [m.model_dump_json() for m in fresh]
        return ConversationDelta(
            rewrite=not appended, messages=encoded, size=sum(len(e) for e in encoded)
        )

    def _remember(self, record: TaskRecord) -> None:
        """The stored conversation is now the record's (kept by identity of its messages)."""
        self._stored.pop(record.task_id, None)
        if record.terminal:
            return
        self._stored[record.task_id] = list(record.conversation.messages)
        while len(self._stored) > STORED_CONVERSATIONS_KEPT:
            self._stored.popitem(last=False)

    def forget_kept(self) -> None:
        """Drop every kept record (Redis lost its data: none of them is current any more)."""
        self._kept.clear()
        self._kept_bytes = 0

    def drop_kept(self, task_ids: Iterable[str]) -> None:
        """Drop the kept records of tasks this store's owner no longer holds (lease lost, or
        ended elsewhere): nothing it writes of them any more keeps them current."""
        for task_id in task_ids:
            self._take(task_id)

    def take_kept(self, task_id: str) -> TaskRecord | None:
        """The record kept from this store's last write of the task, unchecked; it is the
        caller's now. It may be stale if another coordinator committed since: commit it (the
        compare-and-set refuses a stale version, or another task of that id) or confirm it with
        :meth:`is_current`."""
        return self._take(task_id)

    def peek_kept(self, task_id: str) -> TaskRecord | None:
        """The kept record of a task, left kept (read it, do not change it)."""
        kept = self._kept.get(task_id)
        return kept[0] if kept is not None else None

    async def is_current(self, record: TaskRecord) -> bool:
        """Whether ``record`` is still the stored one: its version, of the same task (its
        ``created_at``: a task of that id created anew may reach the same version)."""
        task_id = record.task_id
        key = keys.task_key(task_id, self.partition(task_id))
        return _confirms(record, await self.redis.hmget(key, _IDENTITY))

    def _take(self, task_id: str) -> TaskRecord | None:
        kept = self._kept.pop(task_id, None)
        if kept is None:
            return None
        self._kept_bytes -= kept[1]
        return kept[0]

    def _keep(self, record: TaskRecord, size: int) -> None:
        if record.terminal or size > self.record_cache_bytes:
            return
        self._kept[record.task_id] = (record, size)
        self._kept_bytes += size
        while self._kept_bytes > self.record_cache_bytes:
            _task_id, (_record, evicted) = self._kept.popitem(last=False)
            self._kept_bytes -= evicted

    async def create(
        self,
        record: TaskRecord,
        ack: tuple[str, str, str] | None = None,
        lease: tuple[str, int] | None = None,
    ) -> CreateOutcome:
        """Persist a new task (and acknowledge its intake entry) unless it already exists;
        with ``lease`` (owner, TTL in ms), a task created is leased to that owner in the same
        script when nobody holds its lease (as :meth:`acquire_lease`, one round trip less)."""
        idem = record.spec.idempotency_key or ""
        stream, group, entry_id = ack or ("", "", "")
        owner, ttl_ms = lease or ("", 0)
        state = record.model_dump_json()
        p = self.partition(record.task_id)
        created, task_id, *leased = await self._create(
            keys=[
                keys.task_key(record.task_id, p),
                keys.idempotency_key(idem or "-", p),
                keys.task_index_key(p),
                keys.deadlines_key(p),
                keys.status_counts_key(p),
                keys.lease_key(record.task_id, p),
                stream or keys.intake_stream(p),  # the acknowledged stream: in KEYS, one slot
            ],
            args=[
                idem,
                record.task_id,
                state,
                record.status.value,
                keys.idempotency_ttl_s,
                f"{record.created_at:.6f}",
                entry_id,
                "7" if stream else "",  # KEYS[7] (the stream is in KEYS)
                group,
                owner,
                ttl_ms,
            ],
        )
        code = int(created)
        outcome = CreateOutcome(
            created=code == 1,
            task_id=_text(task_id),
            conflict=code == 2,
            leased=bool(leased and int(leased[0])),
            redelivered=code == 4,
        )
        if outcome.created:
            self._take(record.task_id)
            self._keep(record, len(state))
        return outcome

    async def commit(
        self,
        record: TaskRecord,
        effects: Effects,
        ack: tuple[str, str, str] | None = None,
        dispatches: Sequence[OutboxEntry] = (),
        delta: ConversationDelta | None = None,
    ) -> None:
        """Write ``record`` (version + 1) with its effects and append ``dispatches`` to the
        outbox, atomically, with the conversation's new messages (``delta``, else
        :meth:`conversation_delta`).
        A terminal record's lease is left to expire by its TTL (it guards nothing once the
        task ended, and whoever held it stops renewing it): no command for it.

        Raises CommitConflictError when another coordinator committed first.
        """
        pending = self.prepare(record, effects, ack, dispatches, delta=delta)
        await self.commit_prepared(pending)

    def prepare(
        self,
        record: TaskRecord,
        effects: Effects,
        ack: tuple[str, str, str] | None = None,
        dispatches: Sequence[OutboxEntry] = (),
        *,
        delta: ConversationDelta | None = None,
        create: tuple[str, int] | None = None,
        delete_now: bool = False,
    ) -> PendingCommit:
        """The commit of :meth:`commit`, encoded and not sent yet (``record`` is at its new
        version from now on); send it with :meth:`commit_prepared` or :meth:`commit_many`.

        With ``create`` (lease owner, TTL in ms), ``record`` is a new task's at version 0 and
        the commit creates it as well (its first write): send it with :meth:`create_started`.
        Its id may be a live task's (a resubmission, answered ``duplicate`` by the script), so
        nothing this store keeps of that id (record, spec, stored conversation) is touched
        until the script answers that it created the task.

        An observation ``ack`` names is deleted after the commit is written, with others
        (:meth:`delete_applied`); with ``delete_now`` by the commit's script itself: one
        applied a second time (claimed before its deletion) would not be a duplicate the
        fences ignore (an outage report: the dispatch it holds keeps its fence).

        With ``create``, the new record keeps the id of the intake entry ``ack`` names (field
        ``entry``): that entry delivered again finds its own task, not a duplicate
        (:meth:`ack_after`).
        """
        stream, group, entry_id = ack or ("", "", "")
        expected = str(record.version)
        stored = self._stored.get(record.task_id) if create is None else None
        delta = delta or self.conversation_delta(record)
        spec_json: tuple[TaskSpec, bytes] | None = None
        if create is None:
            self._take(record.task_id)
        record.version += 1
        if create is None:
            state = self._state_json(record)
        else:
            spec_json = (record.spec, record.spec.__pydantic_serializer__.to_json(record.spec))
            state = self._state_json(record, spec_json)
        extra = self._extra(record, effects)
        queued = self._inline_messages(record.task_id, dispatches)
        if queued is None:
            extra["outbox"] = [d.head() for d in dispatches]
            payloads: list[str | bytes] = [d.payload for d in dispatches]
        else:
            extra["outbox"] = [[] for _ in dispatches]
            payloads = [message for _queue, message in queued]
        extra["conversation"] = {"rewrite": delta.rewrite, "count": len(delta.messages)}
        p = self.partition(record.task_id)
        shared = self._partition_keys(p)
        observation = stream == shared[8]  # deleted once written, with others (delete_applied)
        extra["delete_entry"] = observation
        if observation and delete_now:  # deleted by the script itself
            extra["delete_now"] = True
            extra["ack_deleted"] = self.acknowledge_deleted  # and acknowledged (Redis < 7.0.4)
        # One slot: a child's id is ``{parent}.{n}``, so the children it submits, the parent a
        # finished child tells and the children it cancels are all in this task's partition.
        task_id = record.task_id
        commit_keys = [
            keys.task_key(task_id, p),
            keys.journal_stream(task_id, p),
            *shared[:7],
            keys.conversation_key(task_id, p),
            *shared[7:10],
            keys.lease_key(task_id, p),
            shared[10],
        ]
        if create is not None:
            idem = record.spec.idempotency_key or ""
            extra["create"] = {
                "idem": idem,
                "idem_ttl": keys.idempotency_ttl_s,
                "created_at": f"{record.created_at:.6f}",
                "owner": create[0],
                "lease_ms": create[1],
                "entry": entry_id,
            }
            commit_keys += [keys.idempotency_key(idem or "-", p), keys.task_index_key(p)]
        if queued is not None:  # each dispatch's queue in KEYS (never a cluster: the broker)
            extra["inline"] = list(range(len(commit_keys) + 1, len(commit_keys) + len(queued) + 1))
            commit_keys += [queue for queue, _message in queued]
        args: list[str | bytes] = [
            expected,
            str(record.version),
            state,
            record.status.value,
            entry_id,
            _key_index(commit_keys, stream),
            group,
            orjson.dumps(extra),
            *payloads,
            *delta.messages,
        ]
        return PendingCommit(
            record,
            effects,
            commit_keys,
            args,
            len(state) + delta.size,
            stored,
            dispatches,
            spec_json,
            entry_id if observation and not delete_now else "",
            inline=queued is not None,
        )

    def _inline_messages(
        self, task_id: str, dispatches: Sequence[OutboxEntry]
    ) -> list[tuple[str, bytes]] | None:
        """The dispatches' queues and messages for the script to push (:attr:`inline`); None
        for the outbox: no dispatch, no inline transport, or one it cannot lay out (logged: the
        relay's send of it then says what is wrong, or sends it)."""
        if not dispatches or self.inline is None:
            return None
        try:
            return self.inline(dispatches)
        except Exception as exc:
            log.warning(
                "dispatch.inline_failed",
                extra={"task_id": task_id, "error": f"{type(exc).__name__}: {exc}"[:300]},
            )
            return None

    @staticmethod
    def ack_after(pending: PendingCommit) -> PendingCommit:
        """A create prepared (``create``, with ``ack``) whose script does not acknowledge its
        intake entry: :meth:`create_started_many` does, with the others of its pipeline, in
        one ``XACK`` once the scripts answered. Only for an entry that names its task's id:
        delivered again (that ``XACK`` not made), it finds the task it created (answered
        ``redelivered``, the record's ``entry``) or its key's (a duplicate, told then); an id
        drawn by the coordinator would be drawn anew, a second task."""
        stream, group, entry_id = pending.args[5], pending.args[6], pending.args[4]
        if not entry_id:
            return pending
        index = int(stream)  # the stream's place in KEYS, 1-based (ARGV[6])
        acked = (pending.keys[index - 1], str(group), str(entry_id))
        args = [*pending.args[:4], "", *pending.args[5:]]
        return replace(pending, args=args, ack_after=acked)

    async def commit_prepared(self, pending: PendingCommit) -> None:
        """Send one prepared commit; CommitConflictError when another coordinator committed
        first."""
        reply = await self._commit(keys=pending.keys, args=pending.args)
        if not self._settle(pending, bool(int(reply[0])), reply):
            record = pending.record
            raise CommitConflictError(
                f"task {record.task_id} changed since version {record.version}"
            )

    async def create_started(self, pending: PendingCommit) -> CreateOutcome | None:
        """Create a new task and commit its start in one script (prepared with ``create``): what
        :meth:`create` then :meth:`commit` write, less what the start would overwrite (the
        record at version 0, its deadline, its ``pending`` count) and the start's read of it.

        None when nothing was written because another owner holds the new task's lease
        (create it with :meth:`create`); else as :meth:`create` answers, ``started`` when the
        task was created (the intake entry is acknowledged either way, by the script unless
        prepared with ``ack_after``; ``redelivered`` when that entry created the task already)."""
        reply = await self._commit(keys=pending.keys, args=pending.args)
        return self._created(pending, reply)

    async def create_started_many(
        self, pending: Sequence[PendingCommit]
    ) -> list[CreateOutcome | RedisError | None]:
        """:meth:`create_started` for several new tasks, their scripts in one pipeline, one round
        trip (not a transaction: each script is atomic on its own and runs in the order given,
        so a later one sees what an earlier one created: a second submission of an id or a key
        is a duplicate as when sent apart).

        Per commit: as :meth:`create_started` answers, or the error Redis answered for it (one
        Redis had lost the script for is sent again on its own, which loads it). A connection
        lost raises, each script run or not.

        The intake entries of the commits prepared with ``ack_after`` whose script answered
        (created, a duplicate, an alias, the entry delivered again) are acknowledged with one
        ``XACK`` per stream after the pipeline, before this returns: one command per chunk
        instead of one per script. An entry whose script was refused (an error, a conflict,
        a lease held elsewhere) stays pending. That ``XACK`` failing raises as a connection
        lost on the pipeline does: an entry still pending delivered again finds the task it
        created (answered ``redelivered``) or is a duplicate told then, once; an ``XACK`` that
        Redis applied but whose reply was lost leaves its duplicates acknowledged and never
        told, as a pipeline whose reply was lost does.
        """
        pipe = self.redis.pipeline(transaction=False)
        for commit in pending:
            pipe.evalsha(self._commit.sha, len(commit.keys), *commit.keys, *commit.args)
        replies = await pipe.execute(raise_on_error=False)
        outcomes: list[CreateOutcome | RedisError | None] = []
        for commit, reply in zip(pending, replies, strict=True):
            if isinstance(reply, NoScriptError):
                try:
                    outcomes.append(await self.create_started(commit))
                except RedisError as exc:
                    outcomes.append(exc)
            elif isinstance(reply, RedisError):
                outcomes.append(reply)  # nothing of it kept: the record is the intake's alone
            else:
                outcomes.append(self._created(commit, reply))
        done: dict[tuple[str, str], list[str]] = {}
        for commit, outcome in zip(pending, outcomes, strict=True):
            answered = isinstance(outcome, CreateOutcome) and not outcome.conflict
            if commit.ack_after is not None and answered:
                stream, group, entry_id = commit.ack_after
                done.setdefault((stream, group), []).append(entry_id)
        for (stream, group), entry_ids in done.items():
            await self.redis.xack(stream, group, *entry_ids)
        return outcomes

    def _created(self, pending: PendingCommit, reply: Sequence[Any]) -> CreateOutcome | None:
        """What :meth:`create_started`'s script answered: the new task kept, or nothing kept."""
        record = pending.record
        code = int(reply[0])
        if code == 1:
            self._take(record.task_id)  # a stale one of a purged task of that id, if any
            if pending.spec_json is not None and not record.terminal:
                self._cache_spec(record.task_id, pending.spec_json)
            self._settle(pending, True, reply)
            return CreateOutcome(True, record.task_id, leased=True, started=True)
        # Nothing written: the record steps back, and nothing kept of its id (a live task's,
        # for a duplicate) is touched (not ``_settle``, which forgets the stored conversation).
        record.version -= 1
        if code == 3:
            return None
        return CreateOutcome(False, _text(reply[1]), conflict=code == 2, redelivered=code == 4)

    async def commit_many(self, pending: Sequence[PendingCommit]) -> list[bool | RedisError]:
        """Send prepared commits of different tasks in one pipeline, one round trip (not a
        transaction: each commit is its script, atomic on its own, as when sent apart).

        Per commit: True when written, False when another coordinator committed first (or
        Redis had lost the script: commit it again with :meth:`commit`), or the error Redis
        answered for it. A connection lost raises, each commit written or not.
        """
        pipe = self.redis.pipeline(transaction=False)
        for commit in pending:
            pipe.evalsha(self._commit.sha, len(commit.keys), *commit.keys, *commit.args)
        replies = await pipe.execute(raise_on_error=False)
        outcomes: list[bool | RedisError] = []
        for commit, reply in zip(pending, replies, strict=True):
            if isinstance(reply, NoScriptError):
                outcomes.append(self._settle(commit, False))
            elif isinstance(reply, RedisError):
                self._stored.pop(commit.record.task_id, None)
                outcomes.append(reply)
            else:
                outcomes.append(self._settle(commit, bool(int(reply[0])), reply))
        return outcomes

    def _state_json(
        self, record: TaskRecord, spec_json: tuple[TaskSpec, bytes] | None = None
    ) -> bytes:
        """``record.model_dump_json()`` as bytes, byte for byte, with the JSON of its spec (frozen,
        about half of a short task's state) encoded once per task instead of once per commit.
        With ``spec_json`` (a task being created), that JSON is used and the cache left alone."""
        if spec_json is not None:
            kept = spec_json
        else:
            cached = self._specs.pop(record.task_id, None)
            if cached is not None:
                self._specs_bytes -= len(cached[1])
            if cached is None or cached[0] is not record.spec:
                cached = (record.spec, record.spec.__pydantic_serializer__.to_json(record.spec))
            kept = cached
            if not record.terminal:  # a task that ends commits no more: its spec is not kept
                self._cache_spec(record.task_id, kept)
        rest = record.__pydantic_serializer__.to_json(record, exclude={"spec"})
        head = b'{"task_id":' + _JSON_STRING.dump_json(record.task_id)
        if not rest.startswith(head + b","):  # the fields' order changed: encode it whole
            return record.__pydantic_serializer__.to_json(record)
        return b"".join((head, b',"spec":', kept[1], rest[len(head) :]))

    def _cache_spec(self, task_id: str, kept: tuple[TaskSpec, bytes]) -> None:
        """Keep a task's spec and its JSON for its next commits (least recently written out)."""
        old = self._specs.pop(task_id, None)
        if old is not None:
            self._specs_bytes -= len(old[1])
        if len(kept[1]) > self.spec_cache_bytes:
            return
        self._specs[task_id] = kept
        self._specs_bytes += len(kept[1])
        while self._specs_bytes > self.spec_cache_bytes:
            _task_id, (_spec, evicted) = self._specs.popitem(last=False)
            self._specs_bytes -= len(evicted)

    def _settle(self, pending: PendingCommit, written: bool, reply: Sequence[Any] = ()) -> bool:
        """Keep a written record and tell :attr:`dispatched` of its outbox entries (their ids
        are the script's reply's third item); step a refused one back to the version it was
        read at."""
        record = pending.record
        if not written:
            record.version -= 1
            if self._stored.get(record.task_id) is pending.stored:  # not a newer commit's
                self._stored.pop(record.task_id, None)
            return False
        self._remember(record)
        self._keep(record, pending.size)
        if pending.applied_entry:
            self._note_applied(self.partition(record.task_id), pending.applied_entry)
        dispatched = None if pending.inline else self.dispatched
        if pending.dispatches and dispatched is not None and len(reply) > 2:
            ids = [_text(i) for i in reply[2]]
            dispatched(
                self.partition(record.task_id), list(zip(ids, pending.dispatches, strict=False))
            )
        return True

    def _extra(self, record: TaskRecord, effects: Effects) -> dict[str, Any]:
        closing = ("review_decided", "review_closed")
        closed = [e["review_id"] for e in effects.events if e.get("event") in closing]
        return {
            "task_id": record.task_id,
            "created_at": f"{record.created_at:.6f}",  # the task's identity with its id
            "terminal": record.status in TERMINAL_STATUSES,
            "deadline": f"{record.next_deadline():.6f}",
            "now": f"{record.updated_at:.6f}",
            "journal_maxlen": self.journal_maxlen,
            "events_maxlen": self.events_maxlen,
            "journal": _journal(effects),
            "events": [_flat(e) for e in effects.events],
            "reviews": [[r.review_id, r.model_dump_json()] for r in effects.reviews],
            "closed_reviews": closed,
            "dead_letters": [_flat(d) for d in effects.dead_letters],
            "children": [
                _flat({"task_id": c.task_id, "task": c.task, "at": f"{record.updated_at:.3f}"})
                for c in effects.children
            ],
            "child_results": [_flat(encode_entry(r)) for r in effects.child_results],
            "cancels": [_flat(c) for c in effects.cancels],
            "intake_maxlen": keys.intake_maxlen,
            "observations_maxlen": keys.observations_maxlen,
            "control_maxlen": keys.control_maxlen,
        }

    async def active_task_ids(self) -> list[str]:
        """Tasks that have not reached a terminal state (every partition): the deadline
        indexes' members."""
        pipe = self.redis.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.zrange(keys.deadlines_key(p), 0, -1)
        return sorted(_text(m) for members in await pipe.execute() for m in members)

    async def due_task_ids(
        self, now: float, limit: int, partitions: Iterable[int] | None = None
    ) -> list[str]:
        """Tasks whose next deadline has passed (observation, review or start), oldest first,
        merged over ``partitions`` (None: every partition)."""
        pipe = self.redis.pipeline(transaction=False)
        for p in range(self.partitions) if partitions is None else partitions:
            pipe.zrangebyscore(
                keys.deadlines_key(p), "-inf", now, start=0, num=limit, withscores=True
            )
        due = [(float(s), _text(d)) for rows in await pipe.execute() for d, s in rows]
        return [task_id for _score, task_id in sorted(due)[:limit]]

    async def open_reviews(self) -> list[ReviewItem]:
        """Escalations waiting for a decision, oldest first (every partition)."""
        pipe = self.redis.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.hgetall(keys.open_reviews_key(p))
        items = [v for rows in await pipe.execute() for v in rows.values()]
        reviews = [ReviewItem.model_validate_json(v) for v in items]
        return sorted(reviews, key=lambda r: r.created_at)

    async def still_active(self, task_ids: list[str]) -> list[bool]:
        """Whether each task is still active (not completed, failed or aborted): in the
        deadline index, which holds a task from its creation to its end."""
        if not task_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.zscore(keys.deadlines_key(self.partition(task_id)), task_id)
        return [score is not None for score in await pipe.execute()]

    async def purge_finished(
        self, finished_before: float, batch: int = 500, partitions: Iterable[int] | None = None
    ) -> int:
        """Delete tasks (of ``partitions``; None: every one) that finished before
        ``finished_before``; returns how many.

        Candidates come from the index of finished tasks by end time, so tasks still running
        never block the purge.
        """
        purged = 0
        for p in range(self.partitions) if partitions is None else partitions:
            candidates = await self.redis.zrangebyscore(
                keys.finished_tasks_key(p), "-inf", finished_before, start=0, num=batch
            )
            for raw in candidates:
                task_id = _text(raw)
                purged += int(
                    await self._purge(
                        keys=[
                            keys.task_key(task_id, p),
                            keys.journal_stream(task_id, p),
                            keys.journal_sequence_key(task_id, p),
                            keys.task_index_key(p),
                            keys.status_counts_key(p),
                            keys.finished_tasks_key(p),
                            keys.conversation_key(task_id, p),
                        ],
                        args=[f"{finished_before:.6f}", task_id],
                    )
                )
        return purged

    # -- entries that change no task ------------------------------------------------------

    async def event(self, fields: Mapping[str, str]) -> None:
        """A lifecycle event that belongs to no commit (a state loss, a refused observation)."""
        entry: dict[Any, Any] = {**fields, "at": fields.get("at") or f"{time.time():.3f}"}
        await self.redis.xadd(
            keys.events_stream(self.partition(fields.get("task_id", ""))),
            entry,
            maxlen=self.events_maxlen,
            approximate=True,
        )

    async def reject_submission(
        self,
        entry_id: str,
        task_id: str,
        task_text: str,
        error: str,
        event: str = "rejected",
        *,
        partition: int = 0,
    ) -> None:
        """An intake entry (of ``partition``'s intake) that makes no task: on the partition's
        rejected stream with the reason, an event, and acknowledged, together."""
        p = partition
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            keys.rejected_stream(p),
            {"task_id": task_id, "entry_id": entry_id, "error": error, "task": task_text[:4096]},
            maxlen=keys.rejected_maxlen, approximate=True,
        )  # fmt: skip
        pipe.xadd(
            keys.events_stream(p),
            {"task_id": task_id, "event": event, "error": error[:2000], "at": f"{time.time():.3f}"},
            maxlen=self.events_maxlen, approximate=True,
        )  # fmt: skip
        pipe.xack(keys.intake_stream(p), keys.coordinator_group, entry_id)
        await pipe.execute()

    async def dead_letter_entry(
        self,
        stream: str,
        entry_id: str,
        fields: Mapping[str, str],
        error: str,
        *,
        partition: int = 0,
    ) -> None:
        """A stream entry (of ``partition``) no coordinator can apply: kept on the partition's
        dead-letter stream with its raw fields and the reason, and acknowledged, together."""
        raw: dict[Any, Any] = {f"raw_{k}": v[:4096] for k, v in fields.items()}
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            keys.dead_letter_stream(partition),
            {**raw, "stream": stream, "entry_id": entry_id, "error": error[:2000]},
            maxlen=keys.dead_letter_maxlen, approximate=True,
        )  # fmt: skip
        pipe.xack(stream, keys.coordinator_group, entry_id)
        await pipe.execute()

    async def refuse_control(
        self, entry_id: str, task_id: str, error: str, *, partition: int = 0
    ) -> None:
        """A control entry (of ``partition``) that cannot be applied: a ``control_rejected``
        event naming the entry (the CLI waits for it), and acknowledged, together."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            keys.events_stream(partition),
            {"task_id": task_id, "event": "control_rejected", "entry_id": entry_id,
             "error": error[:2000], "at": f"{time.time():.3f}"},
            maxlen=self.events_maxlen, approximate=True,
        )  # fmt: skip
        pipe.xack(keys.control_stream(partition), keys.coordinator_group, entry_id)
        await pipe.execute()

    async def drop_observation(self, entry_id: str, *, partition: int = 0) -> None:
        """A stale or duplicate answer: deleted (nothing keeps its output); its delivery is
        dropped by the next claim, as an applied one's (acknowledged too on a Redis before
        7.0.4: :attr:`acknowledge_deleted`, one round trip)."""
        stream = keys.observations_stream(partition)
        if not self.acknowledge_deleted:
            await self.redis.xdel(stream, entry_id)
            return
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(stream, keys.coordinator_group, entry_id)
        pipe.xdel(stream, entry_id)
        await pipe.execute()

    def _note_applied(self, partition: int, entry_id: str) -> None:
        self._applied.setdefault(partition, []).append(entry_id)
        if self._applied_since is None:
            self._applied_since = time.monotonic()

    def applied_due_in(self, older_than_s: float) -> float | None:
        """How long until :meth:`delete_applied` with ``older_than_s`` deletes the
        observations applied (seconds, 0 when due now); None when none waits."""
        since = self._applied_since
        if since is None:
            return None
        return max(since + older_than_s - time.monotonic(), 0.0)

    async def delete_applied(self, older_than_s: float = 0.0) -> int:
        """Delete the observations applied since the last call, once the oldest of them was
        noted ``older_than_s`` ago (0: at once): one ``XDEL`` per partition (with its ``XACK``
        on a Redis before 7.0.4, :attr:`acknowledge_deleted`), one round trip; how many were
        deleted. Their deliveries stay pending until the next claim drops them, as an entry
        deleted in the commit's script did. A failure keeps them for the next call and raises.
        """
        since = self._applied_since
        if since is None or time.monotonic() - since < older_than_s:
            return 0
        taken, self._applied, self._applied_since = self._applied, {}, None
        pipe = self.redis.pipeline(transaction=False)
        for partition, ids in taken.items():
            stream = keys.observations_stream(partition)
            if self.acknowledge_deleted:
                pipe.xack(stream, keys.coordinator_group, *ids)
            pipe.xdel(stream, *ids)
        try:
            await pipe.execute()
        except BaseException:
            for partition, ids in taken.items():  # in front of those noted meanwhile
                self._applied[partition] = ids + self._applied.get(partition, [])
            self._applied_since = since
            raise
        return sum(len(ids) for ids in taken.values())

    async def forget_heartbeats(self, older_than: float) -> None:
        """Heartbeat scores (running or answered) older than ``older_than`` (epoch seconds)."""
        await self.redis.zremrangebyscore(keys.heartbeats_key, -older_than, older_than)

    async def acquire_lease(self, task_id: str, owner: str, ttl_ms: int) -> bool:
        """Take the task's lease if nobody holds it, or renew it if ``owner`` already does
        (e.g. taken by a create whose reply was lost, its retry answering "duplicate")."""
        key = keys.lease_key(task_id, self.partition(task_id))
        return bool(int(await self._acquire(keys=[key], args=[owner, ttl_ms])))

    async def renew_leases(
        self, task_ids: Sequence[str], owner: str, ttl_ms: int, release: Sequence[str] = ()
    ) -> list[bool]:
        """:meth:`renew_lease` for each of ``task_ids`` and :meth:`release_lease` for each of
        ``release``, in one pipeline (not a transaction: each renewal and release is atomic
        on its own, as apart); whether each renewal held."""
        if not task_ids and not release:
            return []
        lease = self._lease_key
        calls = [(self._renew, lease(t), [owner, str(ttl_ms)]) for t in task_ids]
        calls += [(self._release, lease(t), [owner]) for t in release]
        pipe = self.redis.pipeline(transaction=False)
        for script, key, args in calls:  # EVALSHA alone: no SCRIPT EXISTS round trip first
            pipe.evalsha(script.sha, 1, key, *args)
        replies = await pipe.execute(raise_on_error=False)
        for index, ((script, key, args), reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(reply, NoScriptError):  # Redis lost the script: it did nothing
                replies[index] = await script(keys=[key], args=args)  # loads it
            elif isinstance(reply, Exception):
                raise reply
        return [bool(int(r)) for r in replies[: len(task_ids)]]

    async def renew_held(
        self, task_ids: Sequence[str], owner: str, ttl_ms: int
    ) -> tuple[list[str], list[str]]:
        """The periodic renewal of the leases ``owner`` holds, batched per partition: one
        script call per partition (and per :data:`RENEW_HELD_CHUNK` tasks) reads which tasks
        are still active (in the deadline index: ``ZMSCORE``) and who holds their leases
        (``MGET``), renews the leases of those ``owner`` still holds and releases those of the
        tasks that have ended.
        Returns the tasks whose lease was lost (held by another owner, or expired) and the
        tasks that have ended; each call is atomic on its own, the calls together are not a
        transaction (as :meth:`renew_leases`)."""
        by_partition: dict[int, list[str]] = {}
        for task_id in task_ids:
            by_partition.setdefault(self.partition(task_id), []).append(task_id)
        calls: list[tuple[list[str], list[str], list[str]]] = []
        for p, ids in by_partition.items():
            for start in range(0, len(ids), RENEW_HELD_CHUNK):
                chunk = ids[start : start + RENEW_HELD_CHUNK]
                leases = [keys.lease_key(t, p) for t in chunk]
                calls.append((chunk, [keys.deadlines_key(p), *leases], [owner, str(ttl_ms)]))
        if not calls:
            return [], []
        script = self._renew_held
        pipe = self.redis.pipeline(transaction=False)
        for chunk, script_keys, args in calls:  # EVALSHA alone: no SCRIPT EXISTS round trip
            pipe.evalsha(script.sha, len(script_keys), *script_keys, *args, *chunk)
        replies = await pipe.execute(raise_on_error=False)
        lost: list[str] = []
        ended: list[str] = []
        for (chunk, script_keys, args), reply in zip(calls, replies, strict=True):
            outcomes = reply
            if isinstance(reply, NoScriptError):  # Redis lost the script: it did nothing
                outcomes = await script(keys=script_keys, args=[*args, *chunk])  # loads it
            elif isinstance(reply, Exception):
                raise reply
            for task_id, outcome in zip(chunk, outcomes, strict=True):
                if int(outcome) == 0:
                    lost.append(task_id)
                elif int(outcome) == 2:
                    ended.append(task_id)
        return lost, ended

    async def renew_lease(self, task_id: str, owner: str, ttl_ms: int) -> bool:
        """Extend a lease we hold; False when it was lost."""
        return bool(int(await self._renew(keys=[self._lease_key(task_id)], args=[owner, ttl_ms])))

    async def release_lease(self, task_id: str, owner: str) -> None:
        """Give a lease back (only if we still hold it)."""
        await self._release(keys=[self._lease_key(task_id)], args=[owner])

    def _lease_key(self, task_id: str) -> str:
        return keys.lease_key(task_id, self.partition(task_id))


def _journal(effects: Effects) -> dict[str, Any]:
    """The commit's journal records as one stream entry (``id`` "" for none)."""
    if not effects.journal:
        return {"id": "", "fields": []}
    records = [(e.sequence, e.model_dump_json()) for e in effects.journal]
    entry_id, fields = journal_stream_entry(records)
    return {"id": entry_id, "fields": fields}


def _flat(fields: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in fields.items():
        out.extend((key, value))
    return out


def _key_index(script_keys: list[str], stream: str) -> str:
    """Which of a script's KEYS (1-based, as Lua counts) is the acknowledged ``stream``: a script
    names every key it touches in KEYS (Redis Cluster routes and checks them). "" for none."""
    if not stream:
        return ""
    try:
        return str(script_keys.index(stream) + 1)
    except ValueError:
        raise ValueError(
            f"{stream!r} is not a stream of the commit's partition ({script_keys[0]!r}): an entry "
            "is acknowledged by the commit of a task of its own partition"
        ) from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_IDENTITY: Final = ("version", "created_at")
"""The fields that confirm a kept record is the stored one (``HMGET``, in this order)."""


def _confirms(record: TaskRecord, stored: Sequence[Any]) -> bool:
    """Whether the stored ``version`` and ``created_at`` (:data:`_IDENTITY`) are ``record``'s:
    its version, of the same task (a task of that id created anew may reach that version). A
    task stored without ``created_at`` (created before it was stored) is confirmed by its
    version alone, until its next commit writes it."""
    version, created_at = stored
    return (
        version is not None
        and _text(version) == str(record.version)
        and (created_at is None or _text(created_at) == f"{record.created_at:.6f}")
    )
