"""The transport seam: the coordinator's dispatches reach the workers through the
:class:`~coordinator.transport.Transport` it is given, and Celery's is one such transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import redis

from coordinator.machine import MachineSettings
from coordinator.relay import CeleryPublisher
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.transport import OutboxEntry, Transport
from shared import keys
from shared.protocol import ReasonRequest
from shared.settings import OrgaSettings
from tests.coordinator.outbox_samples import both_queues
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


def _stored(message: bytes) -> dict[str, object]:
    """A message as kombu's Redis transport stored it, without what differs between two sends
    of the same dispatch by design: the delivery tag kombu draws for each."""
    stored = json.loads(message)
    properties = stored["properties"]
    assert isinstance(properties, dict)
    properties.pop("delivery_tag")
    return stored


def test_the_publisher_sends_the_message_send_task_sends(redis_url: str) -> None:
    """The relay's publish builds each message with Celery's public ``app.amqp`` calls and a
    route worked out once per (task, queue): the broker receives, for a reasoning and a tool
    dispatch, exactly what ``Celery.send_task`` with the same arguments sends (headers,
    properties, body), on the same list, the second dispatch of a pair as the first."""
    publisher = CeleryPublisher.from_settings(OrgaSettings(redis_url=redis_url))
    entries = both_queues()
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(keys.reasoning_queue, keys.tools_queue)
        publisher.publish(entries)
        published = {q: client.lrange(q, 0, -1) for q in (keys.reasoning_queue, keys.tools_queue)}
        client.delete(keys.reasoning_queue, keys.tools_queue)
        for entry in entries:
            publisher.app.send_task(
                entry.task,
                args=[entry.payload],
                queue=entry.queue,
                task_id=entry.id,
                shadow=entry.shadow,
                argsrepr=entry.argsrepr,
                kwargsrepr="{}",
                declare=[],
            )
        sent = {q: client.lrange(q, 0, -1) for q in (keys.reasoning_queue, keys.tools_queue)}
    finally:
        client.delete(keys.reasoning_queue, keys.tools_queue)
        client.close()
        publisher.close()
    for queue in (keys.reasoning_queue, keys.tools_queue):
        assert len(published[queue]) == 2, (queue, published)
        assert [_stored(m) for m in published[queue]] == [_stored(m) for m in sent[queue]]
