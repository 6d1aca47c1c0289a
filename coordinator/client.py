"""The Python client upstream pipelines use: submit, wait, status, journal, reviews.

Synchronous on purpose (pipelines are usually plain scripts); it only talks to Redis::

    client = OrgaClient("redis://127.0.0.1:6379/0")
    task_id = client.submit(Path("task.yaml"))
    result = client.wait(task_id, timeout_s=600)
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, cast

import redis
from pydantic import ValidationError
from redis.exceptions import AskError, ClusterError, ExecAbortError, TryAgainError

from coordinator.state import (
    TERMINAL_STATUSES,
    AwaitKind,
    ReviewItem,
    TaskRecord,
    check_reviewer,
)
from coordinator.watch import Cursor, TaskEvent, TaskWatch
from shared import keys
from shared.approval import CALL_DECISIONS, DecisionError, DecisionRequest, check_arguments
from shared.errors import ConfigError, OrgaError
from shared.events import JournalEntry
from shared.journal import journal_records
from shared.partitions import check_partitions
from shared.task_spec import (
    TaskSpec,
    TaskSpecError,
    as_task_text,
    check_task_id,
    decode_task_text,
    load_task_file,
)
from shared.tokens import TokenEntry, token_entry

__all__ = [
    "WATCH_SOCKET_TIMEOUT_S",
    "OrgaClient",
    "ReviewDecidedError",
    "TaskFinishedError",
    "TaskNotFoundError",
    "TaskRejectedError",
    "WaitTimeoutError",
    "critic_status",
    "task_text",
    "watch_block_ms",
]

SLOT_MOVING_ERRORS = (AskError, TryAgainError, ClusterError, ExecAbortError)
"""What redis-py's cluster client raises for a ``MULTI`` of reads while a Redis Cluster moves
the slot of its keys (a live reshard): ``ASK``/``MOVED`` or ``TRYAGAIN`` on a queued command,
the transaction then discarded (``EXECABORT``), redirects run out. Nothing ran: the reads are
made again (:meth:`OrgaClient._read_together`)."""
SLOT_MOVING_PATIENCE_S = 30.0
"""How long a read waits for a slot being moved (a slot moves in milliseconds to seconds)."""


class TaskNotFoundError(OrgaError, LookupError):
    """No task with that id (yet): it may still be in the intake stream."""


class TaskRejectedError(OrgaError):
    """The coordinator rejected the submission; the message holds the validation error."""


class WaitTimeoutError(OrgaError, TimeoutError):
    """The task did not finish within the time given."""


class TaskFinishedError(OrgaError):
    """The task already ended: it can no longer be changed (cancelled)."""


class ReviewDecidedError(OrgaError):
    """Another decision (an operator's, or the default at the deadline) was taken first."""


_CLAIM = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return {0, ''} end
local claimed = redis.call('GET', KEYS[2])
if claimed then return {1, claimed} end
local fields = {'action', 'review', 'task_id', ARGV[4], 'review_id', ARGV[1],
  'decision', ARGV[5], 'hint', ARGV[6], 'by', ARGV[7]}
if ARGV[8] ~= '' then
  table.insert(fields, 'arguments')
  table.insert(fields, ARGV[8])
end
local entry = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
local claim = cjson.encode({by = ARGV[7], decision = ARGV[5], entry_id = entry})
redis.call('SET', KEYS[2], claim, 'EX', ARGV[3])
return {2, entry}
"""
"""Send a review's decision only when the review is open and no decision was sent for it yet:
the claim and the control entry are written together, so two operators never both send one.
An edit of a held call carries its new arguments (``arguments``, JSON) in the same entry."""


@dataclass
class OrgaClient:
    """Submits tasks and reads their state, journal and reviews from Redis."""

    redis_url: str
    poll_interval_s: float = 0.05
    partitions: int | None = None
    """``ORGA_PARTITIONS`` of the deployment: refused (ConfigError naming both) when Redis
    holds another, stored when none is; None: the stored count (1 when none is stored yet)."""

    client: redis.Redis | None = field(default=None, repr=False)
    """The state's client, ``decode_responses`` on (``orga.redis_client.RedisClients.sync``: a
    RedisCluster on a cluster); None: a standalone Redis at ``redis_url``."""

    def __post_init__(self) -> None:
        self.redis = self.client or redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.watcher = self.client or redis.Redis.from_url(
            self.redis_url, decode_responses=True, socket_timeout=WATCH_SOCKET_TIMEOUT_S
        )
        """The connections that block in ``XREAD`` (:meth:`watch`): their socket timeout is
        longer than a block (a cluster's client, built by the assembly, serves both)."""
        self._count: int | None = None

    @property
    def partition_count(self) -> int:
        """The deployment's partition count (read from Redis once)."""
        if self._count is None:
            if self.partitions is None:
                stored = self.redis.get(keys.partitions_key)
                if stored is None:  # no process started yet: asked again next time
                    return 1
                self._count = int(cast("str", stored))
            else:
                self.redis.set(keys.partitions_key, self.partitions, nx=True)
                stored = cast("str | None", self.redis.get(keys.partitions_key))
                self._count = check_partitions(stored, self.partitions, "client")
        return self._count

    def partition(self, task_id: str) -> int:
        """The partition of a task (of its root id)."""
        return keys.partition_of(task_id, self.partition_count)

    _p = partition

    def _task_key(self, task_id: str) -> str:
        return keys.task_key(task_id, self._p(task_id))

    # -- typed access (redis-py's sync stubs are unions of sync and async results) ---------

    def _hget(self, key: str, field: str) -> str | None:
        return cast("str | None", self.redis.hget(key, field))

    def _rows(self, rows: Any) -> list[tuple[str, dict[str, str]]]:
        return [(str(i), dict(f or {})) for i, f in cast("list[tuple[Any, Any]]", rows or [])]

    # -- submitting -----------------------------------------------------------------------

    def submit(
        self, task: TaskSpec | dict[str, Any] | str | bytes | Path, task_id: str | None = None
    ) -> str:
        """Put a task on the intake stream and return its id (validated by the coordinator;
        text that is not UTF-8 is refused here, TaskSpecError naming the byte)."""
        text = task_text(task)
        task_id = self._task_id(text, task_id)
        self.redis.xadd(
            keys.intake_stream(self._p(task_id)),
            {"task_id": task_id, "task": text, "at": f"{time.time():.3f}"},
            maxlen=keys.intake_maxlen,
            approximate=True,
        )
        return task_id

    def _task_id(self, text: str, task_id: str | None) -> str:
        """The id a submission goes with. With several partitions and an idempotency key, the
        id is in the key's partition (:func:`shared.keys.idempotency_partition`): drawn there
        when none is given, refused when one given is elsewhere; so the key is checked and the
        task created by one script in one slot, whichever submission comes first."""
        count = self.partition_count
        key = _idempotency_key(text) if count > 1 else None
        if task_id is not None:
            task_id = check_task_id(task_id)
            if key is not None and self._p(task_id) != keys.idempotency_partition(key, count):
                raise ConfigError(
                    f"task id {task_id!r} is in partition {self._p(task_id)} of {count} but its "
                    f"idempotency key {key!r} in partition "
                    f"{keys.idempotency_partition(key, count)}: the key could not be honoured "
                    "in one step; submit without a task id (one is drawn in the key's "
                    "partition) or without the key"
                )
            return task_id
        while True:
            drawn = uuid.uuid4().hex
            if key is None or self._p(drawn) == keys.idempotency_partition(key, count):
                return drawn

    def resolve(self, task_id: str) -> str:
        """The task an id stands for: a resubmission with a used idempotency key is an alias."""
        alias = self._hget(self._task_key(task_id), "alias_of")
        return str(alias) if alias else task_id

    def existing(self, task_id: str) -> str:
        """The id of the stored task ``task_id`` stands for; TaskNotFoundError (or
        TaskRejectedError) when there is none."""
        real = self.resolve(task_id)
        if not self.redis.hexists(self._task_key(real), "state"):
            self._not_found(task_id)
        return real

    def _not_found(self, task_id: str) -> NoReturn:
        rejection = self.rejection(task_id)
        if rejection is not None:
            raise TaskRejectedError(f"task {task_id} was rejected: {rejection}")
        raise TaskNotFoundError(
            f"no task {task_id!r} (unknown, purged after its retention, or not accepted yet); "
            "`orga status` lists the recent tasks"
        )

    # -- reading --------------------------------------------------------------------------

    def record(self, task_id: str) -> TaskRecord:
        """The task's full state; TaskNotFoundError if it was rejected or not yet accepted."""
        real = self.resolve(task_id)

        def reads(pipe: Any) -> None:  # the state and its conversation, together
            pipe.hget(self._task_key(real), "state")
            pipe.lrange(keys.conversation_key(real, self._p(real)), 0, -1)

        state, stored = self._read_together(reads)
        if state is None:
            self._not_found(task_id)
        record = TaskRecord.model_validate_json(str(state))
        record.restore_conversation(stored)
        return record

    def status(self, task_id: str) -> dict[str, Any]:
        """Status, current step, iteration, milestones, usage and, once it failed, the error."""
        record = self.record(task_id)
        step = record.steps[record.current].spec.id if record.steps else None
        return {
            "task_id": record.task_id,
            "status": record.status.value,
            "goal": record.spec.goal,
            "step": step,
            "steps_done": sum(1 for s in record.steps if s.status.value == "completed"),
            "steps_total": len(record.steps),
            "iteration": record.iteration,
            "milestones": list(record.milestones),
            "review_id": record.review.review_id if record.review else None,
            "error": record.error,
            "workspace": record.workspace,
            "usage": record.usage.model_dump(),
            "dispatch": self.dispatch(record),
            "parent": record.spec.delegation.task_id if record.spec.delegation else None,
            "children": self.children(record),
            "critic": critic_status(record),
        }

    def children(self, record: TaskRecord, depth: int = 0) -> list[dict[str, Any]]:
        """The sub-agent tree under ``record``: each child's status and progress, and its own
        children (down to ``MAX_TREE_DEPTH`` levels). A child the intake has not stored yet
        shows the status its parent knows (``submitted``, or ``rejected``)."""
        rows = []
        for ref in record.children:
            row: dict[str, Any] = {
                "task_id": ref.task_id, "agent": ref.agent, "goal": ref.goal,
                "call_id": ref.call_id, "step_of_parent": ref.step_id, "status": ref.status,
            }  # fmt: skip
            state = self._hget(self._task_key(ref.task_id), "state")
            if state is not None:
                child = TaskRecord.model_validate_json(state)
                row.update(_progress(child))
                if depth + 1 < MAX_TREE_DEPTH:
                    row["children"] = self.children(child, depth + 1)
            rows.append(row)
        return rows

    def tree(self, task_id: str) -> dict[str, Any]:
        """A task with its sub-agent tree (the task page of the inbox)."""
        record = self.record(task_id)
        return {"task_id": record.task_id, **_progress(record), "children": self.children(record)}

    def dispatch(self, record: TaskRecord) -> dict[str, Any] | None:
        """What the task waits on: its queue, and how many of its calls are queued (not
        started), running (heartbeating) or answered (observation not yet applied); and
        ``waiting`` when it waits on its provider or policy engine (a model call held in a
        retry wait, or a dispatch the task holds through an outage)."""
        awaiting = record.awaiting
        if awaiting is None or record.terminal:
            return None
        ids = awaiting.liveness_ids()
        pipe = self.redis.pipeline(transaction=False)
        if ids:
            pipe.zmscore(keys.heartbeats_key, ids)
        if awaiting.reasoning:
            pipe.get(keys.provider_wait_key(awaiting.fence.liveness_id()))
        replies: list[Any] = pipe.execute() if ids or awaiting.reasoning else []
        scores: list[float | None] = replies[0] if ids else []
        counts = {"queued": 0, "running": 0, "answered": 0}
        for score in scores:
            counts["queued" if score is None else "running" if score > 0 else "answered"] += 1
        found: dict[str, Any] = {"kind": awaiting.kind.value, "queue": awaiting.queue, **counts}
        held = replies[-1] if awaiting.reasoning else None
        waiting = _waiting(record, held)
        if waiting is not None:
            found["waiting"] = waiting
        return found

    def load(self, heartbeat_timeout_s: float = 30.0) -> dict[str, Any]:
        """The deployment's work now: messages waiting in each queue, dispatches running
        (a heartbeat younger than ``heartbeat_timeout_s``), and observations not yet applied."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in (keys.reasoning_queue, keys.tools_queue):
            pipe.llen(queue)
        pipe.zcount(keys.heartbeats_key, time.time() - heartbeat_timeout_s, "+inf")
        reasoning, tools, running = cast("list[int]", pipe.execute())
        return {"queued": {keys.reasoning_queue: reasoning, keys.tools_queue: tools},
                "running": running, "partitions": self.partition_holders()}  # fmt: skip

    def partition_holders(self) -> dict[str, Any]:
        """Which coordinator serves which partitions (their leases): ``{"held": {name:
        [partition, ...]}, "unheld": [partition, ...]}``."""
        pipe = self.redis.pipeline(transaction=False)
        for p in range(self.partition_count):
            pipe.get(keys.partition_lease_key(p))
        held: dict[str, list[int]] = {}
        unheld: list[int] = []
        for p, owner in enumerate(cast("list[str | None]", pipe.execute())):
            if owner is None:
                unheld.append(p)
            else:
                held.setdefault(owner, []).append(p)
        return {"held": dict(sorted(held.items())), "unheld": unheld}

    def result(self, task_id: str) -> dict[str, Any]:
        """What the task produced (also for a task that stopped: its completed steps)."""
        return self.record(task_id).result()

    def list_tasks(self, limit: int = 50) -> list[dict[str, Any]]:
        """The most recent tasks, newest first."""
        newest: list[tuple[float, str]] = []
        for p in range(self.partition_count):  # each partition's newest, merged
            rows_p = self.redis.zrevrange(keys.task_index_key(p), 0, limit - 1, withscores=True)
            newest += [(float(s), str(i)) for i, s in cast("list[Any]", rows_p)]
        ids = [task_id for _at, task_id in sorted(newest, reverse=True)[:limit]]
        rows = []
        for task_id in ids:
            status = self._hget(self._task_key(task_id), "status")
            row: dict[str, Any] = {"task_id": task_id, "status": status, "dispatch": None}
            if status not in (None, *(s.value for s in TERMINAL_STATUSES)):
                with contextlib.suppress(TaskNotFoundError, ValueError):
                    row["dispatch"] = self.dispatch(self.record(task_id))
            rows.append(row)
        return rows

    def page_tasks(
        self,
        status: str | None = None,
        since: float | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of tasks, newest first, over every partition: those created at ``since``
        (unix seconds) or later, in ``status`` if given, after ``cursor`` (the one a previous
        page returned); the page and the cursor of the next (None after the last)."""
        before = _page_cursor(cursor)
        rows: list[dict[str, Any]] = []
        while len(rows) < limit:
            batch = self._index_before(before, since, max(limit * 2, 50))
            if not batch:
                return rows, None
            statuses = self._statuses([task_id for _at, task_id in batch])
            for (at, task_id), found in zip(batch, statuses, strict=True):
                before = (at, task_id)
                if found is not None and status in (None, found):
                    rows.append({"task_id": task_id, "status": found, "created_at": at})
                    if len(rows) == limit:
                        break
        return rows, f"{before[0]!r}:{before[1]}"

    def _index_before(
        self, before: tuple[float, str], since: float | None, count: int
    ) -> list[tuple[float, str]]:
        """The newest ``count`` tasks of the partitions' indexes ordered before ``before``
        (creation time, then id, both descending)."""
        low = "-inf" if since is None else since
        merged: list[tuple[float, str]] = []
        for p in range(self.partition_count):
            got = self.redis.zrevrangebyscore(
                keys.task_index_key(p), before[0], low, start=0, num=count, withscores=True
            )
            merged += [(float(at), str(i)) for i, at in cast("list[Any]", got)]
        return sorted((row for row in merged if row < before), reverse=True)[:count]

    def _statuses(self, task_ids: list[str]) -> list[str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hget(self._task_key(task_id), "status")
        return [None if s is None else str(s) for s in pipe.execute()]

    def idempotent_task(self, key: str) -> str | None:
        """The task an idempotency key was first submitted with, while it is remembered."""
        p = keys.idempotency_partition(key, self.partition_count)
        return self._get(keys.idempotency_key(key, p))

    def _get(self, key: str) -> str | None:
        found = cast("str | None", self.redis.get(key))
        return None if found is None else str(found)

    def rejection(self, task_id: str) -> str | None:
        """The validation error of a rejected submission, if it was rejected."""
        rejected = keys.rejected_stream(self._p(task_id))
        for _id, fields in self._rows(self.redis.xrevrange(rejected, count=1000)):
            if fields.get("task_id") == task_id:
                return str(fields.get("error"))
        return None

    def wait(self, task_id: str, timeout_s: float = 600.0) -> dict[str, Any]:
        """Block until the task is completed, failed or aborted, or waits for a review; return
        its result (with ``review_id`` when a review is open). Blocks on the task's streams
        (:meth:`watch`), never polls; WaitTimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        real = self.accepted(task_id, deadline)
        for event in self.watch(real, deadline=deadline):
            if event.kind == "status" and (event.terminal or event.data["review_id"]):
                result = self.record(real).result()
                if event.data["review_id"]:
                    result["review_id"] = event.data["review_id"]
                return result
        raise WaitTimeoutError(f"task {task_id} did not finish within {timeout_s}s")

    def accepted(self, task_id: str, deadline: float | None = None) -> str:
        """The id of the stored task ``task_id`` stands for, once the coordinator accepted it:
        blocks on the partition's lifecycle events until then (TaskRejectedError if it was
        rejected; WaitTimeoutError past ``deadline``, a ``time.monotonic()``)."""
        events = keys.events_stream(self._p(task_id))
        after = self._last_id(events)
        while True:
            with contextlib.suppress(TaskNotFoundError):
                return self.existing(task_id)
            reply = self.watcher.xread({events: after}, block=watch_block_ms(deadline), count=1000)
            for _name, rows in cast("list[Any]", reply or []):
                after = str(rows[-1][0]) if rows else after
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeoutError(f"task {task_id} was not accepted in time")

    def watch(
        self, task_id: str, after: str | None = None, deadline: float | None = None
    ) -> Iterator[TaskEvent]:
        """The task's events after the cursor ``after`` (:mod:`coordinator.watch`), as they
        come, until it ends or ``deadline`` (a ``time.monotonic()``) passes."""
        real = self.existing(task_id)
        watch = TaskWatch(real, self._p(real), Cursor.parse(after))
        watch.events_after = self._last_id(watch.events_stream)
        woke = True
        while True:
            if woke:
                yield from watch.advance(self._read_together(watch.queue_reads))
                if watch.ended:
                    return
            if deadline is not None and time.monotonic() > deadline:
                return
            reply = self.watcher.xread(watch.wake_streams(), block=watch_block_ms(deadline))
            woke = watch.woke(reply) or not reply  # a quiet while: look again anyway

    def _read_together(self, reads: Any) -> list[Any]:
        """The replies of the reads ``reads(pipe)`` queues, in one ``MULTI`` (one slot: one
        task's keys). While a Redis Cluster moves that slot the transaction is refused before
        it runs (:data:`SLOT_MOVING_ERRORS`): it is sent again, every 0.1 s to 1 s, for up to
        :data:`SLOT_MOVING_PATIENCE_S`."""
        deadline = time.monotonic() + SLOT_MOVING_PATIENCE_S
        delay_s = 0.1
        while True:
            pipe = self.redis.pipeline(transaction=True)
            reads(pipe)
            try:
                return list(pipe.execute())
            except SLOT_MOVING_ERRORS:
                if time.monotonic() + delay_s > deadline:
                    raise
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def _last_id(self, stream: str) -> str:
        """The id of a stream's newest entry ("0-0" for an empty one)."""
        rows = self._rows(self.redis.xrevrange(stream, count=1))
        return rows[0][0] if rows else "0-0"

    def journal(
        self, task_id: str, after: int = -1, count: int | None = None
    ) -> list[JournalEntry]:
        """Journal entries with a sequence greater than ``after``; TaskNotFoundError for an
        unknown task."""
        real = self.existing(task_id)
        start = f"0-{after + 2}" if after >= 0 else "-"
        rows = self._rows(
            self.redis.xrange(
                keys.journal_stream(real, self._p(real)), min=start, max="+", count=count
            )
        )
        # A stream entry carries the records of one commit (shared.journal): the first one
        # read may hold records at or below ``after``; ``count`` counts records.
        entries = [e for _id, fields in rows for e in journal_records(fields, after)]
        return entries if count is None else entries[:count]

    def tokens(self, task_id: str, after: str = "0-0", count: int = 1000) -> list[TokenEntry]:
        """Entries of the task's tokens stream after the stream id ``after`` (the text of its
        model answers as they stream; :mod:`shared.tokens` says how to show them)."""
        stream = keys.tokens_stream(task_id, self._p(task_id))
        rows = self._rows(self.redis.xrange(stream, min=f"({after}", max="+", count=count))
        return [e for e in (token_entry(i, f) for i, f in rows) if e is not None]

    def follow_with_tokens(
        self, task_id: str, idle_timeout_s: float | None = None
    ) -> Iterator[JournalEntry | TokenEntry]:
        """Journal entries and the text of the model's answers as they come, until the task
        ends (or nothing for ``idle_timeout_s``); the pieces of an answer come before the
        ``ReasoningComplete`` that records it."""
        real = self.existing(task_id)
        last, after = -1, "0-0"
        quiet_since = time.monotonic()
        while True:
            pieces = self.tokens(real, after)
            entries = self.journal(real, after=last)
            yield from pieces
            yield from entries
            after = pieces[-1].id if pieces else after
            last = entries[-1].sequence if entries else last
            if entries or pieces:
                quiet_since = time.monotonic()
            status = self._hget(self._task_key(real), "status")
            if status is None:
                self.existing(task_id)  # purged while followed: says so
            if status in {s.value for s in TERMINAL_STATUSES} and not entries and not pieces:
                return
            if idle_timeout_s is not None and time.monotonic() - quiet_since > idle_timeout_s:
                return
            time.sleep(self.poll_interval_s)

    def follow_journal(
        self, task_id: str, idle_timeout_s: float | None = None
    ) -> Iterator[JournalEntry]:
        """Journal entries as they are written, until the task ends (or nothing for a while).

        TaskNotFoundError at once for an unknown task, and when the task is purged meanwhile.
        Between reads it blocks on the journal and the partition's lifecycle events (which
        say when the task ends), never sleeping a fixed interval.
        """
        real = self.existing(task_id)
        last = -1
        quiet_since = time.monotonic()
        p = self._p(real)
        journal, events = keys.journal_stream(real, p), keys.events_stream(p)
        events_after = self._last_id(events)
        while True:
            entries = self.journal(real, after=last)
            for entry in entries:
                last = entry.sequence
                yield entry
            if entries:
                quiet_since = time.monotonic()
            status = self._hget(self._task_key(real), "status")
            if status is None:
                self.existing(task_id)  # purged while followed: says so
            if status in {s.value for s in TERMINAL_STATUSES} and not entries:
                return
            idle_deadline = None if idle_timeout_s is None else quiet_since + idle_timeout_s
            if idle_deadline is not None and time.monotonic() > idle_deadline:
                return
            # The journal's ids are ``0-{sequence + 1}``: block until one after ``last``.
            wake: dict[Any, Any] = {journal: f"0-{last + 1}", events: events_after}
            reply = self.watcher.xread(wake, block=watch_block_ms(idle_deadline))
            for name, rows in cast("list[Any]", reply or []):
                if name == events and rows:
                    events_after = str(rows[-1][0])

    def events(self, after: str = "0-0", count: int = 1000) -> list[tuple[str, dict[str, str]]]:
        """Lifecycle events after a stream id, merged over the partitions by id.

        One id for every partition's stream: on one partition a follow API (pass the last id
        seen); on several, an event of one partition with an id below another's last one (a
        later page's count cut, another master's clock) is skipped: follow them with
        :meth:`follow_events`, or a task with :meth:`watch`."""
        rows: list[tuple[str, dict[str, str]]] = []
        for p in range(self.partition_count):
            got = self.redis.xrange(keys.events_stream(p), min=f"({after}", max="+", count=count)
            rows += self._rows(got)
        return sorted(rows, key=lambda row: _stream_order(row[0]))[:count]

    def follow_events(
        self, cursor: str = "0-0", count: int = 1000
    ) -> tuple[list[tuple[str, dict[str, str]]], str]:
        """The lifecycle events after ``cursor`` and the cursor to pass next: one position per
        partition (``id0,id1,…`` in partition order), so no partition's event is skipped
        whatever the others' ids. A plain stream id starts every partition from it (on one
        partition the cursor is that id). ConfigError for a cursor of another partition count."""
        positions = [position.strip() for position in cursor.split(",")]
        if len(positions) == 1:
            positions *= self.partition_count
        if len(positions) != self.partition_count:
            raise ConfigError(
                f"events cursor {cursor!r} names {len(positions)} partitions, the deployment "
                f"has {self.partition_count} (ORGA_PARTITIONS): pass the cursor this "
                "deployment's follow_events returned, or a plain stream id to start from"
            )
        rows: list[tuple[int, str, dict[str, str]]] = []
        for p, position in enumerate(positions):
            got = self.redis.xrange(keys.events_stream(p), min=f"({position}", max="+", count=count)
            rows += [(p, entry_id, fields) for entry_id, fields in self._rows(got)]
        taken = sorted(rows, key=lambda row: (_stream_order(row[1]), row[0]))[:count]
        for p, entry_id, _fields in taken:  # sorted: each partition's last taken is kept
            positions[p] = entry_id
        return [(entry_id, fields) for _p, entry_id, fields in taken], ",".join(positions)

    # -- reviews --------------------------------------------------------------------------

    def reviews(self) -> list[ReviewItem]:
        """Open escalations, oldest first."""
        items = [
            ReviewItem.model_validate_json(v)
            for p in range(self.partition_count)
            for v in cast("dict[str, str]", self.redis.hgetall(keys.open_reviews_key(p))).values()
        ]
        return sorted(items, key=lambda r: r.created_at)

    def open_review_count(self) -> int:
        """How many escalations wait for a decision."""
        counts: list[Any] = [
            self.redis.hlen(keys.open_reviews_key(p)) for p in range(self.partition_count)
        ]
        return sum(int(c) for c in counts)

    def review(self, review_id: str) -> ReviewItem:
        """One open escalation."""
        raw = next(
            (
                found
                for p in range(self.partition_count)
                if (found := self._hget(keys.open_reviews_key(p), review_id)) is not None
            ),
            None,
        )
        if raw is None:
            raise TaskNotFoundError(f"no open review {review_id!r}; `orga review list` shows them")
        return ReviewItem.model_validate_json(str(raw))

    def decide(
        self,
        review_id: str,
        decision: str,
        hint: str | None = None,
        by: str = "cli",
        timeout_s: float = 30.0,
        *,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        """Send a decision and wait until the coordinator applied or refused it.

        ``arguments`` are an ``edit``'s new arguments for a held call (``hint`` is then a
        ``reject``'s message for the model). ReviewDecidedError when another decision was sent
        first or applied first (the default at the review's deadline); ReviewerError for a
        reserved or malformed ``by``; ValueError (ArgumentsError naming the field for an edit
        that does not fit the tool's schema) for a decision the review does not take, before
        anything is sent: the review stays open.
        """
        task_id, entry = self.send_decision(review_id, decision, hint, by, arguments=arguments)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.decision_applied(review_id, task_id, entry):
                return task_id
            time.sleep(self.poll_interval_s)
        raise WaitTimeoutError(
            f"no coordinator applied the decision within {timeout_s}s; "
            "is `orga coordinator` running?"
        )

    def send_decision(
        self,
        review_id: str,
        decision: str,
        hint: str | None = None,
        by: str = "cli",
        *,
        arguments: dict[str, Any] | None = None,
    ) -> tuple[str, str]:
        """Claim an open review and send the decision (the first half of :meth:`decide`):
        the review's task and the control entry's id. ReviewDecidedError when another decision
        was sent first; TaskNotFoundError for a review not open; ValueError (ArgumentsError for
        an edit that does not fit the tool's schema) for a decision the review does not take,
        before anything is sent."""
        check_reviewer(by)
        try:
            item = self.review(review_id)
        except TaskNotFoundError:
            self._refuse_decided(review_id)
            raise
        edited = _checked_call_decision(item, decision, arguments)
        return item.task_id, self._claim(item, decision, hint or "", by, edited)

    def decision_applied(self, review_id: str, task_id: str, entry: str) -> bool:
        """True once a coordinator applied the decision sent as control ``entry``, False
        while none did; ReviewDecidedError when it was refused, or another applied first."""
        p = self._p(task_id)
        refused = self._control_refusal(entry, p)
        if refused is not None:
            raise ReviewDecidedError(f"decision refused: {refused}")
        decided = self._decided(review_id, p)
        if decided is None:
            return False
        if decided.get("entry_id") == entry:
            return True
        raise ReviewDecidedError(
            f"decision refused: review {review_id} was decided first by "
            f"{decided.get('by')!r} ({decided.get('decision')}); nothing else was applied"
        )

    def decide_request(
        self, review_id: str, request: DecisionRequest, by: str = "cli", timeout_s: float = 30.0
    ) -> str:
        """:meth:`decide` with a :class:`~shared.approval.DecisionRequest` (the HTTP API's
        body): its ``message`` is the hint, the revision's reason or the rejection."""
        return self.decide(
            review_id,
            request.decision,
            hint=request.message,
            by=by,
            timeout_s=timeout_s,
            arguments=request.arguments,
        )

    def _claim(
        self, item: ReviewItem, decision: str, hint: str, by: str, arguments: str = ""
    ) -> str:
        """Send the decision, claiming the review; ReviewDecidedError when already claimed."""
        script = self.redis.register_script(_CLAIM)
        review_id = item.review_id
        p = self._p(item.task_id)  # the review's, its claim's and its control entry's slot
        code, value = cast(
            "list[Any]",
            script(
                keys=[
                    keys.open_reviews_key(p),
                    keys.review_claim_key(review_id, p),
                    keys.control_stream(p),
                ],
                args=[review_id, keys.control_maxlen, keys.review_claim_ttl_s, item.task_id,
                      decision, hint, by, arguments],
            ),
        )  # fmt: skip
        if int(code) == 0:  # closed since it was read: by another decision, if one was sent
            self._refuse_decided(review_id, partition=p)
            raise TaskNotFoundError(f"no open review {review_id!r}; `orga review list` shows them")
        if int(code) == 1:
            self._refuse_decided(review_id, str(value), partition=p)
        return str(value)

    def _refuse_decided(
        self, review_id: str, claim: str | None = None, partition: int | None = None
    ) -> None:
        """ReviewDecidedError naming who decided the review, when a decision was sent for it
        (``claim``, else the review's claim key) or applied (its ``review_decided`` event);
        looked for in every partition when the review's is not known."""
        parts = range(self.partition_count) if partition is None else [partition]
        for p in parts:
            if claim is None:
                claim = cast("str | None", self.redis.get(keys.review_claim_key(review_id, p)))
        decided = json.loads(claim) if claim is not None else self._decided(review_id, partition)
        if decided is not None:
            raise ReviewDecidedError(
                f"decision refused: review {review_id} was already decided by "
                f"{decided.get('by')!r} ({decided.get('decision')}); nothing else was sent"
            )

    def _decided(self, review_id: str, partition: int | None = None) -> dict[str, str] | None:
        """The ``review_decided`` event of a review, if it was applied (in ``partition``, or
        any)."""
        parts = range(self.partition_count) if partition is None else [partition]
        for p in parts:
            for _id, fields in self._rows(self.redis.xrevrange(keys.events_stream(p), count=500)):
                if fields.get("event") == "review_decided" and fields.get("review_id") == review_id:
                    return fields
        return None

    def _control_refusal(self, entry_id: str, partition: int) -> str | None:
        events = keys.events_stream(partition)
        for _id, fields in self._rows(self.redis.xrevrange(events, count=200)):
            if fields.get("event") == "control_rejected" and fields.get("entry_id") == entry_id:
                return str(fields.get("error"))
        return None

    def cancel(self, task_id: str, reason: str = "cancelled by operator") -> None:
        """Ask the coordinator to abort a task (its milestones are kept).

        TaskNotFoundError for an unknown task; TaskFinishedError, sending nothing, for one
        that already ended.
        """
        record = self.record(task_id)
        if record.terminal:
            raise TaskFinishedError(
                f"task {task_id} already ended {record.status.value}: nothing to cancel"
            )
        self.redis.xadd(
            keys.control_stream(self._p(record.task_id)),
            {"action": "cancel", "task_id": record.task_id, "reason": reason},
            maxlen=keys.control_maxlen,
            approximate=True,
        )

    def close(self) -> None:
        """Close the connection pools."""
        self.redis.close()
        self.watcher.close()


WATCH_BLOCK_MS = 5_000
"""The longest a watcher blocks before it looks at its task again (a status changed by no
journal entry nor lifecycle event is seen this late at worst)."""
WATCH_SOCKET_TIMEOUT_S = WATCH_BLOCK_MS / 1000 + 10
"""The socket timeout of a watcher's connections: a block, and time for a loaded server to
answer (redis-py's default, 5 s, is no longer than a block)."""


def watch_block_ms(deadline: float | None) -> int:
    """How long one blocking read may wait: ``WATCH_BLOCK_MS``, less near ``deadline``."""
    if deadline is None:
        return WATCH_BLOCK_MS
    return max(1, min(WATCH_BLOCK_MS, int((deadline - time.monotonic()) * 1000)))


def _page_cursor(cursor: str | None) -> tuple[float, str]:
    """The (creation time, id) a page cursor stands for: the row before which the next page
    starts; ConfigError naming a cursor that is not one."""
    if not cursor:
        return (float("inf"), "")
    at, _, task_id = cursor.partition(":")
    try:
        return (float(at), check_task_id(task_id))
    except (ValueError, OrgaError) as exc:
        raise ConfigError(
            f"cursor {cursor[:80]!r} is not a page cursor: send the `next_cursor` of the "
            "previous page, or none for the first page"
        ) from exc


def _checked_call_decision(
    item: ReviewItem, decision: str, arguments: dict[str, Any] | None
) -> str:
    """The edit's arguments as JSON ("" for any other decision), checked as the coordinator
    will check them, so that a decision it would refuse is never sent (nor its claim taken)."""
    if item.source != "call" or item.call is None:
        if arguments is not None:
            raise DecisionError(
                f"review {item.review_id} ({item.source}) holds no tool call: only a held call "
                "takes edited arguments"
            )
        if decision in ("edit", "reject"):
            raise DecisionError(
                f"review {item.review_id} ({item.source}) is not about a held tool call, so "
                f"{decision!r} does not apply; decide it with retry, skip or abort"
            )
        return ""
    if decision not in CALL_DECISIONS:
        raise DecisionError(
            f"review {item.review_id} holds one tool call ({item.call.name}), so {decision!r} "
            "does not apply; use approve, edit (with --args JSON), reject (with a message) or abort"
        )
    try:
        request = DecisionRequest.model_validate({"decision": decision, "arguments": arguments})
    except ValidationError as exc:
        errors = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise DecisionError(f"review {item.review_id}: {errors}") from exc
    if request.arguments is None:
        return ""
    check_arguments(item.call.name, request.arguments, item.input_schema)
    return request.arguments_json()


def _stream_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _idempotency_key(text: str) -> str | None:
    """The idempotency key a task's text names, if it parses (else the coordinator rejects it,
    naming the error). Parsed as the intake does (:func:`~shared.task_spec.decode_task_text`:
    size and nesting limits), never a bare YAML load of what a caller sent."""
    try:
        data = decode_task_text(text)
    except TaskSpecError:  # not a task: the coordinator says why
        return None
    key = data.get("idempotency_key") if isinstance(data, dict) else None
    return key if isinstance(key, str) and key else None


def task_text(task: TaskSpec | dict[str, Any] | str | bytes | Path) -> str:
    """The text of a task as it goes on the intake stream (JSON, or the text given, which must
    be UTF-8: :func:`~shared.task_spec.as_task_text`)."""
    if isinstance(task, Path):
        task = load_task_file(task)
    if isinstance(task, TaskSpec):
        # A task naming an agent carries only the fields it sets: the profile's fill the rest.
        return task.model_dump_json(exclude_none=True, exclude_unset=task.agent is not None)
    if isinstance(task, dict):
        return json.dumps(task)
    return as_task_text(task, "submitted task")


def is_terminal(status: str) -> bool:
    """True for completed, failed and aborted."""
    return status in {s.value for s in TERMINAL_STATUSES}


MAX_TREE_DEPTH = 8


def _waiting(record: TaskRecord, held: Any) -> str | None:
    """``waiting on the provider openai (HTTP 503; retry at ...)`` for a model call a worker
    holds in a retry wait (``held``: its ``orga:provider_wait`` record), or the task's own
    hold through an outage; None when it waits on neither."""
    outage = record.outage
    if outage is not None and outage.retry_at is not None:
        return outage.waiting()
    if held is None:
        return None
    try:
        wait = json.loads(held)
        at = datetime.fromtimestamp(float(wait["retry_at"]), UTC).isoformat(timespec="seconds")
        why = (
            "its key held by another call's 429"
            if wait.get("shared")
            else (f"HTTP {wait['status']}" if wait.get("status") else "no answer")
        )
        return f"waiting on the provider {wait['provider']} ({why}; retry at {at})"
    except (ValueError, KeyError, TypeError):
        return None


"""Levels of sub-agents ``status`` shows under a task."""


def _progress(record: TaskRecord) -> dict[str, Any]:
    """A task's status and progress, as a row of a sub-agent tree."""
    return {
        "status": record.status.value,
        "step": record.steps[record.current].spec.id if record.steps else None,
        "steps_done": sum(1 for s in record.steps if s.status.value == "completed"),
        "steps_total": len(record.steps),
        "iteration": record.iteration,
        "milestones": list(record.milestones),
        "error": record.error,
    }


def critic_status(record: TaskRecord) -> dict[str, Any] | None:
    """The current step's critic (``orga status``): who, the review round, the revisions sent
    back and the verdicts so far; None when the step has no critic."""
    if not record.steps or record.step().spec.critic is None:
        return None
    step = record.step()
    critic = step.spec.critic
    assert critic is not None
    critique = step.critique
    return {
        "critic": critic.reviewer,
        "max_rounds": critic.max_rounds,
        "revisions": critique.rounds if critique else 0,
        "waiting": _with_critic(record),
        "verdicts": list(critique.verdicts) if critique else [],
    }


def _with_critic(record: TaskRecord) -> bool:
    """The step's result is with its critic: a critic model call, or a human critic's review."""
    awaiting, review = record.awaiting, record.review
    if awaiting is not None and awaiting.kind is AwaitKind.CRITIC:
        return True
    return review is not None and review.source == "critic"
