"""The transport seam: the coordinator's dispatches reach the workers through the
:class:`~coordinator.transport.Transport` it is given, and Celery's is one such transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from coordinator.machine import MachineSettings
from coordinator.relay import CeleryPublisher
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.transport import OutboxEntry, Transport
from shared import keys
from shared.protocol import ReasonRequest
from shared.settings import OrgaSettings
from tests.redis_server import RedisClientFactory

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"), block_ms=10)


class RecordingTransport:
    """A transport of the test's own: keeps what it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[OutboxEntry] = []

    def publish(self, entries: Sequence[OutboxEntry]) -> None:
        self.sent.extend(entries)


def test_the_celery_publisher_is_a_transport() -> None:
    """The production publisher implements the seam the coordinator and relay are typed
    against."""
    publisher = CeleryPublisher.from_settings(OrgaSettings(redis_url="redis://127.0.0.1:1/0"))
    try:
        assert isinstance(publisher, Transport)
    finally:
        publisher.close()
    assert isinstance(RecordingTransport(), Transport)


def test_the_coordinator_sends_its_dispatches_through_its_transport(
    redis_client: RedisClientFactory,
) -> None:
    """A task's first reasoning dispatch goes out through the transport the coordinator was
    given, and through nothing else: no Celery queue receives it."""
    transport = RecordingTransport()

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = Coordinator(client, publisher=transport, settings=SETTINGS, name="c")
            await coordinator._ensure_groups()
            task = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}
            await client.xadd(keys.intake_stream(0), {"task_id": "t1", "task": json.dumps(task)})
            await coordinator._intake_once()
            assert coordinator.relay is not None
            assert await coordinator.relay.relay_once() == 1
            (entry,) = transport.sent
            assert entry.task == keys.reason_task_name and entry.queue == keys.reasoning_queue
            assert ReasonRequest.model_validate_json(entry.payload).fence.task_id == "t1"
            assert await client.llen(keys.reasoning_queue) == 0

    asyncio.run(run())
