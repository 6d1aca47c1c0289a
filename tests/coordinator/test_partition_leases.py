"""Partition leases: fair shares, rebalancing without overlap, takeover of a dead holder."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis

from coordinator.machine import MachineSettings
from coordinator.partition_leases import (
    PartitionLeases,
    fair_share,
    forget_holders,
    plan_leases,
)
from coordinator.service import Coordinator, CoordinatorSettings
from shared import keys
from tests.redis_server import RedisClientFactory

P = 16


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("members", [1, 2, 3, 4, 5, 16, 17])
def test_fair_shares_add_up_and_differ_by_one_at_most(members: int) -> None:
    """Every member's share is floor or ceil of P/N, and the shares add up to P."""
    names = [f"c{i}" for i in range(members)]
    shares = [fair_share(P, names, name) for name in names]
    assert sum(shares) == P
    assert set(shares) <= {P // members, math.ceil(P / members)}


def test_a_plan_drains_the_excess_and_takes_only_free_partitions() -> None:
    """Over the share: the highest partitions are drained; under it: only unowned ones taken."""
    over = plan_leases(P, 4, range(6), {}, "a")
    assert over.drain == (4, 5) and over.acquire == ()
    owners: dict[int, str | None] = {p: ("b" if p % 2 else None) for p in range(P)}
    under = plan_leases(P, 3, [0], owners, "a")
    assert len(under.acquire) == 2 and all(p % 2 == 0 and p != 0 for p in under.acquire)
    assert plan_leases(P, 2, [0, 2], owners, "a") == plan_leases(P, 0, [], owners, "a")


def _run(redis_client: RedisClientFactory, body: Callable[[Redis], Awaitable[None]]) -> None:
    async def scenario() -> None:
        async with redis_client() as client:
            await body(client)

    asyncio.run(scenario())


def _disjoint(*leases: PartitionLeases) -> None:
    served = [lease.serving() for lease in leases]
    assert sum(len(s) for s in served) == len(frozenset().union(*served)), served


async def _settle(*leases: PartitionLeases, rounds: int = 6) -> None:
    """Heartbeats in turn (as the coordinators' ticks would), never two serving one partition."""
    for _ in range(rounds):
        for lease in leases:
            await lease.heartbeat()
            _disjoint(*leases)


def test_two_then_three_coordinators_reach_a_fair_balance_without_overlap(
    redis_client: RedisClientFactory,
) -> None:
    """One takes all 16; a second gets 8 once the first drains; a third: 6/5/5. The
    partitions served are disjoint at every step, and every partition is served at the end."""

    async def body(client: Redis) -> None:
        a, b, c = (PartitionLeases(client, name, P, ttl_s=30) for name in "abc")
        await a.heartbeat()
        assert a.serving() == frozenset(range(P))
        await _settle(a, b)
        assert sorted(len(x.serving()) for x in (a, b)) == [8, 8]
        await _settle(a, b, c)
        assert sorted(len(x.serving()) for x in (a, b, c)) == [5, 5, 6]
        assert frozenset().union(*(x.serving() for x in (a, b, c))) == frozenset(range(P))
        holders = {p: (await client.get(keys.partition_lease_key(p))) for p in range(P)}
        assert all(holders[p] == next(x.name for x in (a, b, c) if p in x.serving()).encode()
                   for p in range(P))  # fmt: skip

    _run(redis_client, body)


def test_a_drained_partition_is_released_only_when_every_loop_moved_on(
    redis_client: RedisClientFactory,
) -> None:
    """A drained partition stops being served at once; its lease (and its tasks) are released
    once each registered loop started a new iteration, or a TTL later at most."""

    async def body(client: Redis) -> None:
        clock = Clock()
        released: list[frozenset[int]] = []

        async def on_released(partitions: frozenset[int]) -> None:
            released.append(partitions)

        a = PartitionLeases(client, "a", 4, ttl_s=30, on_released=on_released, clock=clock)
        a.register("read", "tick")
        await a.heartbeat()
        assert a.serving("read") == frozenset(range(4))
        b = PartitionLeases(client, "b", 4, ttl_s=30, clock=clock)
        await b.heartbeat()
        await a.heartbeat()  # sees b: drains two
        assert a.serving() == {0, 1} and a.held == frozenset(range(4))
        await a.tick()
        assert not released  # neither loop has looked since
        a.serving("read")
        await a.tick()
        assert not released  # the tick loop may still work on them
        a.serving("tick")
        await a.tick()
        assert released == [frozenset({2, 3})]
        assert await client.get(keys.partition_lease_key(2)) is None
        await b.heartbeat()
        assert b.serving() == {2, 3}

        # A loop that never looks again holds a drain up to one TTL.
        c = PartitionLeases(client, "0c", 4, ttl_s=30, clock=clock)  # sorts first: share 2
        await c.heartbeat()
        await a.heartbeat()
        assert len(a.serving()) == 1
        a.serving("read")
        clock.now += 29
        await a.tick()
        assert len(released) == 1
        clock.now += 1
        await a.tick()
        assert len(released) == 2

    _run(redis_client, body)


def test_a_dead_holders_partitions_are_taken_over_after_the_ttl(
    redis_client: RedisClientFactory,
) -> None:
    """A coordinator that stops renewing loses its membership and leases after the TTL; the
    survivor then takes every partition. Until then it is not served by anyone else."""

    async def body(client: Redis) -> None:
        a, b = (PartitionLeases(client, name, P, ttl_s=0.5) for name in "ab")
        await _settle(a, b)
        mine = b.serving()
        assert len(mine) == 8
        await a.heartbeat()  # b is "dead" from now on: no more heartbeats
        assert not (a.serving() & mine)
        await asyncio.sleep(0.6)
        assert b.serving() == frozenset()  # its last renewal was sent more than a TTL ago
        await a.heartbeat()
        assert a.members == ("a",)
        assert a.serving() == frozenset(range(P))

    _run(redis_client, body)


def test_a_lease_taken_by_another_is_no_longer_served(redis_client: RedisClientFactory) -> None:
    """A lease found held by another coordinator at a renewal is dropped and reported."""

    async def body(client: Redis) -> None:
        released: list[frozenset[int]] = []

        async def on_released(partitions: frozenset[int]) -> None:
            released.append(partitions)

        a = PartitionLeases(client, "a", 4, ttl_s=30, on_released=on_released)
        await a.heartbeat()
        await client.set(keys.partition_lease_key(1), "intruder")
        await a.heartbeat()
        assert a.serving() == {0, 2, 3}
        assert released == [frozenset({1})]

    _run(redis_client, body)


def test_a_coordinator_leaving_hands_its_partitions_over_at_once(
    redis_client: RedisClientFactory,
) -> None:
    """leave() deletes the leases and the membership: the other takes them at its next beat."""

    async def body(client: Redis) -> None:
        a, b = (PartitionLeases(client, name, P, ttl_s=30) for name in "ab")
        await _settle(a, b)
        await b.leave()
        assert b.serving() == frozenset()
        await a.heartbeat()
        assert a.members == ("a",) and a.serving() == frozenset(range(P))

    _run(redis_client, body)


def test_running_coordinators_each_serve_only_the_partitions_they_hold(
    redis_client: RedisClientFactory,
) -> None:
    """Two running coordinators on 4 partitions hold 2 each; every task submitted to any
    partition's intake is created by the holder of its partition (its task lease names it);
    stopped, each releases its task and partition leases and leaves the members."""

    async def body(client: Redis) -> None:
        settings = CoordinatorSettings(
            machine=MachineSettings(workspace_root="/ws"),
            block_ms=10,
            tick_interval_s=0.05,
            partitions=4,
            partition_lease_ttl_s=30,
        )
        a, b = (Coordinator(client, settings=settings, name=name) for name in "ab")
        runs = [asyncio.create_task(a.run())]
        await _until(lambda: len(a.serving()) == 4)
        runs.append(asyncio.create_task(b.run()))
        await _until(lambda: len(a.serving()) == 2 and len(b.serving()) == 2)
        assert not a.serving() & b.serving()
        task_ids = [f"t{n}" for n in range(12)]
        for task_id in task_ids:
            p = keys.partition_of(task_id, 4)
            await client.xadd(keys.intake_stream(p), {"task_id": task_id, "task": json.dumps(TASK)})
        holder = {p: x.name for x in (a, b) for p in x.serving()}

        async def created() -> bool:
            lease_keys = [keys.lease_key(t, keys.partition_of(t, 4)) for t in task_ids]
            return all([await client.get(key) for key in lease_keys])

        await _until_async(created)
        for task_id in task_ids:
            p = keys.partition_of(task_id, 4)
            assert (await client.get(keys.lease_key(task_id, p))) == holder[p].encode()
        a.stop()
        b.stop()
        await asyncio.wait_for(asyncio.gather(*runs), 10)
        assert await client.zcard(keys.coordinators_key) == 0
        for p in range(4):
            assert await client.get(keys.partition_lease_key(p)) is None
        for task_id in task_ids:
            assert await client.get(keys.lease_key(task_id, keys.partition_of(task_id, 4))) is None

    _run(redis_client, body)


TASK = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}


async def _until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async def check() -> bool:
        return predicate()

    await _until_async(check, timeout_s)


async def _until_async(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_the_sole_coordinator_forgets_a_killed_predecessors_leases(
    redis_client: RedisClientFactory,
) -> None:
    """forget_holders (the embedded runtime, sole coordinator of its Redis) drops the leases
    and membership a SIGKILLed process left: its successor serves every partition at once."""

    async def body(client: Redis) -> None:
        dead = PartitionLeases(client, "dead", P, ttl_s=30)
        await dead.heartbeat()
        await forget_holders(client, P)
        successor = PartitionLeases(client, "next", P, ttl_s=30)
        await successor.heartbeat()
        assert successor.members == ("next",) and successor.serving() == frozenset(range(P))

    _run(redis_client, body)
