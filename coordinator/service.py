"""The coordinator process: intake, observations, control, deadlines and leases.

Seven loops share one Redis connection pool:

- **intake**: ``XREADGROUP`` on ``orga:intake``; a malformed task goes to ``orga:rejected`` with
  its validation error and is acknowledged; a valid one is persisted (idempotency key honoured)
  and started.
- **observations**: ``XREADGROUP`` on ``orga:observations``; each message is applied to its task
  through the pure :class:`~coordinator.machine.TaskMachine` and committed in one atomic
  script; the entries applied are deleted together, one ``XDEL`` per partition, at most
  ``delete_applied_s`` later (the read waiting for more blocks no longer; not acknowledged:
  on Redis 7.0.4 and later the next ``XAUTOCLAIM`` drops its delivery; before, acknowledged
  too, the version read at the start). A coordinator killed in between leaves them pending:
  claimed, they are duplicate answers, which the fences ignore. An outage report, which the
  machine would count again (the dispatch it holds keeps its fence), is deleted by its commit.
  Entries left pending by a dead coordinator are reclaimed with ``XAUTOCLAIM``; an entry
  delivered too many times is dead-lettered.
- **control**: review decisions and cancellations sent by the CLI.
- **ticks**: lease renewal and takeover, observation deadlines, review deadlines.
- **schedules**: due schedules are submitted to the intake (:mod:`coordinator.schedules`).
- **relay** (with a ``publisher``): the outbox's dispatches are sent to Celery
  (:mod:`coordinator.relay`).
- **partitions**: the partition leases' heartbeat (:mod:`coordinator.partition_leases`).

A running coordinator serves a fair share of the partitions: the intake, observations, control
and relay loops and the tick read only the partitions it holds the lease of
(:meth:`Coordinator.serving`). A coordinator driven without :meth:`Coordinator.run` (tests)
serves every partition.

A task naming an agent (``agent: NAME``) is merged with the registered profile before it is
validated (:mod:`coordinator.agents`).

A coordinator refuses to start on a Redis whose ``maxmemory-policy`` is not ``noeviction``
(:func:`check_redis_keeps_keys`, :mod:`shared.eviction`): an evicting Redis deletes tasks
without a word. Redis refusing writes or unreachable, or a Redis Cluster moving the slot of a
key the coordinator touches (a live reshard: :func:`is_transient`), never makes an entry
poison: the entries not handled get their delivery back and the loops back off. Redis
answering NOGROUP (restarted empty) makes the coordinator recreate its groups and write a
``state_lost`` event.

Dispatches are appended to the outbox stream by the same atomic commit that saves the state
expecting them (:mod:`shared.outbox`): a crash leaves either both or neither. A sixth loop, the
relay (:mod:`coordinator.relay`), sends them to Celery and removes them, at least once. A
dispatch lost later (a worker killed mid-task past its redelivery) is re-sent at the state's
deadline, and the fence makes the eventual observation apply once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard, cast, get_args

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from coordinator.agents import resolve_task_text
from coordinator.liveness import Liveness
from coordinator.logs import RateGate
from coordinator.machine import PLAN_FENCE_STEP, Effects, MachineSettings, TaskMachine, decide
from coordinator.machine.delegation import rejected_child
from coordinator.machine.outages import OUTAGE_KINDS
from coordinator.metrics import CoordinatorMetrics
from coordinator.partition_leases import PartitionLeases
from coordinator.queues import QueueGauge
from coordinator.relay import OutboxRelay
from coordinator.schedules import Scheduler, adopt_legacy_schedules
from coordinator.state import (
    TERMINAL_STATUSES,
    AwaitKind,
    ReviewDecision,
    TaskRecord,
    check_reviewer,
)
from coordinator.store import CommitConflictError, CreateOutcome, PendingCommit, TaskStore
from coordinator.streams import claim_drops_deleted, is_cluster, read_group, redis_version
from coordinator.transport import InlineQueues, QueueDepths, Transport
from shared import keys
from shared.delegation import ParentLink, parent_link
from shared.errors import ConfigError, WireFormatError
from shared.eviction import (
    POLICY_SETTING,
    check_eviction_policy,
    policy_from_config,
    policy_from_info,
    redis_address,
)
from shared.outbox import dispatch_entries
from shared.partitions import check_partitions, legacy_layout_error
from shared.protocol import (
    AnyMessage,
    Fence,
    WorkerFailedMessage,
    decode_entry,
    encode_entry,
)
from shared.task_spec import MAX_TASK_ID_CHARS, TaskSpecError, check_task_id

__all__ = [
    "Coordinator",
    "CoordinatorSettings",
    "check_cluster_mode",
    "check_layout",
    "check_redis_keeps_keys",
    "is_transient",
]

log = logging.getLogger("orga.coordinator")

_TRANSIENT_TYPES = (
    RedisConnectionError,  # also BusyLoadingError (LOADING)
    RedisTimeoutError,
    BusyLoadingError,
    OutOfMemoryError,
    ReadOnlyError,
    TryAgainError,
    MasterDownError,
    ClusterDownError,
    SlotNotCoveredError,  # a Redis Cluster while a master's replica is promoted
    # A Redis Cluster moving a slot (a live reshard), which refused the command before it ran:
    # TRYAGAIN (a script's keys split between the nodes), and what redis-py 8.2's asyncio
    # RedisCluster raises for a key already moved: "TTL exhausted" (its ASKING goes out on
    # another pooled connection than the command, so the new node answers MOVED back to the
    # old one until the redirects run out) and MOVED/ASK out of a MULTI or pipeline.
    ClusterError,
    AskError,
    MovedError,
)
_TRANSIENT_REPLY = re.compile(
    r"(?:^|caused error: )(?:OOM|BUSY|LOADING|MASTERDOWN|READONLY|TRYAGAIN|MISCONF|CLUSTERDOWN"
    r"|NOREPLICAS|UNBLOCKED)\b"
)
"""``UNBLOCKED``: a blocked stream read whose stream left the node (moved by a reshard)."""


async def check_redis_keeps_keys(redis: Redis) -> str:
    """The Redis's ``maxmemory-policy`` (``noeviction``), read by ``CONFIG GET``, else from
    ``INFO memory`` where CONFIG is renamed, disabled or refused; an
    :class:`~shared.eviction.EvictingRedisError` naming the value and the fix for any other.
    On a Redis Cluster every node (a replica may be promoted) is asked and checked."""
    if is_cluster(redis):
        cluster = await cast(RedisCluster, redis).initialize()  # discovers the nodes, once
        nodes = cluster.get_nodes()
        policies = [
            await _check_policy(redis, f"{node.host}:{node.port}", target_nodes=node)
            for node in nodes
        ]
        return policies[0]
    address = redis_address(redis.connection_pool.connection_kwargs)
    return await _check_policy(redis, address)


async def check_cluster_mode(redis: Redis) -> None:
    """Refuse (ConfigError naming the node and the fix) a node of a Redis Cluster reached with
    a standalone client (``ORGA_REDIS_CLUSTER`` off): the keys of the slots on the other nodes
    answer MOVED, which :func:`is_transient` takes for a slot being moved and waits out, so
    the coordinator would wait forever instead of saying what is wrong. ``INFO cluster`` says
    ``cluster_enabled:1`` on a cluster's node; a Redis refusing INFO is let through."""
    if is_cluster(redis):
        return
    try:
        info = await redis.info("cluster")
    except ResponseError:  # INFO renamed away: nothing to tell
        return
    if str(info.get("cluster_enabled", 0)) != "1":
        return
    address = redis_address(redis.connection_pool.connection_kwargs)
    raise ConfigError(
        f"Redis at {address} is a node of a Redis Cluster (INFO cluster: cluster_enabled:1), "
        "reached as a standalone Redis: the keys on its other nodes would answer MOVED for "
        "ever. Set ORGA_REDIS_CLUSTER=true (and ORGA_BROKER_URL: Celery cannot use a cluster), "
        "or point ORGA_REDIS_URL at a standalone Redis"
    )


async def _check_policy(redis: Redis, address: str, **target: Any) -> str:
    unread = ""
    try:
        policy = policy_from_config(await redis.config_get(POLICY_SETTING, **target))
    except ResponseError as exc:
        policy, unread = None, f"CONFIG GET: {exc}"
    if policy is None:
        try:
            policy = policy_from_info(await redis.info("memory", **target))
        except ResponseError as exc:
            unread = f"{unread}; INFO memory: {exc}".lstrip("; ")
    return check_eviction_policy(policy, address, unread)


def is_transient(exc: BaseException) -> bool:
    """Whether a Redis error says nothing about the entry being handled: Redis unreachable,
    loading, out of memory (``maxmemory``), busy with a script, read-only or failing to persist,
    or a Redis Cluster moving the slot of a key (``TRYAGAIN``, redirects run out; the command
    did not run). Such an entry is retried, never counted towards poison."""
    if isinstance(exc, _TRANSIENT_TYPES):
        return True
    return isinstance(exc, ResponseError) and bool(_TRANSIENT_REPLY.search(str(exc)))


@dataclass(frozen=True)
class CoordinatorSettings:
    """Timing and sizing of the coordinator loops."""

    lease_ttl_s: float = keys.lease_ttl_s
    tick_interval_s: float = 0.5
    block_ms: int = 1000
    batch: int = 64
    intake_chunk: int = 8
    """New tasks of one intake read whose create scripts are sent together (one pipeline, one
    round trip): fewer round trips, and the first dispatches of a burst sent while its later
    tasks are still parsed and decided."""
    claim_idle_ms: int = 30_000
    max_deliveries: int = 5
    transient_backoff_ms: int = 1000
    """An entry whose handling Redis refused (see :func:`is_transient`) gets its delivery back
    and may be claimed again this long after, instead of after ``claim_idle_ms``."""
    delete_applied_s: float = 0.25
    """The observations applied are deleted together (one ``XDEL`` per partition) once the
    oldest of them was applied this long ago, or when a read finds none (issue 27: one command
    less per model call); the read blocks no longer than that while some wait; at most a
    quarter of ``claim_idle_ms``, so that no claim takes one of them first (and a claim of
    one is a duplicate the fences ignore; an outage report, which is not, is deleted by its
    commit)."""
    max_loop_backoff_s: float = 8.0
    refusal_log_interval_s: float = 60.0
    """A wrong observation is logged and written as an event at most once per task and reason
    in this time (all of them are counted in ``orga_observations_refused``)."""
    journal_maxlen: int = 10_000
    events_maxlen: int = 100_000
    retention_s: float = 7 * 24 * 3600.0
    purge_interval_s: float = 1.0
    schedule_interval_s: float = 1.0
    partitions: int = 1
    """The deployment's partition count (``ORGA_PARTITIONS``); refused at start when Redis
    holds another. A running coordinator serves the partitions it leases
    (:mod:`coordinator.partition_leases`)."""
    partition_lease_ttl_s: float = float(keys.partition_lease_ttl_s)
    """A dead coordinator's partitions are taken over this long after its last renewal
    (``ORGA_PARTITION_LEASE_TTL_S``)."""
    machine: MachineSettings = field(default_factory=MachineSettings)


@dataclass
class Coordinator:
    """One coordinator process; several may run against the same Redis."""

    redis: Redis
    publisher: Transport | None = None
    """How the outbox's dispatches reach the workers (:mod:`coordinator.transport`; Celery's:
    :class:`~coordinator.relay.CeleryPublisher`); None: this process runs no relay (another
    coordinator's relay sends them)."""
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    name: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    metrics: CoordinatorMetrics | None = None
    scheduler: Scheduler | None = None
    """Fires due schedules (:mod:`coordinator.schedules`); None: one on the real clock."""

    def __post_init__(self) -> None:
        # This store keeps each conversation in Redis: reasoning requests carry a reference.
        machine = replace(self.settings.machine, conversation_by_reference=True)
        self.settings = replace(self.settings, machine=machine)
        if self.scheduler is None:
            self.scheduler = Scheduler(self.redis, partitions=self.settings.partitions)
        self.store = TaskStore(
            self.redis,
            journal_maxlen=self.settings.journal_maxlen,
            events_maxlen=self.settings.events_maxlen,
            partitions=self.settings.partitions,
        )
        self._stream_partition = {
            kind(p): p
            for p in range(self.settings.partitions)
            for kind in (keys.intake_stream, keys.observations_stream, keys.control_stream)
        }
        self.partition_leases: PartitionLeases | None = None
        """Set by :meth:`run`: the partitions this coordinator serves (None: every one)."""
        self.relay = (
            OutboxRelay(
                self.redis,
                self.publisher,
                self.name,
                partitions=self.settings.partitions,
                serving=self.serving,
            )
            if self.publisher is not None
            else None
        )
        if self.relay is not None:  # a commit's dispatches are handed to it, not read back
            self.store.dispatched = self.relay.hand
        if isinstance(self.publisher, InlineQueues) and self.publisher.inline:
            # the broker is this Redis: a commit pushes its dispatches onto the queues itself
            self.store.inline = self.publisher.inline_messages
        self._last_purge = 0.0
        self._held: set[str] = set()
        self._recreating = asyncio.Lock()
        """One loop at a time recreates the groups after a NOGROUP, so that the loops that met
        it together write one ``state_lost`` event, not one each."""
        self._last_renewal = 0.0
        self._stopping = asyncio.Event()
        depths = self.publisher if isinstance(self.publisher, QueueDepths) else None
        self._queues = QueueGauge(
            partitions=self.settings.partitions,
            broker=depths,
            rate_window_s=2 * self.settings.machine.liveness.heartbeat_interval_s,
        )
        self._refusals = RateGate(self.settings.refusal_log_interval_s)
        self._starting: set[str] = set()
        """Tasks an intake read created whose start commit waits to be sent with the others
        of the read: the tick leaves them alone (it would start them itself, the intake's
        start then conflicting and the record kept from it lost)."""

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every loop until ``stop()`` (refused at once on a Redis that evicts keys).

        Once started, the objects alive then are frozen out of the garbage collector
        (``gc.freeze``): they live as long as the process, and a full collection walked them
        all each time."""
        await check_redis_keeps_keys(self.redis)
        await check_cluster_mode(self.redis)
        await self._learn_redis_version()
        await check_layout(self.redis, self.settings.partitions)
        await adopt_legacy_schedules(self.redis)
        await self._ensure_groups()
        leases = self.partition_leases = PartitionLeases(
            self.redis,
            self.name,
            self.settings.partitions,
            ttl_s=self.settings.partition_lease_ttl_s,
            on_released=self._partitions_released,
        )
        leases.register(*_READ_LOOPS, "tick", *(self.relay.loops if self.relay is not None else ()))
        await leases.heartbeat()  # serve a share from the first read on
        # What is alive now (the modules, their schemas, the clients) lives as long as the
        # process: out of the collector's sight, a full collection no longer walks it each
        # time (about 0.15 ms of CPU per model call; docs/performance.md, issue 27).
        gc.collect()
        gc.freeze()
        loops = [self.relay.run(self._stopping)] if self.relay is not None else []
        loops += [
            self._loop(self._intake_once),
            self._loop(self._observations_once),
            self._loop(self._control_once),
            self._loop(self._tick_once, self.settings.tick_interval_s),
            self._loop(self._schedules_once, self.settings.schedule_interval_s),
            self._loop(leases.tick, self.settings.tick_interval_s),
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            with contextlib.suppress(Exception):  # unreachable: a claim finds them applied
                await self._delete_applied(at_once=True)
            with contextlib.suppress(Exception):  # unreachable: the leases expire instead
                await self._partitions_released(leases.held)  # its tasks, then the partitions
                await leases.leave()

    def serving(self, loop: str | None = None) -> frozenset[int]:
        """The partitions this coordinator works on now (every one when it was not started by
        :meth:`run`); ``loop``, one of its loops starting an iteration, says it is done with
        any partition dropped since its last look."""
        if self.partition_leases is None:
            return frozenset(range(self.settings.partitions))
        return self.partition_leases.serving(loop)

    async def _partitions_released(self, partitions: frozenset[int]) -> None:
        """Partitions this coordinator no longer holds: their tasks' leases are given back so
        that the next holder drives them at once (a lost partition's are probably gone)."""
        tasks = sorted(t for t in self._held if self.store.partition(t) in partitions)
        self._held.difference_update(tasks)
        if tasks:
            await self.store.renew_leases([], self.name, self._lease_ms, release=tasks)

    def stop(self) -> None:
        """Ask every loop to finish after its current batch."""
        self._stopping.set()

    async def _loop(self, body: Callable[[], Awaitable[None]], pause_s: float = 0.0) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                await body()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay_s = min(0.5 * 2 ** min(failures - 1, 10), self.settings.max_loop_backoff_s)
                if _lost_groups(exc):
                    await self._state_lost(exc)
                elif is_transient(exc):
                    log.warning(
                        "coordinator.redis_unavailable",
                        extra={"coordinator": self.name, "error": str(exc)[:300],
                               "retry_in_s": delay_s},
                    )  # fmt: skip
                else:
                    log.exception("coordinator.loop_failed", extra={"coordinator": self.name})
                await asyncio.sleep(delay_s)
            if pause_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause_s)

    async def _schedules_once(self) -> None:
        assert self.scheduler is not None
        await self.scheduler.fire_due()

    async def _learn_redis_version(self) -> None:
        """Read the server's version once (on a Redis Cluster the lowest of its primaries): on
        Redis 7.0.4 and later an applied observation is deleted and not acknowledged (the
        next claim drops its delivery); before, acknowledged as well (docs/performance.md)."""
        version = await redis_version(self.redis)
        self.store.acknowledge_deleted = not claim_drops_deleted(version)
        log.info(
            "coordinator.redis_version",
            extra={
                "coordinator": self.name,
                "redis_version": version or "unread",
                "acknowledge_deleted": self.store.acknowledge_deleted,
            },
        )

    async def _ensure_groups(self) -> int:
        """Create the consumer groups that do not exist yet; how many were created."""
        created = 0
        for stream in self._stream_partition:
            try:
                await self.redis.xgroup_create(
                    stream, keys.coordinator_group, id="0", mkstream=True
                )
                created += 1
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        return created

    async def _state_lost(self, exc: ResponseError) -> None:
        """Redis answered NOGROUP: it lost its data (restarted empty, flushed). Recreate the
        groups from the start of each stream, so what was sent since is served, forget what
        this process kept, and say loudly that the state before is gone."""
        self._held.clear()
        self.store.forget_kept()
        async with self._recreating:
            with contextlib.suppress(RedisError):  # unreachable again: the next loop retries
                if not await self._ensure_groups():
                    return  # another loop or coordinator recreated them and said so
                log.error(
                    "coordinator.state_lost",
                    extra={
                        "coordinator": self.name,
                        "error": str(exc)[:300],
                        "detail": "consumer groups recreated; earlier tasks and entries are gone",
                    },
                )
                await self.store.event(
                    {"task_id": "", "event": "state_lost", "coordinator": self.name,
                     "error": str(exc)[:300]}
                )  # fmt: skip
                if self.metrics is not None:
                    self.metrics.state_lost()

    def _streams(self, kind: Callable[[int], str]) -> list[str]:
        """One stream of each partition this coordinator serves (the read loop of that stream
        starting an iteration)."""
        return [kind(p) for p in sorted(self.serving(kind.__name__))]

    async def _read(
        self, kind: Callable[[int], str], block_ms: int | None = None
    ) -> list[tuple[str, list[tuple[str, dict[Any, Any]]]]]:
        """One read of a stream of each served partition: the entries of each stream that had
        some, by stream (one multi-stream ``XREADGROUP``; one per partition on a Redis Cluster,
        :func:`coordinator.streams.read_group`), blocking ``block_ms`` at most (default: the
        settings'); none served: a pause instead."""
        block_ms = self.settings.block_ms if block_ms is None else block_ms
        streams = self._streams(kind)
        if not streams:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), block_ms / 1000)
            return []
        return await read_group(
            self.redis,
            keys.coordinator_group,
            self.name,
            streams,
            count=self.settings.batch,
            block_ms=block_ms,
        )

    # -- intake ---------------------------------------------------------------------------

    async def _intake_once(self) -> None:
        """One read of the intake. A task that is no sub-agent's is created with its start
        committed (:meth:`_prepare_started`), the scripts of up to ``intake_chunk`` of them in
        one pipeline (:meth:`_send_creates`): the first dispatches are handed to the relay, and
        sent, while the read's later entries are still handled. The tasks created apart (a
        sub-agent's, one whose lease another coordinator held) are started together: their
        start commits are sent in one round trip once every entry of the read is handled (a
        task created and not started yet is started by the tick when due, as after a crash
        between the two); a start that conflicts is applied again on its own."""
        starts: list[_Start] = []
        try:
            await self._intake_read(await self._read(keys.intake_stream), starts)
        except Exception:
            with contextlib.suppress(Exception):  # the tick starts what is left
                await self._start_all(starts)
            raise
        except BaseException:
            # Cancelled (the coordinator stops): nothing more is sent, and the tick, of this
            # coordinator or another, must not skip these tasks as still starting.
            self._starting.difference_update(s.commit.record.task_id for s in starts)
            raise
        await self._start_all(starts)

    async def _intake_read(
        self, batches: list[tuple[str, list[tuple[str, dict[Any, Any]]]]], starts: list[_Start]
    ) -> None:
        """:meth:`_handle_read` for the intake: each entry in turn (:meth:`_intake`, an
        unexpected error dead-letters that entry alone), the creates it prepares sent
        ``intake_chunk`` at a time, at the end of each partition's entries, and before an
        entry that repeats a task id or an idempotency key of one waiting (:meth:`_intake`):
        no answer in a chunk depends on another's. When Redis refuses (a transient error), the
        read stops as when each create is sent alone: the refused entry and every entry not
        sent get their delivery back (those not reached, and those of the chunk in flight that
        Redis did not answer for, :meth:`_send_creates`); the chunk's entries after the
        refused one ran, and are answered, as are those after one whose answer failed (a
        duplicate's entry was acknowledged, by its script or the chunk's ``XACK``: its answer
        skipped would be lost)."""
        chunk = max(self.settings.intake_chunk, 1)
        for index, (stream, entries) in enumerate(batches):
            creates: list[_Create] = []

            async def intake(
                stream: str, entry_id: str, fields: dict[Any, Any], creates: list[_Create] = creates
            ) -> None:
                await self._intake(stream, entry_id, fields, starts, creates)

            reached = 0
            try:
                for entry_id, fields in entries:
                    await self._guarded(stream, entry_id, fields, intake)
                    reached += 1
                    if len(creates) >= chunk:
                        await self._send_creates(stream, creates, starts)
                await self._send_creates(stream, creates, starts)
            except RedisError as exc:
                if is_transient(exc):
                    unsent = [c.entry_id for c in creates]  # the chunk in flight: given back there
                    await self._give_back(stream, unsent + [e for e, _f in entries[reached:]])
                    for later, rest in batches[index + 1 :]:
                        await self._give_back(later, [e for e, _f in rest])
                raise

    async def _answered(
        self,
        stream: str,
        waiting: list[_Create],
        outcomes: list[CreateOutcome | RedisError | None],
    ) -> tuple[list[tuple[_Create, CreateOutcome | None]], RedisError | None, list[str]]:
        """The creates Redis answered: those created started leased and counted (no command),
        each under its entry's guard (:meth:`_guarded`: an unexpected error dead-letters that
        entry alone); those that failed logged. Returns the others, to finish, the first
        failure, and the entries of a transient failure (their script did not run), to give
        back (:meth:`_send_creates`, once the chunk is answered)."""
        rest: list[tuple[_Create, CreateOutcome | None]] = []
        failed: list[str] = []
        failure: RedisError | None = None
        for create, outcome in zip(waiting, outcomes, strict=True):
            if isinstance(outcome, RedisError):
                log.warning(
                    "task.create_failed",
                    extra={"task_id": create.record.task_id, "error": str(outcome)[:300]},
                )
                failure = failure or outcome
                if is_transient(outcome):
                    failed.append(create.entry_id)
            elif outcome is not None and outcome.started:

                async def started(
                    _stream: str,
                    _entry_id: str,
                    _fields: dict[Any, Any],
                    create: _Create = create,
                    outcome: CreateOutcome = outcome,
                ) -> None:
                    self._started(create.pending, outcome)

                await self._guarded(stream, create.entry_id, create.fields, started)
            else:
                rest.append((create, outcome))
        return rest, failure, failed

    async def _send_creates(
        self, stream: str, creates: list[_Create], starts: list[_Start]
    ) -> None:
        """Send the creates prepared (:meth:`TaskStore.create_started_many`, one round trip),
        count those created started and let the relay send their dispatches, then finish each
        of the others as :meth:`_intake` does after a create sent alone (a conflict refused, a
        duplicate told, a task whose lease another coordinator holds created apart).

        Every entry whose script ran is answered, each under its own guard (:meth:`_guarded`:
        an unexpected error dead-letters that entry alone, never another of the chunk nor the
        entry that flushed it): a duplicate's entry was acknowledged with the chunk, so an answer
        skipped would be lost for good. The first error (one Redis answered for a script, or
        a ``RedisError`` or ``CommitConflictError`` finishing an entry) is raised once the
        whole chunk is answered (the read stops there); a transient one gives back, once, the
        entries whose script did not run and those whose finishing failed before their entry
        was acknowledged (a refusal not written, a task not created apart). A connection lost
        on the pipeline gives every entry of the chunk back (each script run or not). A
        cancellation (the coordinator stopping) while answering still tells the duplicates
        not told yet (an event each; a second cancellation stops at once), then propagates;
        the other entries not finished are not acknowledged, and are claimed again. No two
        creates of a chunk share a task id or an idempotency key (:meth:`_intake` sends the
        chunk first), so each entry answers as it would have sent alone."""
        if not creates:
            return
        waiting = list(creates)
        creates.clear()
        try:
            outcomes = await self.store.create_started_many([c.pending for c in waiting])
        except RedisError as exc:
            if is_transient(exc):
                await self._give_back(stream, [c.entry_id for c in waiting])
            raise
        rest, failure, given_back = await self._answered(stream, waiting, outcomes)
        cancelled: asyncio.CancelledError | None = None
        try:
            await asyncio.sleep(0)  # the relay sends these dispatches before the next chunk's
        except asyncio.CancelledError as exc:
            cancelled = exc
        first = await self._finish_creates(stream, rest, starts, given_back, cancelled)
        if given_back:  # each failed transiently, its entry not acknowledged
            await self._give_back(stream, given_back)
        error = failure or first  # the first: a script's refusal comes before any finishing
        if error is not None:
            raise error

    async def _finish_creates(
        self,
        stream: str,
        rest: list[tuple[_Create, CreateOutcome | None]],
        starts: list[_Start],
        given_back: list[str],
        cancelled: asyncio.CancelledError | None,
    ) -> RedisError | CommitConflictError | None:
        """Finish every create of a chunk :meth:`_answered` left (:meth:`_send_creates`), each
        under its own guard; returns the first ``RedisError`` or ``CommitConflictError`` once
        all are done, the entries a transient one left unacknowledged added to ``given_back``.
        Cancelled (or ``cancelled`` already): only the duplicates not told yet are told (their
        entries were acknowledged), then the cancellation propagates."""
        first: RedisError | CommitConflictError | None = None
        for create, outcome in rest:
            duplicate = outcome is not None and not outcome.created and not outcome.conflict
            if cancelled is not None and not duplicate:
                continue  # not acknowledged: claimed again, by this coordinator or another

            async def finish(
                _stream: str,
                _entry_id: str,
                _fields: dict[Any, Any],
                create: _Create = create,
                outcome: CreateOutcome | None = outcome,
            ) -> None:
                if outcome is None:  # another coordinator holds its lease: created apart
                    outcome = await self.store.create(
                        create.record, ack=create.ack, lease=(self.name, self._lease_ms)
                    )
                await self._created(create.entry_id, create.text, create.record, outcome, starts)

            try:
                await self._guarded(stream, create.entry_id, create.fields, finish)
            except (RedisError, CommitConflictError) as exc:
                first = first or exc
                if isinstance(exc, RedisError) and is_transient(exc) and not duplicate:
                    given_back.append(create.entry_id)  # a duplicate's entry is acknowledged
            except asyncio.CancelledError as exc:
                if cancelled is not None:
                    raise  # a second cancellation: stop at once
                cancelled = exc
        if cancelled is not None:
            raise cancelled
        return first

    async def _start_all(self, starts: list[_Start]) -> None:
        """Send the start commits of a read in one pipeline; one that conflicted is applied
        again on its own. The first error Redis answered for one of them is raised once the
        others are done (its task is started by the tick)."""
        if not starts:
            return
        waiting = list(starts)
        starts.clear()
        failure: RedisError | None = None
        try:
            outcomes = await self.store.commit_many([s.commit for s in waiting])
            for start, outcome in zip(waiting, outcomes, strict=True):
                if outcome is True:
                    self._committed(start.commit)
                elif outcome is False:
                    await self._apply(start.commit.record.task_id, start.step)
                else:
                    log.warning(
                        "task.start_failed",
                        extra={"task_id": start.commit.record.task_id, "error": str(outcome)[:300]},
                    )
                    failure = failure or outcome
        finally:
            self._starting.difference_update(s.commit.record.task_id for s in waiting)
        if failure is not None:
            raise failure

    async def _handle_all(
        self,
        stream: str,
        entries: list[tuple[str, dict[Any, Any]]],
        handle: Callable[[str, str, dict[Any, Any]], Awaitable[None]],
    ) -> None:
        """Handle a batch in order. When Redis refuses (a transient error), the entries not
        handled get their delivery back and the error propagates: the loop backs off."""
        for index, (entry_id, fields) in enumerate(entries):
            try:
                await self._guarded(stream, entry_id, fields, handle)
            except RedisError as exc:
                if is_transient(exc):
                    await self._give_back(stream, [e for e, _f in entries[index:]])
                raise

    async def _handle_read(
        self,
        batches: list[tuple[str, list[tuple[str, dict[Any, Any]]]]],
        handle: Callable[[str, str, dict[Any, Any]], Awaitable[None]],
    ) -> None:
        """:meth:`_handle_all` for each partition's stream of a read, in turn; when Redis
        refuses, the entries of the streams not reached get their delivery back too."""
        for index, (stream, entries) in enumerate(batches):
            try:
                await self._handle_all(stream, entries, handle)
            except RedisError as exc:
                if is_transient(exc):
                    for later, rest in batches[index + 1 :]:
                        await self._give_back(later, [e for e, _f in rest])
                raise

    async def _give_back(self, stream: str, entry_ids: list[str]) -> None:
        """Undo the delivery of entries Redis refused to let us handle (XCLAIM RETRYCOUNT, which
        Redis allows even out of memory), claimable again after ``transient_backoff_ms``."""
        idle_ms = max(self.settings.claim_idle_ms - self.settings.transient_backoff_ms, 0)
        with contextlib.suppress(RedisError):  # still unreachable: the count stays one higher
            for entry_id in entry_ids:
                deliveries = await self._deliveries(stream, entry_id)
                await self.redis.xclaim(
                    stream, keys.coordinator_group, self.name, 0, [entry_id],
                    idle=idle_ms, retrycount=max(deliveries - 1, 0), justid=True,
                )  # fmt: skip

    async def _guarded(
        self,
        stream: str,
        entry_id: str,
        fields: dict[Any, Any],
        handle: Callable[[str, str, dict[Any, Any]], Awaitable[None]],
    ) -> None:
        """Handle one entry; an unexpected error dead-letters that entry, not the batch.

        Redis being unreachable is not the entry's fault: that error propagates, the entry
        stays pending and is handled again once Redis is back.
        """
        try:
            await handle(stream, entry_id, fields)
        except (RedisError, CommitConflictError):
            raise
        except Exception as exc:
            log.exception("stream.entry_failed", extra={"stream": stream, "entry_id": entry_id})
            await self._poison(stream, entry_id, fields, f"{type(exc).__name__}: {exc}")

    async def _intake(
        self,
        stream: str,
        entry_id: str,
        fields: dict[Any, Any],
        starts: list[_Start] | None = None,
        creates: list[_Create] | None = None,
    ) -> None:
        """Create the task of one intake entry and start it; with ``starts``, the start commit
        of a task created apart joins the ones sent together (:meth:`_start_all`); with
        ``creates``, a task created started is prepared and added there, sent with others
        (:meth:`_send_creates`)."""
        ack = (stream, keys.coordinator_group, entry_id)
        p = self._stream_partition[stream]
        text = {_text(k): _text(v) for k, v in fields.items()}
        task_id = text.get("task_id") or self._new_task_id(p)
        try:
            check_task_id(task_id)
        except TaskSpecError as exc:
            await self._reject(entry_id, task_id[:MAX_TASK_ID_CHARS], text, str(exc), partition=p)
            return
        if self.store.partition(task_id) != p:  # written by hand to another partition's intake
            error = (
                f"task {task_id!r} belongs to partition {self.store.partition(task_id)} of "
                f"{self.settings.partitions}, not to the intake of partition {p} it was sent to: "
                "submit it with OrgaClient or `orga submit`, or to the intake stream "
                f"{keys.intake_stream(self.store.partition(task_id))}"
            )
            await self._reject(entry_id, task_id, text, error, partition=p)
            return
        link = parent_link(text.get("task", ""))
        if link is not None and not await self._recorded_child(task_id, link):
            await self._reject(entry_id, task_id, text, _not_a_child(task_id, link), partition=p)
            return
        # A sub-agent's task is named as such (its parent's model reads the refusal).
        source = f"sub-agent task {task_id}" if link else f"intake entry {entry_id}"
        try:
            spec = await resolve_task_text(self.redis, _raw(fields, "task"), source=source)
        except TaskSpecError as exc:
            if link is not None:
                await self._tell_parent(task_id, link, str(exc))
            await self._reject(entry_id, task_id, text, str(exc), partition=p)
            return
        named = spec.delegation  # the parent the spec names, whatever its text's form
        if named is not None and named != link and not await self._recorded_child(task_id, named):
            # YAML, or JSON with the key escaped: ``parent_link`` reads neither, the spec does
            await self._reject(entry_id, task_id, text, _not_a_child(task_id, named), partition=p)
            return
        now = time.time()
        record = TaskRecord(task_id=task_id, spec=spec, created_at=now, updated_at=now)
        if named is None and creates is not None:
            if any(_shares_key(c.record, record) for c in creates):
                # a second submission of an id or a key: the first's create fully answered
                # first (refused, or created apart), as when each is sent alone
                await self._send_creates(stream, creates, starts if starts is not None else [])
            # Acknowledged after the chunk's scripts, in one XACK (TaskStore.create_started_many),
            # when the entry names its task: delivered again (that XACK lost), it finds the task
            # it created. An id drawn here is drawn anew then: its script acknowledges it.
            pending = self._prepare_started(record, ack)
            if pending is not None and text.get("task_id"):
                pending = self.store.ack_after(pending)
            if pending is not None:  # sent with others (_send_creates), then _created
                creates.append(_Create(entry_id, fields, text, record, ack, pending))
                return
        if creates:  # created apart after the creates waiting before it: ids and keys in order
            await self._send_creates(stream, creates, starts if starts is not None else [])
        # a sub-agent's is created apart, its parent checked once it is stored (_parent_ended)
        outcome = await self._create(record, ack, started=named is None and creates is None)
        await self._created(entry_id, text, record, outcome, starts)

    async def _created(
        self,
        entry_id: str,
        text: dict[str, str],
        record: TaskRecord,
        outcome: CreateOutcome,
        starts: list[_Start] | None,
    ) -> None:
        """What follows the create of a submitted task: a conflict refused, a duplicate told,
        a task created apart started (its commit joins ``starts`` when given)."""
        task_id, spec = record.task_id, record.spec
        p = self.store.partition(task_id)
        if outcome.conflict:
            error = (
                f"task id {task_id!r} is already a task, and idempotency key "
                f"{spec.idempotency_key!r} belongs to task {outcome.task_id!r}: resubmit with "
                f"the id {outcome.task_id!r}, a new id or no id (or with another key)"
            )
            # not "rejected": task ``task_id`` itself lives on, untouched
            await self._reject(
                entry_id, task_id, text, error, event="resubmission_rejected", partition=p
            )
            return
        if not outcome.created or outcome.started:
            if not outcome.created and not outcome.redelivered:  # redelivered: its own task
                await self._duplicate(task_id, outcome.task_id)
            return
        if outcome.leased:
            self._leased(task_id)
        if outcome.leased or await self._hold(task_id):  # else its holder starts it when due
            orphaned = await self._parent_ended(record)
            step = _start if orphaned is None else _cancelled(orphaned)
            if starts is None:
                await self._apply(task_id, step)
                return
            pending = await self._decide(task_id, step)
            if pending is not None:
                starts.append(_Start(pending, step))
                self._starting.add(task_id)

    async def _create(
        self, record: TaskRecord, ack: tuple[str, str, str], *, started: bool
    ) -> CreateOutcome:
        """Store a new task, leased to this coordinator if nobody holds its lease; with
        ``started``, created with its start committed when it can be (:meth:`_prepare_started`)."""
        if started:
            pending = self._prepare_started(record, ack)
            if pending is not None:
                outcome = await self.store.create_started(pending)
                if outcome is not None:
                    self._started(pending, outcome)
                    return outcome
        return await self.store.create(record, ack=ack, lease=(self.name, self._lease_ms))

    def _prepare_started(
        self, record: TaskRecord, ack: tuple[str, str, str]
    ) -> PendingCommit | None:
        """A task that is no sub-agent's, its create with its start committed and its lease
        taken, in one script (:meth:`TaskStore.create_started`), prepared on a copy of
        ``record`` (the machine changes the record it starts): no record at version 0 is
        written, read back and rewritten. None when its start decides nothing or raises:
        create it apart, as a sub-agent's (its start judged, and failing, as before)."""
        fresh = TaskRecord(
            task_id=record.task_id,
            spec=record.spec,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )
        machine = TaskMachine(fresh, fresh.created_at, self.settings.machine)
        try:
            effects = decide(machine, _start)
        except Exception:  # judged again apart, where it fails and is logged
            return None
        if not effects.changed:
            return None
        delta = self.store.conversation_delta(machine.record)
        effects.stamped(machine.record.conversation_epoch)
        dispatches = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
        return self.store.prepare(
            machine.record,
            effects,
            ack,
            dispatches,
            delta=delta,
            create=(self.name, self._lease_ms),
        )

    def _started(self, pending: PendingCommit, outcome: CreateOutcome) -> None:
        """A create prepared by :meth:`_prepare_started` was answered: a task created started
        is leased to this coordinator and its commit counted (its dispatches are the relay's
        already, :attr:`TaskStore.dispatched`). Nothing for a duplicate or a conflict."""
        if outcome.started:
            self._leased(pending.record.task_id)
            self._committed(pending)

    async def _parent_ended(self, record: TaskRecord) -> str | None:
        """For a sub-agent's task: why it must not start, its parent having ended (the parent's
        cancellation of its children may have come before the child existed). Looked at after
        the child is stored, so a parent ending later cancels it through the control stream."""
        link = record.spec.delegation
        if link is None:
            return None
        parent = keys.task_key(link.task_id, self.store.partition(link.task_id))
        status = await self.redis.hget(parent, "status")
        if status is None or _text(status) in {s.value for s in TERMINAL_STATUSES}:
            return f"its parent task {link.task_id} ended before it started"
        return None

    async def _recorded_child(self, task_id: str, link: ParentLink) -> bool:
        """Whether the parent a submitted task names recorded it as the child of that call
        (a parent records its child in the commit that submits it, so it is there first)."""
        state = await self.redis.hget(
            keys.task_key(link.task_id, self.store.partition(link.task_id)), "state"
        )
        if state is None:
            return False
        parent = TaskRecord.model_validate_json(state)
        return any(c.task_id == task_id and c.call_id == link.call_id for c in parent.children)

    async def _tell_parent(self, task_id: str, link: ParentLink, error: str) -> None:
        """A sub-agent's task the intake refuses: the parent's ``delegate`` call gets the error
        as its result (sent before the refusal is acknowledged: at least once, applied once)."""
        message = rejected_child(task_id, link, error)
        await self.redis.xadd(
            keys.observations_stream(self.store.partition(link.task_id)),
            encode_entry(message),  # type: ignore[arg-type]
            maxlen=keys.observations_maxlen, approximate=True,
        )  # fmt: skip

    def _new_task_id(self, partition: int) -> str:
        """A random task id in ``partition`` (an intake entry that names none)."""
        while True:
            task_id = uuid.uuid4().hex
            if self.store.partition(task_id) == partition:
                return task_id

    async def _reject(
        self,
        entry_id: str,
        task_id: str,
        text: dict[str, str],
        error: str,
        event: str = "rejected",
        *,
        partition: int,
    ) -> None:
        log.warning("task.rejected", extra={"task_id": task_id, "error": error})
        await self.store.reject_submission(
            entry_id, task_id, text.get("task", ""), error, event, partition=partition
        )

    async def _duplicate(self, task_id: str, existing: str) -> None:
        await self.store.event(
            {"task_id": task_id, "event": "duplicate", "existing_task_id": existing}
        )

    # -- observations ---------------------------------------------------------------------

    async def _observations_once(self) -> None:
        """One read of observations. Their commits are sent together, in one round trip, once
        every entry of the read is decided (or before deciding another entry of a task whose
        commit waits); an entry whose commit conflicts is applied again on its own.

        An entry that fails for a reason of its own (an error Redis answered for it, a commit
        conflicting 20 times) stays pending, to be reclaimed (and dead-lettered after
        ``max_deliveries``), and never holds back the others: they are decided and their
        commits sent before its error propagates."""
        waiting: list[_Decided] = []
        failures: list[Exception] = []

        async def observe(stream: str, entry_id: str, fields: dict[Any, Any]) -> None:
            try:
                await self._observation(stream, entry_id, fields, waiting, failures)
            except (RedisError, CommitConflictError) as exc:
                _own_failure(exc, stream, entry_id, failures)

        try:
            read = await self._read(keys.observations_stream, self._observations_block_ms())
            await self._handle_read(read, observe)
            await self._commit_decided(waiting, failures)
            await self._delete_applied(at_once=not read)
        except RedisError as exc:
            if is_transient(exc) and waiting:
                for stream in {d.stream for d in waiting}:
                    given = [d.entry_id for d in waiting if d.stream == stream]
                    await self._give_back(stream, given)
            raise
        if failures:
            raise failures[0]

    def _delete_after_s(self) -> float:
        """How long the observations applied wait to be deleted together: ``delete_applied_s``,
        at most a quarter of ``claim_idle_ms``."""
        settings = self.settings
        return min(settings.delete_applied_s, settings.claim_idle_ms / 4000)

    def _observations_block_ms(self) -> int:
        """The observations read's block: ``block_ms``, or less when observations applied
        are due to be deleted sooner (the read that ends then deletes them): no applied one
        waits past :meth:`_delete_after_s` for a read to end, so its own claim never takes it.
        At least 1 ms (``BLOCK 0`` would wait for ever)."""
        block_ms = self.settings.block_ms
        due_in = self.store.applied_due_in(self._delete_after_s())
        if due_in is None:
            return block_ms
        return max(min(block_ms, math.ceil(due_in * 1000)), 1)

    async def _delete_applied(self, *, at_once: bool = False) -> None:
        """Delete the observations applied (:meth:`TaskStore.delete_applied`): those applied
        :meth:`_delete_after_s` ago or more, or all of them ``at_once``."""
        await self.store.delete_applied(0.0 if at_once else self._delete_after_s())

    async def _commit_decided(self, waiting: list[_Decided], failures: list[Exception]) -> None:
        """Send the waiting commits in one pipeline. An entry whose commit was written is
        done; one that conflicted is applied again on its own; one whose commit Redis answered
        with an error (or whose application again failed) is left pending, its error added to
        ``failures``. Redis unreachable raises, the entries not done left in ``waiting``."""
        if not waiting:
            return
        outcomes = await self.store.commit_many([d.commit for d in waiting])
        decided = list(zip(waiting, outcomes, strict=True))
        waiting[:] = [d for d, outcome in decided if outcome is False]
        for done, outcome in decided:
            if outcome is True:
                self._committed(done.commit)
                if self.metrics is not None:
                    self.metrics.observed(done.message, done.dispatched_at)
            elif isinstance(outcome, RedisError):
                _own_failure(outcome, done.stream, done.entry_id, failures)
        for again in list(waiting):
            stream = again.stream
            try:
                await self._guarded(stream, again.entry_id, again.fields, self._observation)
            except (RedisError, CommitConflictError) as exc:
                _own_failure(exc, stream, again.entry_id, failures)
            waiting.remove(again)

    async def _observation(
        self,
        stream: str,
        entry_id: str,
        fields: dict[Any, Any],
        waiting: list[_Decided] | None = None,
        failures: list[Exception] | None = None,
    ) -> None:
        """Apply one observation; with ``waiting``, its commit joins the commits waiting to be
        sent together (:meth:`_commit_decided`, adding the errors of other entries to
        ``failures``)."""
        ack = (stream, keys.coordinator_group, entry_id)
        try:
            message = decode_entry(fields)
        except WireFormatError as exc:
            await self._poison(stream, entry_id, fields, str(exc))
            return
        task_id = message.fence.task_id
        # An outage report applied again would be counted again (the dispatch it holds keeps
        # its fence): deleted in its commit, not later with the others (delete_applied).
        now = isinstance(message, WorkerFailedMessage) and message.error_kind in OUTAGE_KINDS
        wrong: list[str | None] = ["unknown_task"]  # what the last look at the record said
        dispatched_at: list[float | None] = [None]  # when the dispatch it answers went out

        def route(machine: TaskMachine) -> Effects:
            awaiting = machine.record.awaiting
            dispatched_at[0] = awaiting.dispatched_at if awaiting is not None else None
            effects = machine.on_answer(message)
            wrong[0] = None if effects.changed else _wrong(machine.record, message.fence)
            return effects

        if waiting is None:
            applied = await self._apply(task_id, route, ack=ack, delete_now=now)
            if applied and self.metrics is not None:
                self.metrics.observed(message, dispatched_at[0])
        else:
            if any(d.commit.record.task_id == task_id for d in waiting):
                # decided on the record it commits
                await self._commit_decided(waiting, [] if failures is None else failures)
            pending = await self._decide(task_id, route, ack, delete_now=now)
            if pending is not None:
                waiting.append(
                    _Decided(stream, entry_id, fields, message, dispatched_at[0], pending)
                )
            applied = pending is not None
        if not applied:  # a stale or duplicate answer: nothing keeps it
            await self.store.drop_observation(entry_id, partition=self._stream_partition[stream])
            if wrong[0] is not None:
                await self._refused(message, wrong[0])

    async def _refused(self, message: AnyMessage, reason: str) -> None:
        """Count a wrong observation; log it and write an ``observation_refused`` event, at
        most once per task and reason every ``refusal_log_interval_s``."""
        if self.metrics is not None:
            self.metrics.refused(reason)
        fence = message.fence
        task_id = fence.task_id[:128]
        held = self._refusals.admit(f"{task_id}|{reason}", time.monotonic())
        if held is None:
            return
        fields = {"task_id": task_id, "reason": reason, "fence": fence.token()[:300],
                  "kind": message.kind, "held_back": str(held)}  # fmt: skip
        log.warning("observation.refused", extra=fields)
        await self.store.event({**fields, "event": "observation_refused"})

    async def _poison(self, stream: str, entry_id: str, fields: dict[Any, Any], error: str) -> None:
        log.warning("stream.poison", extra={"stream": stream, "entry_id": entry_id, "error": error})
        raw = {_text(k): _text(v) for k, v in fields.items()}
        await self.store.dead_letter_entry(
            stream, entry_id, raw, error, partition=self._stream_partition.get(stream, 0)
        )

    async def _reclaim(
        self, stream: str, handle: Callable[[str, str, dict[Any, Any]], Awaitable[None]]
    ) -> None:
        """Claim the stream's entries pending longer than ``claim_idle_ms`` (a dead or stuck
        coordinator's) and handle them; an entry delivered too often is dead-lettered. On Redis
        7.0.4 and later the deliveries of entries deleted while pending (every observation
        applied or dropped: it is deleted, not acknowledged) are dropped by the same
        ``XAUTOCLAIM``, whatever their idle time, and its count includes them (before 7.0.4
        they are acknowledged too; Redis 6.2 answers a nil, no id, for an entry trimmed while
        pending: skipped, it stays pending). It pages on while pages come back full, up to
        :data:`_CLAIM_PAGES`, and until ``batch`` entries were claimed (as many as one page
        claimed before)."""
        start, claimed = "0-0", 0
        for _page in range(_CLAIM_PAGES):
            start, full, got = await self._claim_page(stream, start, handle)
            claimed += got
            if not full or start == "0-0" or claimed >= self.settings.batch:
                return

    async def _claim_page(
        self,
        stream: str,
        start: str,
        handle: Callable[[str, str, dict[Any, Any]], Awaitable[None]],
    ) -> tuple[str, bool, int]:
        """One ``XAUTOCLAIM`` page from ``start``: the next page's start, whether this one was
        full (claimed and dropped entries), and how many entries it claimed and handled."""
        count = self.settings.batch
        next_id, entries, *rest = await self.redis.xautoclaim(
            stream, keys.coordinator_group, self.name,
            min_idle_time=self.settings.claim_idle_ms, start_id=start, count=count,
        )  # fmt: skip
        dropped = len(rest[0]) if rest and rest[0] else 0  # Redis 7: deleted while pending

        async def poison_or_handle(stream: str, entry_id: str, fields: dict[Any, Any]) -> None:
            deliveries = await self._deliveries(stream, entry_id)
            if deliveries > self.settings.max_deliveries:
                error = f"delivered {deliveries} times without being applied"
                await self._poison(stream, entry_id, fields, error)
            else:
                await handle(stream, entry_id, fields)

        if any(raw_id is None for raw_id, _ in entries):
            await self._forget_deleted(stream, start, _text(next_id), entries)
        for raw_id, fields in entries:
            if raw_id is not None and fields is None:  # deleted while pending, its id given
                await self.redis.xack(stream, keys.coordinator_group, _text(raw_id))
        claimed = [(_text(i), f) for i, f in entries if i is not None and f is not None]
        await self._handle_all(stream, claimed, poison_or_handle)
        return _text(next_id), len(entries) + dropped >= count, len(claimed)

    async def _forget_deleted(
        self, stream: str, start: str, end: str, entries: Sequence[tuple[Any, Any]]
    ) -> None:
        """Acknowledge the deliveries of a claim page's entries deleted or trimmed while
        pending, which Redis 6.2 answers with a nil and no id: their ids are the page's pending
        ids (``XPENDING`` over the page's range) whose entries are gone (an empty ``XRANGE``).
        Left pending, they would come back in every claim and, once more of them than the
        claim's pages hold, keep a dead coordinator's answers behind them from being claimed."""
        claimed = {_text(i) for i, _ in entries if i is not None}
        pending = await self.redis.xpending_range(
            stream, keys.coordinator_group, min=start, max="+" if end == "0-0" else end,
            count=10 * self.settings.batch,  # XAUTOCLAIM looks at up to 10 x COUNT entries
        )  # fmt: skip
        candidates = [i for i in (_text(p["message_id"]) for p in pending) if i not in claimed]
        if not candidates:
            return
        pipe = self.redis.pipeline(transaction=False)
        for entry_id in candidates:
            pipe.xrange(stream, min=entry_id, max=entry_id, count=1)
        found = await pipe.execute()
        gone = [i for i, rows in zip(candidates, found, strict=True) if not rows]
        if gone:
            await self.redis.xack(stream, keys.coordinator_group, *gone)
            log.debug(
                "coordinator.claim_forgot_deleted",
                extra={"coordinator": self.name, "stream": stream, "entries": len(gone)},
            )

    async def _deliveries(self, stream: str, entry_id: str) -> int:
        pending = await self.redis.xpending_range(
            stream, keys.coordinator_group, min=entry_id, max=entry_id, count=1
        )
        return int(pending[0]["times_delivered"]) if pending else 0

    # -- control --------------------------------------------------------------------------

    async def _control_once(self) -> None:
        await self._handle_read(await self._read(keys.control_stream), self._control)

    async def _control(self, stream: str, entry_id: str, fields: dict[Any, Any]) -> None:
        text = {_text(k): _text(v) for k, v in fields.items()}
        ack = (stream, keys.coordinator_group, entry_id)
        task_id = text.get("task_id", "")
        action = text.get("action")
        try:
            if action == "review":
                decision = _decision(text.get("decision", ""))
                by = check_reviewer(text.get("by", "cli"))
                applied = await self._apply(
                    task_id,
                    lambda m: _from_entry(
                        m.on_review_decision(
                            text.get("review_id", ""),
                            decision,
                            text.get("hint") or None,
                            by,
                            arguments=text.get("arguments") or None,
                        ),
                        entry_id,
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
            await self._control_rejected(stream, entry_id, task_id, str(exc))

    async def _control_rejected(self, stream: str, entry_id: str, task_id: str, error: str) -> None:
        await self.store.refuse_control(
            entry_id, task_id, error, partition=self._stream_partition[stream]
        )

    # -- ticks ----------------------------------------------------------------------------

    async def _tick_once(self) -> None:
        served = sorted(self.serving("tick"))
        for p in served:
            await self._reclaim(keys.observations_stream(p), self._observation)
            await self._reclaim(keys.intake_stream(p), self._intake)
            await self._reclaim(keys.control_stream(p), self._control)
        await self._renew_leases()
        await self._purge(served)
        due = await self.store.due_task_ids(time.time(), self.settings.batch * 4, served)
        if due:
            await self._queues.sample(self.redis)
        for task_id in due:
            if task_id in self._starting:
                continue  # started by the intake read that created it
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
        queue = machine.awaited_queue()
        # a reasoning that chains its one call is answered by the tool worker that runs it;
        # its answer marks say whether it did (keys.answered_via_member)
        awaiting = record.awaiting
        chains = awaiting is not None and awaiting.kind is AwaitKind.REASON and awaiting.chained
        marks = (
            [keys.answered_via_member(i, v) for i in ids for v in keys.ANSWERED_VIAS]
            if chains
            else []
        )
        scores = await self.redis.zmscore(keys.heartbeats_key, [*ids, *marks])
        return Liveness(
            scores=dict(zip(ids, scores[: len(ids)], strict=True)),
            marks=dict(zip(marks, scores[len(ids) :], strict=True)),
            queue=queue,
            queue_depth=self._queues.depth(queue),
            drain_per_s=self._queues.drain_per_s(queue),
            observations=self._queues.progress(self.store.partition(task_id)),
            chains=chains,
            chained_depth=self._queues.depth(keys.tools_queue),
            chained_drain_per_s=self._queues.drain_per_s(keys.tools_queue),
        )

    async def _hold(self, task_id: str) -> bool:
        """True when this coordinator holds (or has just taken over) the task's lease."""
        if task_id in self._held:
            return True
        if await self.store.acquire_lease(task_id, self.name, self._lease_ms):
            self._leased(task_id)
            return True
        return False

    def _leased(self, task_id: str) -> None:
        log.info("lease.acquired", extra={"task_id": task_id, "coordinator": self.name})
        self._held.add(task_id)

    @property
    def _lease_ms(self) -> int:
        return int(self.settings.lease_ttl_s * 1000)

    async def _renew_leases(self) -> None:
        now = time.monotonic()
        if now - self._last_renewal < self.settings.lease_ttl_s / 3:
            return
        self._last_renewal = now
        # one script call per partition: a task finished by another coordinator has its
        # lease released, a lease lost (expired, taken over) is dropped
        lost, ended = await self.store.renew_held(sorted(self._held), self.name, self._lease_ms)
        self._held.difference_update(lost)
        self._held.difference_update(ended)
        # what this coordinator kept of them is not kept current any more (another may commit
        # them, or create a new task of the id once purged): loaded again when next needed
        self.store.drop_kept(lost)
        self.store.drop_kept(ended)

    async def _purge(self, partitions: list[int]) -> None:
        """Delete the served partitions' finished tasks older than the retention (state,
        journal, aliases)."""
        now = time.monotonic()
        if now - self._last_purge < self.settings.purge_interval_s:
            return
        self._last_purge = now
        await self.store.forget_heartbeats(time.time() - keys.heartbeats_retention_s)
        retained = time.time() - self.settings.retention_s
        purged = await self.store.purge_finished(retained, partitions=partitions)
        if purged:
            log.info("tasks.purged", extra={"count": purged, "coordinator": self.name})

    def _released(self, record: TaskRecord) -> None:
        """A task that ended is no longer held: its lease, left in Redis by the commit, is
        not renewed again and expires by its TTL (nothing to release)."""
        if record.terminal:
            self._held.discard(record.task_id)

    # -- applying -------------------------------------------------------------------------

    async def _apply(
        self,
        task_id: str,
        step: Callable[[TaskMachine], Effects],
        ack: tuple[str, str, str] | None = None,
        *,
        delete_now: bool = False,
    ) -> bool:
        """Load, transition, then commit with the dispatches (retrying on conflict).

        False: no such task, or the machine ignored the input.
        """
        for _ in range(20):
            pending = await self._decide(task_id, step, ack, delete_now=delete_now)
            if pending is None:
                return False
            try:
                await self.store.commit_prepared(pending)
            except CommitConflictError:
                continue
            self._committed(pending)
            return True
        raise CommitConflictError(f"task {task_id}: gave up after 20 conflicting commits")

    async def _decide(
        self,
        task_id: str,
        step: Callable[[TaskMachine], Effects],
        ack: tuple[str, str, str] | None = None,
        *,
        delete_now: bool = False,
    ) -> PendingCommit | None:
        """Load and transition: the commit to send (the record at its new version, with the
        dispatches), or None when there is no such task or the machine ignored the input.
        ``delete_now``: the observation ``ack`` names is deleted by the commit
        (:meth:`TaskStore.prepare`).

        The record kept from this coordinator's last commit of the task is used without asking
        Redis whether it is still current: the commit's compare-and-set refuses it if it is
        not, and an input the machine ignores or refuses (raises) is answered so only once the
        version it was judged against is confirmed (judged again on the stored record else).
        """
        for _ in range(20):
            record = self.store.take_kept(task_id)
            confirmed = record is None
            if record is None:
                record = await self.store.load(task_id)
                if record is None:
                    return None
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
                return None
            delta = self.store.conversation_delta(machine.record)
            effects.stamped(machine.record.conversation_epoch)
            dispatches = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
            return self.store.prepare(
                machine.record, effects, ack, dispatches, delta=delta, delete_now=delete_now
            )
        raise CommitConflictError(f"task {task_id}: judged 20 times on records changed since")

    def _committed(self, pending: PendingCommit) -> None:
        self._released(pending.record)
        if self.metrics is not None:
            self.metrics.record(pending.record, pending.effects)

    async def _stale(self, record: TaskRecord, confirmed: bool) -> bool:
        """Whether a kept record's verdict must be redone: it was never confirmed current and
        Redis now holds another version."""
        return not confirmed and not await self.store.is_current(record)


@dataclass(frozen=True, slots=True, eq=False)
class _Decided:
    """An observation decided, its commit waiting to be sent with the others of its read."""

    stream: str
    entry_id: str
    fields: dict[Any, Any]
    message: AnyMessage
    dispatched_at: float | None
    commit: PendingCommit


def _shares_key(first: TaskRecord, second: TaskRecord) -> bool:
    """Whether two new tasks name the same task id or the same idempotency key: the answer to
    the second's create depends on what the first's wrote."""
    key = first.spec.idempotency_key
    return first.task_id == second.task_id or (
        key is not None and key == second.spec.idempotency_key
    )


@dataclass(frozen=True, slots=True, eq=False)
class _Create:
    """An intake entry's task, its create with its start committed prepared, waiting to be sent
    with others of its read (:meth:`Coordinator._send_creates`, which names the stream)."""

    entry_id: str
    fields: dict[Any, Any]
    text: dict[str, str]
    record: TaskRecord
    """The task as submitted (created apart from it if another coordinator holds its lease)."""
    ack: tuple[str, str, str]
    pending: PendingCommit


@dataclass(frozen=True, slots=True, eq=False)
class _Start:
    """A task created by an intake read, its start commit waiting to be sent with the others
    of the read (``step``: applied again on its own if that commit conflicts)."""

    commit: PendingCommit
    step: Callable[[TaskMachine], Effects]


async def check_layout(redis: Redis, partitions: int) -> int:
    """Store the deployment's partition count if none is (``SET NX``) and refuse another one
    (ConfigError naming both); refuse a Redis still holding work of the layout before
    partitions (tasks active, intake entries not handled, dispatches not published), which
    this version would never drive: the deployment must be drained with the old version."""
    await redis.set(keys.partitions_key, partitions, nx=True)
    check_partitions(await redis.get(keys.partitions_key), partitions, "coordinator")
    found: list[str] = []
    if await redis.scard(keys.legacy_active_tasks_key):
        found.append(f"{keys.legacy_active_tasks_key} (tasks still active)")
    if await redis.xlen(keys.legacy_outbox_stream):
        found.append(f"{keys.legacy_outbox_stream} (dispatches not published)")
    if await redis.exists(keys.legacy_intake_stream):
        groups = cast("list[dict[Any, Any]]", await redis.xinfo_groups(keys.legacy_intake_stream))
        for group in groups:
            lag = group.get("lag", 0)  # None: unknown (entries deleted); absent before Redis 7
            if int(group.get("pending") or 0) or lag is None or int(lag):
                found.append(f"{keys.legacy_intake_stream} (submissions not handled)")
                break
    if found:
        raise legacy_layout_error(found)
    return partitions


_CLAIM_PAGES = 16
"""At most this many ``XAUTOCLAIM`` pages (of ``batch`` entries) per stream and tick: the
deliveries of up to 16 x 64 observations deleted while pending dropped per tick (2,048 a
second per partition at the default 0.5 s tick), far above a partition's observation rate."""

_READ_LOOPS = (keys.intake_stream.__name__, keys.observations_stream.__name__,
               keys.control_stream.__name__)  # fmt: skip
"""The read loops, named after the stream they read (:meth:`Coordinator._streams`)."""


def _wrong(record: TaskRecord, fence: Fence) -> str | None:
    """Why an observation the task ignored could not come from any of its dispatches (None:
    it may be a late or duplicate answer to one, which is normal)."""
    steps = {s.spec.id for s in record.steps} | {PLAN_FENCE_STEP}
    if fence.step_id not in steps:
        return "unknown_step"
    if fence.attempt > record.dispatches:
        return "never_dispatched"
    awaited = record.awaiting.fence if record.awaiting is not None else None
    if awaited is not None and fence.attempt == awaited.attempt and fence.nonce != awaited.nonce:
        return "nonce_mismatch"
    return None


def _own_failure(exc: Exception, stream: str, entry_id: str, failures: list[Exception]) -> None:
    """An entry of a read failed: an error of its own (it stays pending, reclaimed later) is
    logged and added to ``failures``, raised once the read's other entries are done; Redis
    unreachable or refusing writes, or the consumer group lost, raises now."""
    if _lost_groups(exc) or (isinstance(exc, RedisError) and is_transient(exc)):
        raise exc
    log.warning(
        "stream.entry_failed",
        extra={"stream": stream, "entry_id": entry_id, "error": f"{type(exc).__name__}: {exc}"},
    )
    failures.append(exc)


def _lost_groups(exc: BaseException) -> TypeGuard[ResponseError]:
    """Redis no longer has the coordinators' consumer group (or its stream)."""
    return isinstance(exc, ResponseError) and str(exc).startswith("NOGROUP")


def _decision(value: str) -> ReviewDecision:
    for decision in get_args(ReviewDecision):
        if value == decision:
            return cast("ReviewDecision", decision)
    raise ValueError(
        f"unknown review decision {value!r}; use retry, skip or abort (approve or revise for "
        "a step's result; approve, edit, reject or abort for a held tool call)"
    )


def _from_entry(effects: Effects, entry_id: str) -> Effects:
    """Name the control entry in the ``review_decided`` event, so its sender knows it was its
    decision that was applied."""
    for event in effects.events:
        if event.get("event") == "review_decided":
            event["entry_id"] = entry_id
    return effects


def _start(machine: TaskMachine) -> Effects:
    return machine.start()


def _not_a_child(task_id: str, link: ParentLink) -> str:
    """The intake's refusal of a task naming a parent that did not create it for that call."""
    return (
        f"task {task_id!r} names task {link.task_id!r} as its parent (delegation), "
        "which did not create it: that field is set by the runtime; remove it"
    )


def _cancelled(reason: str) -> Callable[[TaskMachine], Effects]:
    return lambda machine: machine.cancel(reason)


def _text(value: Any) -> str:
    """A field for display and ids (invalid UTF-8 shown as U+FFFD; a task is read by _raw)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _raw(fields: dict[Any, Any], name: str) -> str | bytes:
    """A field as Redis gave it (bytes): the task's text is decoded strictly where it is
    validated, so invalid UTF-8 is refused naming its offset, never replaced."""
    value = next((v for k, v in fields.items() if _text(k) == name), "")
    return value if isinstance(value, bytes | str) else str(value)
