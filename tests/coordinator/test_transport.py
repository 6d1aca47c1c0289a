"""The transport seam: the coordinator's dispatches reach the workers through the
:class:`~coordinator.transport.Transport` it is given, and Celery's is one such transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from coordinator.dispatch import CeleryDispatcher
from coordinator.machine import MachineSettings
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.transport import QueuedMessage, Transport
from shared import keys
from shared.protocol import ReasonRequest, ToolRequest
from tests.redis_server import RedisClientFactory

SETTINGS = CoordinatorSettings(machine=MachineSettings(workspace_root="/ws"), block_ms=10)


class RecordingTransport:
    """A transport of the test's own: records the requests, sends each on a list of its own."""

    queue = "test.transport"

    def __init__(self) -> None:
        self.reasons: list[ReasonRequest] = []

    def messages(
        self, reasons: Sequence[ReasonRequest], tools: Sequence[ToolRequest]
    ) -> list[QueuedMessage]:
        self.reasons.extend(reasons)
        return [
            QueuedMessage(self.queue, request.model_dump_json(), f"m{i}")
            for i, request in enumerate([*reasons, *tools])
        ]


def test_the_celery_dispatcher_is_a_transport() -> None:
    """The production dispatcher implements the seam the coordinator is typed against."""
    assert isinstance(CeleryDispatcher(), Transport)
    assert isinstance(RecordingTransport(), Transport)


def test_the_coordinator_sends_its_dispatches_through_its_transport(
    redis_client: RedisClientFactory,
) -> None:
    """A task's first reasoning dispatch goes through the given transport, and the commit
    pushes exactly what the transport made: nothing reaches Celery's queues."""
    transport = RecordingTransport()

    async def run() -> None:
        async with redis_client(decode_responses=True) as client:
            coordinator = Coordinator(client, dispatcher=transport, settings=SETTINGS, name="c")
            await coordinator._ensure_groups()
            task = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}
            await client.xadd(keys.intake_stream, {"task_id": "t1", "task": json.dumps(task)})
            await coordinator._intake_once()
            # (a judgement made on a stale copy is made again: asked more than once)
            assert {r.fence.task_id for r in transport.reasons} == {"t1"}
            sent = await client.lrange(RecordingTransport.queue, 0, -1)
            assert [ReasonRequest.model_validate_json(m).fence.task_id for m in sent] == ["t1"]
            assert await client.llen(keys.reasoning_queue) == 0

    asyncio.run(run())
