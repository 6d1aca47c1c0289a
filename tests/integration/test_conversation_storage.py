"""A long task costs the same per iteration: its conversation is stored append-only apart from
its state, reasoning requests carry a reference, applied tool outputs leave the observations
stream, and everything goes with the task when it is purged."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from coordinator.store import TaskStore
from shared import keys
from tests.integration.harness import PARTITIONS, Cluster, status_of, wait_until

pytestmark = pytest.mark.integration

BIG = "python3 -c \"print('x' * 20000)\""


def test_outputs_are_stored_once_and_purged_with_the_task(cluster: Cluster) -> None:
    """Four 20 KB outputs: the state stays small, requests stay small, the stream is emptied."""
    client = cluster.client()
    raw = redis.Redis.from_url(cluster.redis_url)
    seen_requests: list[int] = []
    call = {"name": "run_command", "arguments": {"command": BIG}}
    task_id = client.submit(
        {
            "goal": "print a lot",
            "provider": {"kind": "scripted", "replies": [{"tool_calls": [call]}] * 4 + ["done"]},
            "steps": [{"id": "s", "instruction": "print"}],
            "stagnation": {"enabled": False},
        }
    )

    def finished() -> bool:
        for body in raw.lrange(keys.reasoning_queue, 0, -1):
            seen_requests.append(len(body))
        return status_of(client, task_id) == "completed"

    wait_until(finished, timeout_s=60, what="the task to complete")
    p = keys.partition_of(task_id, PARTITIONS)
    conversation = raw.lrange(keys.conversation_key(task_id, p), 0, -1)
    outputs = [m for m in conversation if json.loads(m)["role"] == "tool"]
    assert len(outputs) == 4 and all(len(m) > 20_000 for m in outputs)
    assert len(raw.hget(keys.task_key(task_id, p), "state") or b"") < 20_000
    assert all(size < 20_000 for size in seen_requests), seen_requests
    # the observations applied are deleted together, delete_applied_s (0.25 s) after the commit
    wait_until(
        lambda: raw.xlen(keys.observations_stream(p)) == 0, timeout_s=5, what="the stream emptied"
    )
    assert asyncio.run(_purge(cluster.redis_url)) >= 1
    assert not raw.exists(keys.task_key(task_id, p))
    assert not raw.exists(keys.conversation_key(task_id, p))
    raw.close()


async def _purge(url: str) -> int:
    """What the coordinators do once a finished task is past its retention."""
    client = AsyncRedis.from_url(url)
    try:
        return await TaskStore(client, partitions=PARTITIONS).purge_finished(time.time() + 1)
    finally:
        await client.aclose()
