"""The chunked intake's acknowledgements: one ``XACK`` per chunk for the entries that name
their task, after the chunk's scripts (docs/performance.md, "The intake's acknowledgements
once per chunk"), and nothing done twice when that ``XACK`` is lost and the entries are
delivered again.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from coordinator.service import Coordinator
from shared import keys
from tests.coordinator.intake_harness import SETTINGS, TASK
from tests.coordinator.intake_harness import coordinator as _coordinator
from tests.coordinator.intake_harness import deliveries as _deliveries
from tests.coordinator.intake_harness import running as _running
from tests.coordinator.intake_harness import submit as _submit
from tests.redis_server import RedisClientFactory


async def _xacks(client: Redis) -> int:
    """``XACK`` calls since the last ``CONFIG RESETSTAT`` (those inside scripts included)."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_xack", {}).get("calls", 0))


async def _events(client: Redis, name: str) -> list[dict[str, str]]:
    return [f for _i, f in await client.xrange(keys.events_stream(0)) if f.get("event") == name]


async def _outbox_tasks(client: Redis) -> list[str]:
    """The task of each dispatch written to the commits' outbox (no relay runs here)."""
    entries = await client.xrange(keys.commit_outbox_stream(0))
    return [json.loads(f["payload"])["fence"]["task_id"] for _i, f in entries]


async def _intake_losing_the_xack(client: Redis, coordinator: Coordinator) -> None:
    """One intake read whose chunk's ``XACK`` never reaches Redis (the connection lost): the
    read raises, the chunk's scripts ran, its named entries stay pending."""
    xack = client.xack

    async def lost(*_args: Any) -> int:
        raise RedisConnectionError("connection lost")

    client.xack = lost  # type: ignore[method-assign]
    try:
        with pytest.raises(RedisConnectionError):
            await coordinator._intake_once()
    finally:
        client.xack = xack  # type: ignore[method-assign]


def test_a_burst_of_named_entries_is_acknowledged_once_per_chunk(
    redis_client: RedisClientFactory,
) -> None:
    """Twenty entries that name their task, one read: three chunks (8, 8, 4), three ``XACK``
    commands in all (twenty before, one in each create script); every entry acknowledged and
    every task created started."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            ids = [f"t{n}" for n in range(20)]
            for task_id in ids:
                await _submit(client, task_id)
            await client.config_resetstat()
            await coordinator._intake_once()
            assert await _xacks(client) == 3
            assert await _deliveries(client) == {}
            for task_id in ids:
                assert await _running(client, task_id)

    asyncio.run(run())


def test_entries_without_a_task_id_are_acknowledged_by_their_scripts(
    redis_client: RedisClientFactory,
) -> None:
    """An entry without ``task_id`` gets an id drawn by the coordinator, drawn anew if it were
    delivered again: its script acknowledges it, as before (three scripts, three ``XACK``)."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            for _n in range(3):
                await client.xadd(keys.intake_stream(0), {"task": json.dumps(TASK)})
            await client.config_resetstat()
            await coordinator._intake_once()
            assert await _xacks(client) == 3
            assert await _deliveries(client) == {}
            assert await client.zcard(keys.task_index_key(0)) == 3

    asyncio.run(run())


def test_a_lost_chunk_xack_creates_nothing_twice_when_the_entries_come_back(
    redis_client: RedisClientFactory,
) -> None:
    """The chunk's ``XACK`` lost (the connection drops after the scripts ran): the tasks are
    created, their entries still pending. Claimed again by another coordinator (this one as
    if killed), each entry finds the task it created, by id or by its idempotency key: no
    second record, start, dispatch or lifecycle event, no ``duplicate`` told for it; the
    resubmission of an older task in the same chunk (not told before the ``XACK``) is told
    once; every entry is acknowledged then."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "old")
            await coordinator._intake_once()
            await _submit(client, "a")
            await _submit(client, "keyed", {**TASK, "idempotency_key": "k"})
            await _submit(client, "old")
            await _intake_losing_the_xack(client, coordinator)
            assert len(await _deliveries(client)) == 3
            for task_id in ("a", "keyed"):
                assert await _running(client, task_id)
            assert await _events(client, "duplicate") == []
            created = await client.zcard(keys.task_index_key(0))
            dispatched = sorted(await _outbox_tasks(client))
            accepted = len(await _events(client, "accepted"))

            other = Coordinator(client, settings=SETTINGS, name="c2")
            await other._learn_redis_version()
            await asyncio.sleep(SETTINGS.claim_idle_ms / 1000 + 0.05)
            await other._reclaim(keys.intake_stream(0), other._intake)

            assert await _deliveries(client) == {}
            assert await client.zcard(keys.task_index_key(0)) == created == 3
            assert sorted(await _outbox_tasks(client)) == dispatched == ["a", "keyed", "old"]
            assert len(await _events(client, "accepted")) == accepted == 3
            told = await _events(client, "duplicate")
            assert [(e["task_id"], e["existing_task_id"]) for e in told] == [("old", "old")]
            for task_id in ("a", "keyed"):
                assert await _running(client, task_id)

    asyncio.run(run())


def test_a_lost_chunk_xack_then_the_same_coordinator_reads_on(
    redis_client: RedisClientFactory,
) -> None:
    """The same as the last test, the entries claimed again by the coordinator that lost the
    ``XACK`` (its next reclaim): the tasks it created and holds are not started again."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            for task_id in ("a", "b"):
                await _submit(client, task_id)
            await _intake_losing_the_xack(client, coordinator)
            await asyncio.sleep(SETTINGS.claim_idle_ms / 1000 + 0.05)
            await coordinator._reclaim(keys.intake_stream(0), coordinator._intake)
            assert await _deliveries(client) == {}
            assert sorted(await _outbox_tasks(client)) == ["a", "b"]
            assert await _events(client, "duplicate") == []
            for task_id in ("a", "b"):
                assert await _running(client, task_id)

    asyncio.run(run())


def test_an_entry_delivered_again_and_created_apart_finds_its_own_task(
    redis_client: RedisClientFactory,
) -> None:
    """The entry of a task its chunk created, its ``XACK`` lost, claimed again by a
    coordinator that creates it apart (``TaskStore.create``, as when its start is not
    prepared): answered as its own task too, acknowledged, no ``duplicate`` told."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "a")
            await _intake_losing_the_xack(client, coordinator)
            other = Coordinator(client, settings=SETTINGS, name="c2")
            await other._learn_redis_version()

            def apart(*_args: object) -> None:
                return None  # no create with its start prepared: created apart

            other._prepare_started = apart  # type: ignore[method-assign,assignment]
            await asyncio.sleep(SETTINGS.claim_idle_ms / 1000 + 0.05)
            await other._reclaim(keys.intake_stream(0), other._intake)
            assert await _deliveries(client) == {}
            assert await _events(client, "duplicate") == []
            assert await _outbox_tasks(client) == ["a"]
            assert await _running(client, "a")

    asyncio.run(run())
