"""The coordinator process: intake, observations, control, deadlines and leases.

Five loops share one Redis connection pool:

- **intake**: ``XREADGROUP`` on ``orga:intake``; a malformed task goes to ``orga:rejected`` with
  its validation error and is acknowledged; a valid one is persisted (idempotency key honoured)
  and started.
- **observations**: ``XREADGROUP`` on ``orga:observations``; each message is applied to its task
  through the pure :class:`~coordinator.machine.TaskMachine` and committed with the ``XACK`` in
  one atomic script. Entries left pending by a dead coordinator are reclaimed with
  ``XAUTOCLAIM``; an entry delivered too many times is dead-lettered.
- **control**: review decisions and cancellations sent by the CLI.
- **ticks**: lease renewal and takeover, observation deadlines, review deadlines.
- **schedules**: due schedules are submitted to the intake (:mod:`coordinator.schedules`).

A task naming an agent (``agent: NAME``) is merged with the registered profile before it is
validated (:mod:`coordinator.agents`).

Dispatches are Celery messages pushed by the same atomic commit that saves the state expecting
them (:mod:`coordinator.dispatch`): a crash leaves either both or neither. A dispatch lost later
(a worker killed mid-task past its redelivery) is re-sent at the state's deadline, and the fence
makes the eventual observation apply once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from coordinator.agents import resolve_task_text
from coordinator.dispatch import CeleryDispatcher, Dispatcher
from coordinator.liveness import Liveness
from coordinator.machine import Effects, MachineSettings, TaskMachine, decide
from coordinator.metrics import CoordinatorMetrics
from coordinator.queues import QueueGauge
from coordinator.schedules import Scheduler
from coordinator.state import ReviewDecision, TaskRecord
from coordinator.store import CommitConflictError, TaskStore
from shared import keys
from shared.celery_wire import check_versions
from shared.errors import WireFormatError
from shared.protocol import (
    decode_entry,
)
from shared.task_spec import TaskSpecError

__all__ = ["Coordinator", "CoordinatorSettings"]

log = logging.getLogger("orga.coordinator")


@dataclass(frozen=True)
class CoordinatorSettings:
    """Timing and sizing of the coordinator loops."""

    lease_ttl_s: float = keys.lease_ttl_s
    tick_interval_s: float = 0.5
    block_ms: int = 1000
    batch: int = 64
    claim_idle_ms: int = 30_000
    max_deliveries: int = 5
    journal_maxlen: int = 10_000
    events_maxlen: int = 100_000
    retention_s: float = 7 * 24 * 3600.0
    purge_interval_s: float = 1.0
    schedule_interval_s: float = 1.0
    machine: MachineSettings = field(default_factory=MachineSettings)


@dataclass
class Coordinator:
    """One coordinator process; several may run against the same Redis."""

    redis: Redis
    dispatcher: Dispatcher = field(default_factory=CeleryDispatcher)
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    name: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    metrics: CoordinatorMetrics | None = None
    scheduler: Scheduler | None = None
    """Fires due schedules (:mod:`coordinator.schedules`); None: one on the real clock."""

    def __post_init__(self) -> None:
        check_versions()  # the commit script writes Celery messages in kombu's layout
        # This store keeps each conversation in Redis: reasoning requests carry a reference.
        machine = replace(self.settings.machine, conversation_by_reference=True)
        self.settings = replace(self.settings, machine=machine)
        if self.scheduler is None:
            self.scheduler = Scheduler(self.redis)
        self.store = TaskStore(
            self.redis,
            journal_maxlen=self.settings.journal_maxlen,
            events_maxlen=self.settings.events_maxlen,
        )
        self._last_purge = 0.0
        self._held: set[str] = set()
        self._last_renewal = 0.0
        self._stopping = asyncio.Event()
        self._queues = QueueGauge()

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every loop until ``stop()``."""
        await self._ensure_groups()
        loops = [
            self._loop(self._intake_once),
            self._loop(self._observations_once),
            self._loop(self._control_once),
            self._loop(self._tick_once, self.settings.tick_interval_s),
            self._loop(self._schedules_once, self.settings.schedule_interval_s),
        ]
        await asyncio.gather(*loops)

    def stop(self) -> None:
        """Ask every loop to finish after its current batch."""
        self._stopping.set()

    async def _loop(self, body: Callable[[], Awaitable[None]], pause_s: float = 0.0) -> None:
        while not self._stopping.is_set():
            try:
                await body()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("coordinator.loop_failed", extra={"coordinator": self.name})
                await asyncio.sleep(0.5)
            if pause_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause_s)

    async def _schedules_once(self) -> None:
        assert self.scheduler is not None
        await self.scheduler.fire_due()

    async def _ensure_groups(self) -> None:
        for stream in (keys.intake_stream, keys.observations_stream, keys.control_stream):
            try:
                await self.redis.xgroup_create(
                    stream, keys.coordinator_group, id="0", mkstream=True
                )
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _read(self, stream: str) -> list[tuple[str, dict[Any, Any]]]:
        response = await self.redis.xreadgroup(
            keys.coordinator_group,
            self.name,
            {stream: ">"},
            count=self.settings.batch,
            block=self.settings.block_ms,
        )
        rows: list[Any] = cast(list[Any], response or [])
        return [(_text(i), f) for _name, entries in rows for i, f in entries]

    # -- intake ---------------------------------------------------------------------------

    async def _intake_once(self) -> None:
        for entry_id, fields in await self._read(keys.intake_stream):
            await self._guarded(keys.intake_stream, entry_id, fields, self._intake)

    async def _guarded(
        self,
        stream: str,
        entry_id: str,
        fields: dict[Any, Any],
        handle: Callable[[str, dict[Any, Any]], Awaitable[None]],
    ) -> None:
        """Handle one entry; an unexpected error dead-letters that entry, not the batch.

        Redis being unreachable is not the entry's fault: that error propagates, the entry
        stays pending and is handled again once Redis is back.
        """
        try:
            await handle(entry_id, fields)
        except (RedisError, CommitConflictError):
            raise
        except Exception as exc:
            log.exception("stream.entry_failed", extra={"stream": stream, "entry_id": entry_id})
            await self._poison(stream, entry_id, fields, f"{type(exc).__name__}: {exc}")

    async def _intake(self, entry_id: str, fields: dict[Any, Any]) -> None:
        ack = (keys.intake_stream, keys.coordinator_group, entry_id)
        text = {_text(k): _text(v) for k, v in fields.items()}
        task_id = text.get("task_id") or uuid.uuid4().hex
        try:
            spec = await resolve_task_text(
                self.redis, text.get("task", ""), source=f"intake entry {entry_id}"
            )
        except TaskSpecError as exc:
            await self._reject(entry_id, task_id, text, str(exc))
            return
        now = time.time()
        record = TaskRecord(task_id=task_id, spec=spec, created_at=now, updated_at=now)
        outcome = await self.store.create(record, ack=ack)
        if not outcome.created:
            await self._duplicate(task_id, outcome.task_id)
            return
        await self._hold(task_id)
        await self._apply(task_id, _start)

    async def _reject(self, entry_id: str, task_id: str, text: dict[str, str], error: str) -> None:
        log.warning("task.rejected", extra={"task_id": task_id, "error": error})
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            keys.rejected_stream,
            {"task_id": task_id, "entry_id": entry_id, "error": error,
             "task": text.get("task", "")[:4096]},
            maxlen=10_000, approximate=True,
        )  # fmt: skip
        pipe.xadd(
            keys.events_stream,
            {"task_id": task_id, "event": "rejected", "error": error[:2000],
             "at": f"{time.time():.3f}"},
            maxlen=100_000, approximate=True,
        )  # fmt: skip
        pipe.xack(keys.intake_stream, keys.coordinator_group, entry_id)
        await pipe.execute()

    async def _duplicate(self, task_id: str, existing: str) -> None:
        if existing != task_id:
            await self.redis.hset(keys.task_key(task_id), mapping={"alias_of": existing})
        await self.redis.xadd(
            keys.events_stream,
            {"task_id": task_id, "event": "duplicate", "existing_task_id": existing,
             "at": f"{time.time():.3f}"},
            maxlen=100_000, approximate=True,
        )  # fmt: skip

    # -- observations ---------------------------------------------------------------------

    async def _observations_once(self) -> None:
        entries = await self._read(keys.observations_stream)
        for entry_id, fields in entries:
            await self._guarded(keys.observations_stream, entry_id, fields, self._observation)

    async def _observation(self, entry_id: str, fields: dict[Any, Any]) -> None:
        ack = (keys.observations_stream, keys.coordinator_group, entry_id)
        try:
            message = decode_entry(fields)
        except WireFormatError as exc:
            await self._poison(keys.observations_stream, entry_id, fields, str(exc))
            return
        task_id = message.fence.task_id
        applied = await self._apply(task_id, lambda m: m.on_answer(message), ack=ack)
        if not applied:  # a stale or duplicate answer: nothing keeps it
            pipe = self.redis.pipeline(transaction=True)
            pipe.xack(keys.observations_stream, keys.coordinator_group, entry_id)
            pipe.xdel(keys.observations_stream, entry_id)
            await pipe.execute()

    async def _poison(self, stream: str, entry_id: str, fields: dict[Any, Any], error: str) -> None:
        log.warning("stream.poison", extra={"stream": stream, "entry_id": entry_id, "error": error})
        raw: dict[Any, Any] = {f"raw_{_text(k)}": _text(v)[:4096] for k, v in fields.items()}
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            keys.dead_letter_stream,
            {**raw, "stream": stream, "entry_id": entry_id, "error": error[:2000]},
            maxlen=100_000, approximate=True,
        )  # fmt: skip
        pipe.xack(stream, keys.coordinator_group, entry_id)
        await pipe.execute()

    async def _reclaim(
        self, stream: str, handle: Callable[[str, dict[Any, Any]], Awaitable[None]]
    ) -> None:
        _next, entries, *_ = await self.redis.xautoclaim(
            stream, keys.coordinator_group, self.name,
            min_idle_time=self.settings.claim_idle_ms, start_id="0-0", count=self.settings.batch,
        )  # fmt: skip
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            if fields is None:
                continue
            deliveries = await self._deliveries(stream, entry_id)
            if deliveries > self.settings.max_deliveries:
                error = f"delivered {deliveries} times without being applied"
                await self._poison(stream, entry_id, fields, error)
            else:
                await self._guarded(stream, entry_id, fields, handle)

    async def _deliveries(self, stream: str, entry_id: str) -> int:
        pending = await self.redis.xpending_range(
            stream, keys.coordinator_group, min=entry_id, max=entry_id, count=1
        )
        return int(pending[0]["times_delivered"]) if pending else 0

    # -- control --------------------------------------------------------------------------

    async def _control_once(self) -> None:
        for entry_id, fields in await self._read(keys.control_stream):
            await self._guarded(keys.control_stream, entry_id, fields, self._control)

    async def _control(self, entry_id: str, fields: dict[Any, Any]) -> None:
        text = {_text(k): _text(v) for k, v in fields.items()}
        ack = (keys.control_stream, keys.coordinator_group, entry_id)
        task_id = text.get("task_id", "")
        action = text.get("action")
        try:
            if action == "review":
                decision = _decision(text.get("decision", ""))
                applied = await self._apply(
                    task_id,
                    lambda m: m.on_review_decision(
                        text.get("review_id", ""),
                        decision,
                        text.get("hint") or None,
                        text.get("by", "cli"),
                    ),
                    ack=ack,
                )
            elif action == "cancel":
                applied = await self._apply(
                    task_id, lambda m: m.cancel(text.get("reason", "")), ack=ack
                )
            else:
                raise ValueError(f"unknown control action {action!r}")
            if not applied:
                raise ValueError(f"task {task_id!r} is unknown or has already ended")
        except ValueError as exc:
            await self._control_rejected(entry_id, task_id, str(exc))

    async def _control_rejected(self, entry_id: str, task_id: str, error: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.xadd(
            keys.events_stream,
            {"task_id": task_id, "event": "control_rejected", "entry_id": entry_id,
             "error": error[:2000], "at": f"{time.time():.3f}"},
            maxlen=100_000, approximate=True,
        )  # fmt: skip
        pipe.xack(keys.control_stream, keys.coordinator_group, entry_id)
        await pipe.execute()

    # -- ticks ----------------------------------------------------------------------------

    async def _tick_once(self) -> None:
        await self._reclaim(keys.observations_stream, self._observation)
        await self._reclaim(keys.intake_stream, self._intake)
        await self._reclaim(keys.control_stream, self._control)
        await self._renew_leases()
        await self._purge()
        due = await self.store.due_task_ids(time.time(), self.settings.batch * 4)
        if due:
            await self._queues.sample(self.redis)
        for task_id in due:
            if await self._hold(task_id):
                await self._guarded_tick(task_id)

    async def _guarded_tick(self, task_id: str) -> None:
        """One due task; its failure is logged and never stops the tick for the others."""
        try:
            liveness = await self._liveness(task_id)
            await self._apply(task_id, lambda m: m.on_tick(liveness))
        except (RedisError, CommitConflictError):
            raise
        except Exception:
            log.exception("tick.task_failed", extra={"task_id": task_id})

    async def _liveness(self, task_id: str) -> Liveness | None:
        """What Redis says of the task's late dispatch (None: it waits on no dispatch)."""
        record = self.store.peek_kept(task_id) or await self.store.load(task_id)
        if record is None:
            return None
        machine = TaskMachine(record, time.time(), self.settings.machine)
        ids = machine.liveness_ids()
        if not ids:
            return None
        scores = await self.redis.zmscore(keys.heartbeats_key, ids)
        queue = machine.awaited_queue()
        return Liveness(
            scores=dict(zip(ids, scores, strict=True)),
            queue=queue,
            queue_depth=self._queues.depth(queue),
            drain_per_s=self._queues.drain_per_s(queue),
            observations_backlog=self._queues.observations_backlog,
        )

    async def _hold(self, task_id: str) -> bool:
        """True when this coordinator holds (or has just taken over) the task's lease."""
        if task_id in self._held:
            return True
        ttl_ms = int(self.settings.lease_ttl_s * 1000)
        if await self.store.acquire_lease(task_id, self.name, ttl_ms):
            log.info("lease.acquired", extra={"task_id": task_id, "coordinator": self.name})
            self._held.add(task_id)
            return True
        return False

    async def _renew_leases(self) -> None:
        now = time.monotonic()
        if now - self._last_renewal < self.settings.lease_ttl_s / 3:
            return
        self._last_renewal = now
        ttl_ms = int(self.settings.lease_ttl_s * 1000)
        held = sorted(self._held)
        active = await self.store.still_active(held)
        for task_id, is_active in zip(held, active, strict=True):
            if not is_active:  # finished by another coordinator
                self._held.discard(task_id)
                await self.store.release_lease(task_id, self.name)
            elif not await self.store.renew_lease(task_id, self.name, ttl_ms):
                self._held.discard(task_id)

    async def _purge(self) -> None:
        """Delete finished tasks older than the retention (state, journal, aliases)."""
        now = time.monotonic()
        if now - self._last_purge < self.settings.purge_interval_s:
            return
        self._last_purge = now
        old = time.time() - keys.heartbeats_retention_s
        await self.redis.zremrangebyscore(keys.heartbeats_key, -old, old)
        purged = await self.store.purge_finished(time.time() - self.settings.retention_s)
        if purged:
            log.info("tasks.purged", extra={"count": purged, "coordinator": self.name})

    async def _released(self, record: TaskRecord) -> None:
        if record.terminal and record.task_id in self._held:
            self._held.discard(record.task_id)
            await self.store.release_lease(record.task_id, self.name)

    # -- applying -------------------------------------------------------------------------

    async def _apply(
        self,
        task_id: str,
        step: Callable[[TaskMachine], Effects],
        ack: tuple[str, str, str] | None = None,
    ) -> bool:
        """Load, transition, then commit with the dispatches (retrying on conflict).

        False: no such task, or the machine ignored the input. The record kept from this
        coordinator's last commit of the task is used without asking Redis whether it is still
        current: the commit's compare-and-set refuses it if it is not, and an input the machine
        ignores or refuses (raises) is answered so only once the version it was judged against
        is confirmed.
        """
        for _ in range(20):
            record = self.store.take_kept(task_id)
            confirmed = record is None
            if record is None:
                record = await self.store.load(task_id)
                if record is None:
                    return False
            machine = TaskMachine(record, time.time(), self.settings.machine)
            try:
                effects = decide(machine, step)
            except Exception:
                if await self._stale(record, confirmed):
                    continue  # refused on a stale copy: judge again on the stored record
                raise
            if not effects.changed:
                if await self._stale(record, confirmed):
                    continue  # ignored on a stale copy: judge again on the stored record
                if self.metrics is not None:
                    self.metrics.ignored()
                return False
            delta = self.store.conversation_delta(machine.record)
            effects.stamped(machine.record.conversation_epoch)
            messages = self.dispatcher.messages(effects.reason_dispatches, effects.tool_dispatches)
            try:
                await self.store.commit(
                    machine.record, effects, ack=ack, messages=messages, delta=delta
                )
            except CommitConflictError:
                continue
            await self._released(machine.record)
            if self.metrics is not None:
                self.metrics.record(machine.record, effects)
            return True
        raise CommitConflictError(f"task {task_id}: gave up after 20 conflicting commits")

    async def _stale(self, record: TaskRecord, confirmed: bool) -> bool:
        """Whether a kept record's verdict must be redone: it was never confirmed current and
        Redis now holds another version."""
        return not confirmed and not await self.store.is_current(record.task_id, record.version)


def _decision(value: str) -> ReviewDecision:
    if value == "retry":
        return "retry"
    if value == "skip":
        return "skip"
    if value == "abort":
        return "abort"
    raise ValueError(f"unknown review decision {value!r}; use retry, skip or abort")


def _start(machine: TaskMachine) -> Effects:
    return machine.start()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
