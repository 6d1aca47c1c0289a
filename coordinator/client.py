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
import yaml

from coordinator.state import (
    TERMINAL_STATUSES,
    AwaitKind,
    ReviewItem,
    TaskRecord,
    check_reviewer,
)
from shared import keys
from shared.errors import ConfigError, OrgaError
from shared.events import JournalEntry
from shared.partitions import check_partitions
from shared.task_spec import TaskSpec, as_task_text, check_task_id, load_task_file

__all__ = [
    "OrgaClient",
    "ReviewDecidedError",
    "TaskFinishedError",
    "TaskNotFoundError",
    "TaskRejectedError",
    "WaitTimeoutError",
    "critic_status",
    "task_text",
]


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
local entry = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'action', 'review',
  'task_id', ARGV[4], 'review_id', ARGV[1], 'decision', ARGV[5], 'hint', ARGV[6], 'by', ARGV[7])
local claim = cjson.encode({by = ARGV[7], decision = ARGV[5], entry_id = entry})
redis.call('SET', KEYS[2], claim, 'EX', ARGV[3])
return {2, entry}
"""
"""Send a review's decision only when the review is open and no decision was sent for it yet:
the claim and the control entry are written together, so two operators never both send one."""


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

    def _p(self, task_id: str) -> int:
        return keys.partition_of(task_id, self.partition_count)

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
        pipe = self.redis.pipeline(transaction=True)  # the state and its conversation, together
        pipe.hget(self._task_key(real), "state")
        pipe.lrange(keys.conversation_key(real, self._p(real)), 0, -1)
        state, stored = pipe.execute()
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
                "running": running}  # fmt: skip

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

    def rejection(self, task_id: str) -> str | None:
        """The validation error of a rejected submission, if it was rejected."""
        rejected = keys.rejected_stream(self._p(task_id))
        for _id, fields in self._rows(self.redis.xrevrange(rejected, count=1000)):
            if fields.get("task_id") == task_id:
                return str(fields.get("error"))
        return None

    def wait(self, task_id: str, timeout_s: float = 600.0) -> dict[str, Any]:
        """Block until the task is completed, failed or aborted; return its result."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                record = self.record(task_id)
                if record.status in TERMINAL_STATUSES:
                    return record.result()
            except TaskNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise WaitTimeoutError(f"task {task_id} did not finish within {timeout_s}s")
            time.sleep(self.poll_interval_s)

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
        return [JournalEntry.model_validate_json(fields["data"]) for _id, fields in rows]

    def follow_journal(
        self, task_id: str, idle_timeout_s: float | None = None
    ) -> Iterator[JournalEntry]:
        """Journal entries as they are written, until the task ends (or nothing for a while).

        TaskNotFoundError at once for an unknown task, and when the task is purged meanwhile.
        """
        real = self.existing(task_id)
        last = -1
        quiet_since = time.monotonic()
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
            if idle_timeout_s is not None and time.monotonic() - quiet_since > idle_timeout_s:
                return
            time.sleep(self.poll_interval_s)

    def events(self, after: str = "0-0", count: int = 1000) -> list[tuple[str, dict[str, str]]]:
        """Lifecycle events after a stream id (what upstream pipelines follow), merged over
        the partitions by id (one Redis stamps every stream's ids with its own clock)."""
        rows: list[tuple[str, dict[str, str]]] = []
        for p in range(self.partition_count):
            got = self.redis.xrange(keys.events_stream(p), min=f"({after}", max="+", count=count)
            rows += self._rows(got)
        return sorted(rows, key=lambda row: _stream_order(row[0]))[:count]

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
    ) -> str:
        """Send a decision and wait until the coordinator applied or refused it.

        ReviewDecidedError when another decision was sent first or applied first (the default
        at the review's deadline); ReviewerError for a reserved or malformed ``by``.
        """
        check_reviewer(by)
        try:
            item = self.review(review_id)
        except TaskNotFoundError:
            self._refuse_decided(review_id)
            raise
        entry = self._claim(item, decision, hint or "", by)
        p = self._p(item.task_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            refused = self._control_refusal(entry, p)
            if refused is not None:
                raise ReviewDecidedError(f"decision refused: {refused}")
            decided = self._decided(review_id, p)
            if decided is not None and decided.get("entry_id") == entry:
                return item.task_id
            if decided is not None:
                raise ReviewDecidedError(
                    f"decision refused: review {review_id} was decided first by "
                    f"{decided.get('by')!r} ({decided.get('decision')}); nothing else was applied"
                )
            time.sleep(self.poll_interval_s)
        raise WaitTimeoutError(
            f"no coordinator applied the decision within {timeout_s}s; "
            "is `orga coordinator` running?"
        )

    def _claim(self, item: ReviewItem, decision: str, hint: str, by: str) -> str:
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
                      decision, hint, by],
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
        """Close the connection pool."""
        self.redis.close()


def _stream_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _idempotency_key(text: str) -> str | None:
    """The idempotency key a task's text names, if it parses (else the coordinator rejects it,
    naming the error)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:  # not a task: the coordinator says why
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
