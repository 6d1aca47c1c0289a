"""A live reshard of the Redis Cluster under orga's own load (issue 25, "Past one Redis").

A private cluster of 3 masters and 3 replicas (:mod:`tests.redis_cluster`), 16 partitions,
Celery's broker on a private standalone Redis, a worker and two ``orga coordinator`` processes
(:class:`tests.integration.test_cluster.OnCluster`). While 40 scripted tasks of 3 tool calls
each run, the slots of every partition whose hash tag ``{p:NN}`` one master holds, and 3,000
more of its slots, are moved to another master, live, with the protocol ``redis-cli --cluster
reshard`` drives (:meth:`RedisCluster.migrate_slots`): the partitions' keys one at a time with
a pause between them, so that the coordinators' commit scripts, their consumer groups' reads
and claims, the relays and the workers' publish meet slots partly moved (``ASK``,
``TRYAGAIN``) and then moved (``MOVED``).

Asserted: every task completes; no iteration is applied twice (the journals); no dead letter;
no consumer group was recreated (``state_lost``) and each stream moved kept its groups, their
last delivered id and their pending entries across its ``MIGRATE``; at the end no stream entry
is left pending or undelivered.

Two more tests hold one partition's slot half moved and look at what the processes' clients
meet there: redis-py 8.2's asyncio ``RedisCluster`` fails a command on a key already moved with
``ClusterError: TTL exhausted`` once its pool holds several connections to the new node (it
sends ``ASKING`` on another connection than the command), a script whose keys are split with
the same error after ``TRYAGAIN``s, a ``MULTI`` with ``MovedError``; none of them ran. The
coordinator takes every one for transient (the entry is given back, never counted towards
poison) and a worker's publish waits it out (published once, after the slot moved).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from bench.chaos import ChaosPlan
from coordinator.service import is_transient
from orga.embedded_redis import EmbeddedRedis
from orga.redis_client import RedisClients
from shared import keys
from shared.protocol import Fence, WorkerFailedMessage
from shared.settings import OrgaSettings
from tests.integration.harness import assert_journal_is_clean, wait_until
from tests.integration.test_cluster import PARTITIONS, OnCluster, _free_port
from tests.redis_cluster import MigratedKey, RedisCluster
from workers.providers.settings import ProviderSettings
from workers.runtime import ProcessServices
from workers.tasks import SLOT_MOVING_ERRORS, _publish

pytestmark = pytest.mark.integration

TASKS = 40
PLAN = ChaosPlan(iterations=3, command="sleep 0.05; echo step-{i}")
BULK_SLOTS = 3_000
"""Slots moved besides the partitions' own (the issue filer's reshard was 3,000 slots)."""
KEY_PAUSE_S = 0.02
"""Between two keys of a partition's slot: the slot stays partly moved under the load."""
HOLD_S = 1.0
"""How long each partition's slot stays with half its keys moved (every access to a moved key
is redirected, every script or ``MULTI`` whose keys are split refused with ``TRYAGAIN``)."""
HOLD_PUBLISH_S = 8.0
"""Longer than redis-py's own retries of a ``MULTI`` refused on a slot being moved (4.7 s
measured), so that the publish meets the error."""


@pytest.fixture(scope="module")
def deployment(
    redis_cluster: RedisCluster, broker: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OnCluster]:
    """A worker and two coordinators on the cluster (every node in their URL), 16 partitions."""
    running = OnCluster(
        redis_cluster.urls, tmp_path_factory.mktemp("reshard"), broker.url, _free_port()
    )
    try:
        running.worker(concurrency=4)
        running.coordinator(name="c1")
        running.coordinator(name="c2")
        yield running
    finally:
        running.stop()


def _slot(cluster: RedisCluster, key: str) -> int:
    with redis.Redis(port=cluster.ports[0], socket_timeout=5) as client:
        return int(client.execute_command("CLUSTER", "KEYSLOT", key))


class Reshard(threading.Thread):
    """Moves the slots in a thread of its own while the tasks run; what it met is kept."""

    def __init__(
        self,
        cluster: RedisCluster,
        plan: list[tuple[list[int], bool]],
        source: int,
        target: int,
        hold_s: float = HOLD_S,
    ):
        super().__init__(name="reshard", daemon=True)
        self.cluster, self.plan, self.source, self.target = cluster, plan, source, target
        self.hold_s = hold_s
        self.moved: list[MigratedKey] = []
        self.error: BaseException | None = None
        self.took_s = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            for slots, slowly in self.plan:  # the partitions' slots slowly, the others at once
                self.cluster.migrate_slots(
                    slots, self.source, self.target, on_key=self.moved.append,
                    key_pause_s=KEY_PAUSE_S if slowly else 0.0,
                    hold_s=self.hold_s if slowly else 0.0,
                )  # fmt: skip
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.took_s = time.monotonic() - started


def test_a_live_reshard_under_load_loses_nothing_and_applies_nothing_twice(
    redis_cluster: RedisCluster, deployment: OnCluster
) -> None:
    client = deployment.client()
    tags = {p: _slot(redis_cluster, keys.partition_tag(p)) for p in range(PARTITIONS)}
    masters = redis_cluster.masters()
    held = {port: set(redis_cluster.slots_of(port)) for port in masters}
    source = max(masters, key=lambda port: sum(s in held[port] for s in tags.values()))
    target = next(port for port in masters if port != source)
    partitions = sorted(p for p, slot in tags.items() if slot in held[source])
    assert len(partitions) >= 3, (tags, held.keys())
    partition_slots = [tags[p] for p in partitions]
    bulk = [s for s in sorted(held[source]) if s not in partition_slots][:BULK_SLOTS]
    # the partitions' slots first and last: moved while the load is on, whatever its pace
    half = len(partition_slots) // 2
    plan = [(partition_slots[:half], True), (bulk, False), (partition_slots[half:], True)]
    slots = [slot for some, _slowly in plan for slot in some]

    task_ids = [client.submit(PLAN.task(i)) for i in range(TASKS)]
    on_source = [t for t in task_ids if keys.partition_of(t, PARTITIONS) in partitions]
    assert on_source, "no task in a partition that moves"
    wait_until(lambda: _applied(client, task_ids) > 0, 60, "the first commits")
    reshard = Reshard(redis_cluster, plan, source, target)
    reshard.start()

    reshard.join(timeout=60)
    assert not reshard.is_alive(), "the reshard did not end"
    assert reshard.error is None, repr(reshard.error)
    deadline = time.monotonic() + 60
    results: dict[str, Any] = {}
    for task_id in task_ids:
        results[task_id] = client.wait(task_id, timeout_s=max(deadline - time.monotonic(), 1))
    during = [t for t in task_ids if results[t].get("status") != "completed"]
    assert not during, (during, [results[t] for t in during][:3], deployment.logs())

    # the slots moved, the partitions' keys with them, while tasks were still running
    assert set(slots) <= set(redis_cluster.slots_of(target)), "slots not moved"
    assert not set(slots) & set(redis_cluster.slots_of(source))
    streams = [k for k in reshard.moved if k.groups_before]
    moved_tags = {keys.partition_tag(p) for p in partitions}
    assert {t for t in moved_tags if any(t in k.key for k in streams)} == moved_tags, streams

    # nothing applied twice, no attempt spent on the reshard, no dead letter, no group recreated
    failed = []
    for task_id in task_ids:
        journal = client.journal(task_id)
        assert_journal_is_clean(journal)
        failed += [(task_id, e.event) for e in journal if e.event.type == "DispatchFailed"]
    assert not failed, failed
    dead = {p: client.redis.xlen(keys.dead_letter_stream(p)) for p in range(PARTITIONS)}
    assert not any(dead.values()), dead
    events = [f for _i, f in client.events(count=100_000)]
    lost = [f for f in events if f.get("event") == "state_lost"]
    assert not lost, lost
    # no dispatch lost to the reshard (a worker whose start mark or answer Redis refused)
    resent = [f for f in events if f.get("event") in ("dispatch_lost", "redispatched")]
    assert not resent, resent
    assert "state_lost" not in "".join(p.log.read_text() for p in deployment.processes)

    # each stream moved kept its groups and their last delivered ids (none recreated)
    for moved in streams:
        assert moved.groups_after.keys() == moved.groups_before.keys(), moved
        for group, (last, _pending) in moved.groups_before.items():
            assert _id(moved.groups_after[group][0]) >= _id(last), moved

    # and at the end nothing is left pending or undelivered on any partition's stream
    wait_until(lambda: not _backlog(client), 30, f"the streams drained: {_backlog(client)}")

    pending_moved = sum(p for k in streams for _l, p in k.groups_before.values())
    print(
        f"RESULT reshard_slots_moved {len(slots)}\n"
        f"RESULT reshard_keys_moved {len(reshard.moved)}\n"
        f"RESULT reshard_streams_moved {len(streams)}\n"
        f"RESULT reshard_pending_entries_moved {pending_moved}\n"
        f"RESULT reshard_seconds {reshard.took_s:.1f}\n"
        f"RESULT reshard_tasks_on_moved_partitions {len(on_source)}",
        file=sys.stderr,
    )


def _applied(client: Any, task_ids: list[str]) -> int:
    """How many of the first tasks the coordinators have created."""
    return sum(
        1
        for t in task_ids[:5]
        if client.redis.exists(keys.task_key(t, keys.partition_of(t, PARTITIONS)))
    )


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _backlog(client: Any) -> list[str]:
    """Every group of every partition's streams with entries pending or not yet delivered."""
    left = []
    for p in range(PARTITIONS):
        for stream in (keys.intake_stream(p), keys.observations_stream(p),
                       keys.control_stream(p), keys.outbox_stream(p)):  # fmt: skip
            if not client.redis.exists(stream):
                continue
            for group in client.redis.xinfo_groups(stream):
                if int(group["pending"]) or (group.get("lag") or 0):
                    left.append(f"{stream} {group['name']} pending {group['pending']} "
                                f"lag {group.get('lag')}")  # fmt: skip
    return left


# -- one slot held half moved ------------------------------------------------------------------


class HalfMoved:
    """Partition ``partition``'s slot moved from its master to another, holding with half its
    keys moved for ``hold_s`` (a thread): ``with HalfMoved(...) as held: ...`` runs the body
    while it holds."""

    def __init__(self, cluster: RedisCluster, partition: int, hold_s: float) -> None:
        self.cluster, self.hold_s = cluster, hold_s
        self.tag = keys.partition_tag(partition)
        self.slot = _slot(cluster, self.tag)
        masters = cluster.masters()
        self.source = next(p for p in masters if self.slot in cluster.slots_of(p))
        self.target = next(p for p in masters if p != self.source)
        self.thread = Reshard(
            cluster, [([self.slot], True)], self.source, self.target, hold_s=hold_s
        )
        self.moved_key = self.unmoved_key = ""

    def __enter__(self) -> HalfMoved:
        with redis.Redis(port=self.source, socket_timeout=5) as source:
            held = int(source.execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot))
            # more fillers than half the slot's keys: whatever order the keys move in (an
            # earlier test's task keys may share the slot), a filler string stays unmoved
            fillers = [f"orga:{self.tag}:filler:{n}" for n in range(held + 6)]
            for n, name in enumerate(fillers):
                source.set(name, n)
            half = int(source.execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot)) // 2
        self.thread.start()
        try:
            wait_until(lambda: len(self.thread.moved) >= half, 30, "half the slot's keys moved")
            moved = {k.key for k in self.thread.moved}
            # fillers on both sides (strings: a GET of a task's hash would answer WRONGTYPE)
            self.moved_key = next(name for name in fillers if name in moved)
            self.unmoved_key = next(name for name in fillers if name not in moved)
        except BaseException:
            self.thread.join(60)  # the slot finishes moving: the next test starts on a stable one
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the slot never finished moving"
        assert self.thread.error is None, repr(self.thread.error)


def _partition_of_a_master(cluster: RedisCluster) -> int:
    """The partition whose slot holds the fewest keys (it is half moved soonest)."""
    counts: dict[int, int] = {}
    for port in cluster.masters():
        held = set(cluster.slots_of(port))
        with redis.Redis(port=port, socket_timeout=5) as master:
            for p in range(PARTITIONS):
                slot = _slot(cluster, keys.partition_tag(p))
                if slot in held:
                    counts[p] = int(master.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    return min(counts, key=lambda p: (counts[p], p))


async def _warm(client: Any, cluster: RedisCluster) -> None:
    """Several pooled connections to every master (a busy process's pool)."""
    await client.initialize()
    names = [f"warm:{n}" for n in range(60)]
    await asyncio.gather(*(client.get(name) for name in names))


def test_what_a_slot_half_moved_makes_the_client_raise_is_transient(
    redis_cluster: RedisCluster,
) -> None:
    """On a slot half moved the asyncio cluster client either answers or raises an error that
    said the command did not run: each is transient to the coordinator and ridden out by a
    worker (SLOT_MOVING_ERRORS)."""
    partition = _partition_of_a_master(redis_cluster)

    async def meet(tag: str, moved_key: str, unmoved: str) -> list[BaseException]:
        client = RedisClients(redis_cluster.url, cluster=True).asyncio(decode_responses=True)
        try:
            await _warm(client, redis_cluster)
            split = client.register_script("return redis.call('MGET', KEYS[1], KEYS[2])")
            multi = client.pipeline(transaction=True)
            multi.get(moved_key)
            multi.set(f"orga:{tag}:new", 1)
            met = []
            for call in (
                client.get(moved_key),
                client.set(f"orga:{tag}:fresh", 1),
                split(keys=[moved_key, unmoved]),
                multi.execute(),
            ):
                try:
                    met.append(await call)
                except Exception as exc:
                    met.append(exc)
        finally:
            await client.aclose()
        return [m for m in met if isinstance(m, BaseException)]

    with HalfMoved(redis_cluster, partition, hold_s=6.0) as held:
        errors = asyncio.run(meet(held.tag, held.moved_key, held.unmoved_key))
    assert all(is_transient(e) for e in errors), errors
    assert all(isinstance(e, SLOT_MOVING_ERRORS) for e in errors), errors
    print(f"met on a slot half moved: {[f'{type(e).__name__}: {e}' for e in errors]}")


def test_a_workers_publish_waits_out_a_slot_half_moved(redis_cluster: RedisCluster) -> None:
    """A worker publishing an answer for a task of a partition whose slot is half moved: the
    transaction is refused until the slot has moved, then published once (one observation)."""
    partition = _partition_of_a_master(redis_cluster)
    task_id = next(
        f"pub-{n}" for n in range(100_000) if keys.partition_of(f"pub-{n}", PARTITIONS) == partition
    )
    settings = OrgaSettings(redis_url=redis_cluster.url, redis_cluster=True, partitions=PARTITIONS)  # type: ignore[call-arg]
    clients = RedisClients(redis_cluster.url, cluster=True)
    services = ProcessServices(
        settings, ProviderSettings(), redis_cluster.url, connect=clients.asyncio
    )
    fence = Fence(task_id=task_id, step_id="s", iteration=0, attempt=1, nonce="n1")
    message = WorkerFailedMessage(fence=fence, error="the answer")
    stream = keys.observations_stream(partition)
    sync = clients.sync(decode_responses=True)
    try:
        services.run(_warm(services.redis, redis_cluster))
        before = sync.xlen(stream)
        with HalfMoved(redis_cluster, partition, hold_s=HOLD_PUBLISH_S) as held:
            started = time.monotonic()
            services.run(_publish(services, message, [], [fence], give_up_after_s=60))
            waited_s = time.monotonic() - started
        assert held.thread.took_s > 0
        entries = sync.xrange(stream)
        assert sync.xlen(stream) == before + 1, entries[-3:]
        ours = [f for _i, f in entries if task_id in str(f)]
        assert len(ours) == 1, entries[-3:]
        print(f"published after {waited_s:.2f}s on a slot held half moved {HOLD_PUBLISH_S:g} s")
        assert waited_s < HOLD_PUBLISH_S + 10, waited_s
    finally:
        services.close()
        sync.close()
