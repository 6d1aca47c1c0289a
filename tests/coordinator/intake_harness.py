"""What the intake's tests share: a coordinator on a real Redis, submissions, and Redis
refusing one create (the chunked intake's tests and their two reviews)."""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import OutOfMemoryError

from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings
from shared import keys

TASK = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}
SETTINGS = CoordinatorSettings(
    machine=MachineSettings(workspace_root="/ws"),
    block_ms=10,
    intake_chunk=8,
    claim_idle_ms=100,
    transient_backoff_ms=100,
)
OOM = "OOM command not allowed when used memory > 'maxmemory'."


async def coordinator(client: Redis) -> Coordinator:
    """A coordinator of partition 0 with its groups made, not running."""
    made = Coordinator(client, settings=SETTINGS, name="c")
    await made._ensure_groups()
    await made._learn_redis_version()
    return made


async def submit(client: Redis, task_id: str, task: dict[str, Any] | None = None) -> str:
    """Submit ``task`` (default :data:`TASK`) as ``task_id`` to partition 0's intake."""
    entry_id = await client.xadd(
        keys.intake_stream(0), {"task_id": task_id, "task": json.dumps(task or TASK)}
    )
    return str(entry_id)


async def deliveries(client: Redis) -> dict[str, int]:
    """The intake entries pending, and how often each was delivered."""
    rows = await client.xpending_range(
        keys.intake_stream(0), keys.coordinator_group, min="-", max="+", count=1000
    )
    return {str(r["message_id"]): int(r["times_delivered"]) for r in rows}


async def running(client: Redis, task_id: str) -> bool:
    """Whether task ``task_id`` is stored, started (version 1) and running (a client that
    decodes its replies)."""
    task = await client.hgetall(keys.task_key(task_id, 0))
    return task.get("version") == "1" and task.get("status") == "running"


def refuse_once(client: Redis, task_key: str) -> list[str]:
    """Redis answers OOM, once, to the first script sent that writes ``task_key`` (a script
    refused runs nothing), whether it is sent alone or in a pipeline; the rest run as sent.
    Returns the list the refusals are recorded in."""
    refused: list[str] = []

    def targets(args: tuple[Any, ...]) -> bool:
        return (
            not refused
            and str(args[0]).upper() == "EVALSHA"
            and task_key in [a if isinstance(a, str) else str(a) for a in args]
        )

    execute_command = client.execute_command

    async def alone(*args: Any, **options: Any) -> Any:
        if targets(args):
            refused.append("alone")
            raise OutOfMemoryError(OOM)
        return await execute_command(*args, **options)

    client.execute_command = alone  # type: ignore[method-assign]
    pipeline = client.pipeline

    def piped(*args: Any, **kwargs: Any) -> Pipeline:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        async def run(raise_on_error: bool = True) -> list[Any]:
            stack = pipe.command_stack
            hit = next((i for i, (a, _o) in enumerate(stack) if targets(a)), None)
            if hit is None:
                return await execute(raise_on_error=raise_on_error)
            refused.append("piped")
            del stack[hit]
            replies = await execute(raise_on_error=False) if stack else []
            replies.insert(hit, OutOfMemoryError(OOM))
            if raise_on_error:
                raise replies[hit]
            return replies

        pipe.execute = run  # type: ignore[method-assign]
        return pipe

    client.pipeline = piped  # type: ignore[method-assign]
    return refused
