"""Redis restarted empty (no AOF): the coordinator recreates its groups, says state was lost,
and serves new submissions (issue 12, item 15)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from coordinator.machine import MachineSettings
from coordinator.metrics import CoordinatorMetrics
from coordinator.service import Coordinator, CoordinatorSettings
from shared import keys
from tests.redis_server import RedisServer

TASK = json.dumps({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
SETTINGS = CoordinatorSettings(
    machine=MachineSettings(workspace_root="/ws"), block_ms=50, tick_interval_s=0.05
)


async def _accepted(client: Redis, task_id: str, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = [f for _i, f in await client.xrange(keys.events_stream(0))]
        if any(e.get("event") == "accepted" and e.get("task_id") == task_id for e in events):
            return True
        await asyncio.sleep(0.05)
    return False


def test_a_coordinator_serves_new_submissions_after_redis_restarted_empty(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """After an empty restart the running coordinator recreates its consumer groups, writes one
    ``state_lost`` event (and counts it), and accepts a task submitted then."""
    server = redis_server_factory(appendonly=False)
    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry)

    async def scenario() -> None:
        client = Redis.from_url(server.url, decode_responses=True)
        coordinator = Coordinator(client, settings=SETTINGS, name="c", metrics=metrics)
        running = asyncio.create_task(coordinator.run())
        try:
            await client.xadd(keys.intake_stream(0), {"task_id": "before", "task": TASK})
            assert await _accepted(client, "before")
            await asyncio.to_thread(server.restart)
            probe = Redis.from_url(server.url, decode_responses=True)  # a fresh connection
            assert await probe.exists(keys.task_key("before", 0)) == 0  # the data is gone
            await probe.xadd(keys.intake_stream(0), {"task_id": "after", "task": TASK})
            assert await _accepted(probe, "after")
            events = [f for _i, f in await probe.xrange(keys.events_stream(0))]
            await probe.aclose()
            lost = [e for e in events if e["event"] == "state_lost"]
            assert len(lost) == 1, events
            assert lost[0]["coordinator"] == "c"
            assert "NOGROUP" in lost[0]["error"]
            assert registry.get_sample_value("orga_state_lost_total") == 1.0
        finally:
            coordinator.stop()
            await asyncio.wait_for(running, 10)
            await client.aclose()

    asyncio.run(scenario())
