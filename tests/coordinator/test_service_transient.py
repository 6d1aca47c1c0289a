"""A Redis that refuses writes for a while (out of memory) never turns an entry into poison.

Issue 12, item 3: during an OOM episode XREADGROUP and XAUTOCLAIM still count deliveries while
every write fails; the coordinator gives those deliveries back, so every valid submission is
applied once Redis accepts writes again, and nothing is dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterError,
    MovedError,
    OutOfMemoryError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings, is_transient
from shared import keys
from tests.redis_server import RedisServer

TASK = json.dumps({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
SETTINGS = CoordinatorSettings(
    machine=MachineSettings(workspace_root="/ws"),
    block_ms=10,
    claim_idle_ms=100,
    transient_backoff_ms=100,
    max_deliveries=2,
)


@pytest.mark.parametrize(
    "error",
    [
        OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'."),
        ResponseError("OOM command not allowed when used memory > 'maxmemory'. script: 1f0e"),
        ResponseError("Command # 1 (XADD orga:rejected) of pipeline caused error: OOM command"),
        ResponseError("BUSY Redis is busy running a script."),
        ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's failing"),
        BusyLoadingError("Redis is loading the dataset in memory"),
        RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
        # a Redis Cluster moving a slot (a live reshard; tests/integration/test_cluster_reshard)
        TryAgainError("Multiple keys request during rehashing of slot"),
        ClusterError("TTL exhausted."),
        MovedError("5013 127.0.0.1:24994"),
        AskError("5013 127.0.0.1:24994"),
        ResponseError("UNBLOCKED the stream key no longer exists"),
    ],
)
def test_redis_refusing_or_unreachable_is_transient(error: RedisError) -> None:
    """Out of memory (plain, in a script, in a pipeline), busy, failing to persist, loading,
    unreachable and a slot being moved are transient: they say nothing about the entry."""
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ResponseError("BUSYGROUP Consumer Group name already exists"),
        ResponseError("ERR Error running script: user_script:3: attempt to index a nil value"),
        ValueError("OOM"),
    ],
)
def test_other_errors_are_not_transient(error: Exception) -> None:
    """A wrong type, an existing group, a failing script or a non-Redis error is the entry's
    (or our) fault: not transient."""
    assert not is_transient(error)


async def _rounds(
    coordinator: Coordinator, count: int, until: Callable[[], Awaitable[bool]]
) -> list[RedisError]:
    """Run intake and tick rounds (as the loops would, minus their sleeps); what they raised."""
    raised: list[RedisError] = []
    for _ in range(count):
        for body in (coordinator._intake_once, coordinator._tick_once):
            try:
                await body()
            except RedisError as exc:
                raised.append(exc)
        if await until():
            break
        await asyncio.sleep(0.12)  # the entries become claimable again
    return raised


def test_submissions_during_an_out_of_memory_episode_are_all_applied_after_it(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """With maxmemory lowered so every write fails, five submissions stay pending (their
    deliveries given back, none dead-lettered) through many reclaims; once maxmemory is
    restored all five are created and started, once each."""
    server = redis_server_factory()
    ids = [f"oom-{i}" for i in range(5)]

    async def scenario() -> None:
        client = Redis.from_url(server.url, decode_responses=True)
        coordinator = Coordinator(client, settings=SETTINGS, name="c")
        try:
            await coordinator._ensure_groups()
            for task_id in ids:
                await client.xadd(keys.intake_stream(0), {"task_id": task_id, "task": TASK})
            await client.config_set("maxmemory", 1)
            try:

                async def never() -> bool:
                    return False

                refused = await _rounds(coordinator, 10, never)
                assert len(refused) >= 10
                assert all(is_transient(e) for e in refused), refused
                assert await client.exists(*(keys.task_key(i, 0) for i in ids)) == 0
                pending = await client.xpending_range(
                    keys.intake_stream(0), keys.coordinator_group, min="-", max="+", count=10
                )
                assert len(pending) == len(ids)
                assert max(int(p["times_delivered"]) for p in pending) <= 1
            finally:
                await client.config_set("maxmemory", 0)

            async def all_created() -> bool:
                found = await client.exists(*(keys.task_key(i, 0) for i in ids))
                return bool(found == len(ids))

            assert all(is_transient(e) for e in await _rounds(coordinator, 20, all_created))
            assert await all_created()
            assert await client.xlen(keys.dead_letter_stream(0)) == 0
            events = [f for _i, f in await client.xrange(keys.events_stream(0))]
            accepted = sorted(e["task_id"] for e in events if e["event"] == "accepted")
            assert accepted == ids
            summary = await client.xpending(keys.intake_stream(0), keys.coordinator_group)
            assert summary["pending"] == 0
        finally:
            with contextlib.suppress(RedisError):
                await client.config_set("maxmemory", 0)
            await client.aclose()

    asyncio.run(scenario())
