"""Review of the intake's pipelined creates, second round (branch ``fixi``): guarantees a
create sent alone kept on ``main`` that a chunk of creates must keep too.

Each test injects its fault below the coordinator (a Redis reply) or in a step both trees
share, so the same test runs on ``main`` (creates sent one by one) and on the chunked intake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.store import CommitConflictError
from shared import keys
from tests.coordinator.intake_harness import OOM, SETTINGS, TASK
from tests.coordinator.intake_harness import coordinator as _coordinator
from tests.coordinator.intake_harness import deliveries as _deliveries
from tests.coordinator.intake_harness import refuse_once as _refuse_once
from tests.coordinator.intake_harness import submit as _submit
from tests.redis_server import RedisClientFactory


async def _rejected(client: Redis) -> list[str]:
    return [f["task_id"] for _i, f in await client.xrange(keys.rejected_stream(0))]


async def _duplicates(client: Redis) -> list[str]:
    events = await client.xrange(keys.events_stream(0))
    return [f["task_id"] for _i, f in events if f.get("event") == "duplicate"]


def _refuse_event_once(client: Redis, event: str, error: BaseException | None = None) -> list[str]:
    """Redis answers ``error`` (default OOM: a write refused at maxmemory, transient), once,
    to the XADD of a lifecycle event named ``event``; every other command runs as sent."""
    refused: list[str] = []
    execute_command = client.execute_command

    async def refusing(*args: Any, **options: Any) -> Any:
        if not refused and str(args[0]).upper() == "XADD" and event in [str(a) for a in args]:
            refused.append(event)
            raise error or OutOfMemoryError(OOM)
        return await execute_command(*args, **options)

    client.execute_command = refusing  # type: ignore[method-assign]
    return refused


async def _drain(client: Redis, coordinator: Coordinator) -> None:
    """Let the entries given back be claimed again and handled, until none is pending."""
    for _ in range(8):
        if not await _deliveries(client):
            return
        await asyncio.sleep(0.12)
        with contextlib.suppress(RedisError):
            await coordinator._tick_once()
            await coordinator._intake_once()


def test_a_refusal_while_telling_a_duplicate_loses_no_later_entrys_answer(
    redis_client: RedisClientFactory,
) -> None:
    """One read: ``a`` then ``b`` resubmitted (each a duplicate of the task it names). Redis
    refuses, once (OOM, transient), the event that tells ``a``'s duplicate. Main: the read
    stops at ``a``; ``b``'s create was never sent, its entry is given back, claimed again and
    its duplicate told. Chunked: ``a``'s and ``b``'s scripts both ran in the chunk and each
    acknowledged its entry (a duplicate's script does); ``a``'s refusal "gives back" ``b``,
    which is no longer pending (XCLAIM of an acknowledged entry: nothing): ``b``'s answer is
    lost for good. The rule "a transient refusal gives back every entry not yet sent" holds
    only for entries not acknowledged by their own script."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "a")
            await _submit(client, "b")
            await coordinator._intake_once()
            assert await _deliveries(client) == {}
            refused = _refuse_event_once(client, "duplicate")
            await _submit(client, "a")
            await _submit(client, "b")
            with contextlib.suppress(OutOfMemoryError):
                await coordinator._intake_once()
            assert refused
            await _drain(client, coordinator)
            assert await _deliveries(client) == {}
            assert "b" in await _duplicates(client)

    asyncio.run(run())


def test_a_non_transient_error_while_telling_a_duplicate_loses_no_later_entrys_answer(
    redis_client: RedisClientFactory,
) -> None:
    """As above, the error non-transient (a reply Redis gives to that command alone, here
    WRONGTYPE-like). Main: the read stops at ``a``; ``b`` stays pending, is reclaimed once
    idle ``claim_idle_ms`` and its duplicate told. Chunked: ``b``'s script acknowledged it in
    the chunk, and the error raised by ``a``'s answer skips ``b``'s: ``b``'s answer is never
    given, and nothing pending is left to reclaim it from."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "a")
            await _submit(client, "b")
            await coordinator._intake_once()
            error = ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
            refused = _refuse_event_once(client, "duplicate", error)
            await _submit(client, "a")
            await _submit(client, "b")
            with contextlib.suppress(ResponseError):
                await coordinator._intake_once()
            assert refused
            await _drain(client, coordinator)
            assert await _deliveries(client) == {}
            assert "b" in await _duplicates(client)

    asyncio.run(run())


def test_a_stop_while_telling_a_duplicate_loses_no_later_entrys_answer(
    redis_client: RedisClientFactory,
) -> None:
    """As above, the coordinator stopped (cancelled, a deploy) while it tells ``a``'s duplicate,
    and a second coordinator takes over its pending entries. Main: ``b``'s create was never
    sent, ``b`` stays pending, the second coordinator claims it and tells its duplicate.
    Chunked: ``b``'s script ran and acknowledged it in the chunk: nobody ever answers ``b``."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "a")
            await _submit(client, "b")
            await coordinator._intake_once()
            refused = _refuse_event_once(client, "duplicate", asyncio.CancelledError())
            await _submit(client, "a")
            await _submit(client, "b")
            with contextlib.suppress(asyncio.CancelledError):
                await coordinator._intake_once()
            assert refused
            async with redis_client(decode_responses=True) as other_client:
                other = Coordinator(other_client, settings=SETTINGS, name="d")
                await other._ensure_groups()
                await other._learn_redis_version()
                await _drain(other_client, other)
            assert await _deliveries(client) == {}
            assert "b" in await _duplicates(client)

    asyncio.run(run())


def test_on_two_partitions_a_refused_create_leaves_no_task_lost_or_created_twice(
    redis_client: RedisClientFactory,
) -> None:
    """Two partitions, one read of both intakes: ten new tasks and two resubmissions on each;
    Redis refuses (OOM, once) the create of the fourth new task of partition 0. Every entry is
    answered once all are claimed again: each task created once (version 1, running, one
    dispatch), each resubmission told as a duplicate, nothing left pending."""
    settings = CoordinatorSettings(
        machine=MachineSettings(workspace_root="/ws"),
        block_ms=10,
        claim_idle_ms=100,
        transient_backoff_ms=100,
        partitions=2,
    )

    def ids(partition: int, count: int, prefix: str) -> list[str]:
        found = []
        n = 0
        while len(found) < count:
            if keys.partition_of(f"{prefix}{n}", 2) == partition:
                found.append(f"{prefix}{n}")
            n += 1
        return found

    async def pending(client: Redis) -> int:
        total = 0
        for p in range(2):
            info = await client.xpending(keys.intake_stream(p), keys.coordinator_group)
            total += int(info["pending"])
        return total

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = Coordinator(client, settings=settings, name="c")
            await coordinator._ensure_groups()
            await coordinator._learn_redis_version()
            old = {p: ids(p, 2, "old") for p in range(2)}
            new = {p: ids(p, 10, "t") for p in range(2)}
            for p in range(2):
                for task_id in old[p]:
                    await client.xadd(
                        keys.intake_stream(p), {"task_id": task_id, "task": json.dumps(TASK)}
                    )
            await coordinator._intake_once()
            assert await pending(client) == 0
            refused = _refuse_once(client, keys.task_key(new[0][3], 0))
            for p in range(2):
                for task_id in new[p][:5] + old[p] + new[p][5:]:
                    await client.xadd(
                        keys.intake_stream(p), {"task_id": task_id, "task": json.dumps(TASK)}
                    )
            with contextlib.suppress(OutOfMemoryError):
                await coordinator._intake_once()
            assert refused  # in a chunk's pipeline on the chunked intake, alone on main
            for _ in range(10):
                if not await pending(client):
                    break
                await asyncio.sleep(0.12)
                with contextlib.suppress(RedisError):
                    await coordinator._tick_once()
                    await coordinator._intake_once()
            assert await pending(client) == 0
            for p in range(2):
                for task_id in new[p] + old[p]:
                    task = await client.hgetall(keys.task_key(task_id, p))
                    assert (task.get("version"), task.get("status")) == ("1", "running"), task_id
            events = []
            for p in range(2):
                events += [f for _i, f in await client.xrange(keys.events_stream(p))]
            dup = sorted(e["task_id"] for e in events if e.get("event") == "duplicate")
            assert dup == sorted(old[0] + old[1])

    asyncio.run(run())


def test_a_commit_conflict_answering_one_entry_of_a_chunk_loses_no_later_entrys_answer(
    redis_client: RedisClientFactory,
) -> None:
    """One read: ``a`` (its lease held by another coordinator: created apart once the chunk is
    answered) then ``b`` resubmitted (a duplicate). ``a``'s bookkeeping after its create (here
    taking its lease, injected) raises ``CommitConflictError`` (as ``_decide`` and ``_apply``
    do), which every entry's guard lets through (the entry stays pending, to be claimed again).
    Main: the read stops at ``a``; ``b``'s create was never sent, ``b`` is claimed again and
    its duplicate told. Chunked: ``b``'s script ran and acknowledged it in ``a``'s chunk, and
    the conflict skips ``b``'s answer: never told."""

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = await _coordinator(client)
            await _submit(client, "b")
            await coordinator._intake_once()
            await client.set(keys.lease_key("a", 0), "other", px=60_000)
            hold = coordinator._hold
            conflicts: list[str] = []

            async def conflicting(task_id: str) -> bool:
                if task_id == "a" and not conflicts:
                    conflicts.append(task_id)
                    raise CommitConflictError("task a: gave up after 20 conflicting commits")
                return await hold(task_id)

            coordinator._hold = conflicting  # type: ignore[method-assign]
            await _submit(client, "a")
            await _submit(client, "b")
            with contextlib.suppress(CommitConflictError):
                await coordinator._intake_once()
            assert conflicts
            await _drain(client, coordinator)
            assert await _deliveries(client) == {}
            assert "b" in await _duplicates(client)

    asyncio.run(run())
