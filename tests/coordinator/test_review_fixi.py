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
from shared import keys
from tests.redis_server import RedisClientFactory

TASK = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}
SETTINGS = CoordinatorSettings(
    machine=MachineSettings(workspace_root="/ws"),
    block_ms=10,
    claim_idle_ms=100,
    transient_backoff_ms=100,
)
OOM = "OOM command not allowed when used memory > 'maxmemory'."


async def _coordinator(client: Redis) -> Coordinator:
    coordinator = Coordinator(client, settings=SETTINGS, name="c")
    await coordinator._ensure_groups()
    await coordinator._learn_redis_version()
    return coordinator


async def _submit(client: Redis, task_id: str, task: dict[str, Any] | None = None) -> str:
    entry_id = await client.xadd(
        keys.intake_stream(0), {"task_id": task_id, "task": json.dumps(task or TASK)}
    )
    return str(entry_id)


async def _deliveries(client: Redis) -> dict[str, int]:
    rows = await client.xpending_range(
        keys.intake_stream(0), keys.coordinator_group, min="-", max="+", count=1000
    )
    return {str(r["message_id"]): int(r["times_delivered"]) for r in rows}


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
