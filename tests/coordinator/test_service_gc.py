"""A running coordinator keeps what was alive at its start out of the garbage collector's
full collections (issue 27: they walked every module's objects each time)."""

from __future__ import annotations

import asyncio
import gc

from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings
from tests.redis_server import RedisClientFactory

SETTINGS = CoordinatorSettings(
    machine=MachineSettings(workspace_root="/ws"), block_ms=50, tick_interval_s=0.05
)


def test_a_running_coordinator_has_frozen_what_was_alive_at_its_start(
    redis_client: RedisClientFactory,
) -> None:
    """Once the loops run, the objects alive at the start are in the permanent generation."""
    gc.unfreeze()

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = Coordinator(client, settings=SETTINGS, name="c")
            running = asyncio.create_task(coordinator.run())
            try:
                for _ in range(200):
                    if gc.get_freeze_count():
                        break
                    await asyncio.sleep(0.05)
                assert gc.get_freeze_count() > 1000
            finally:
                coordinator.stop()
                await asyncio.wait_for(running, 10)

    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()
