"""Dispatches pushed onto their queues by the commit itself, when the broker is the state Redis
(:class:`coordinator.transport.InlineQueues`): the message is the one the relay's publish
sends, kombu reads it back, it is on the queue exactly when its commit is written (never for a
refused one, never on the outbox), and a dispatch that cannot be laid out goes the outbox's
way; a publisher goes inline only where nothing it would add is lost."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from celery import signals
from kombu import Connection

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.relay import CeleryPublisher
from coordinator.service import Coordinator, CoordinatorSettings
from coordinator.state import TaskRecord
from coordinator.store import CommitConflictError, TaskStore
from coordinator.transport import InlineQueues, OutboxEntry
from shared import keys
from shared.outbox import dispatch_entries
from shared.protocol import ReasonRequest
from shared.settings import OrgaSettings
from shared.task_spec import parse_task
from tests.coordinator.outbox_samples import both_queues
from tests.redis_server import RedisClientFactory

MACHINE = MachineSettings(workspace_root="/ws")


@pytest.fixture
def publisher(redis_url: str) -> Iterator[CeleryPublisher]:
    """The production publisher on the test's Redis, which is its broker too."""
    made = CeleryPublisher.from_settings(OrgaSettings(redis_url=redis_url))
    try:
        yield made
    finally:
        made.close()


def _without_tag(message: bytes) -> dict[str, Any]:
    stored: dict[str, Any] = json.loads(message)
    stored["properties"].pop("delivery_tag")
    return stored


def test_an_inline_message_is_what_the_relays_publish_pushes(
    redis_url: str, publisher: CeleryPublisher
) -> None:
    """For each dispatch, the queue and the bytes a commit pushes are those kombu's Redis
    transport pushes for the relay's publish of it (the delivery tag aside: a fresh one each)."""
    entries = both_queues()
    client = redis.Redis.from_url(redis_url)
    queues = (keys.reasoning_queue, keys.tools_queue)
    try:
        client.delete(*queues)
        publisher.publish(entries)
        published = {q: client.lrange(q, 0, -1)[::-1] for q in queues}  # LPUSH: newest first
    finally:
        client.delete(*queues)
        client.close()
    inline = publisher.inline_messages(entries)
    assert [queue for queue, _m in inline] == [e.queue for e in entries]
    for queue in queues:
        mine = [m for q, m in inline if q == queue]
        assert [_without_tag(m) for m in mine] == [_without_tag(m) for m in published[queue]]
    tags = [json.loads(m)["properties"]["delivery_tag"] for _q, m in inline]
    assert len(set(tags)) == len(tags)


def test_kombu_reads_an_inline_message_back(redis_url: str, publisher: CeleryPublisher) -> None:
    """Pushed as a commit script would, the message is a Celery task message to kombu: the
    task, the id fixed in the entry, Flower's texts and the one argument."""
    (entry, *_rest) = both_queues()
    ((queue, message),) = publisher.inline_messages([entry])
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(queue)
        client.lpush(queue, message)
    finally:
        client.close()
    with Connection(redis_url) as connection:
        received = connection.SimpleQueue(queue)
        got = received.get(timeout=5)
        assert got.headers["task"] == entry.task and got.headers["id"] == entry.id
        assert got.headers["argsrepr"] == entry.argsrepr
        assert got.headers["shadow"] == entry.shadow
        args, kwargs, _embed = got.decode()
        assert args == [entry.payload] and kwargs == {}
        got.ack()
        received.close()


def _record(task_id: str = "t") -> TaskRecord:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "x"}]})
    return TaskRecord(task_id=task_id, spec=spec, created_at=1.0, updated_at=1.0)


def _queued_requests(client: redis.Redis, queue: str = keys.reasoning_queue) -> list[str]:
    """The fences' task ids of the reasoning requests waiting on ``queue``, oldest first."""
    found = []
    for raw in client.lrange(queue, 0, -1)[::-1]:
        message = json.loads(raw)
        assert message["properties"]["body_encoding"] == "base64"
        (payload,), _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        found.append(ReasonRequest.model_validate_json(payload).fence.task_id)
    return found


def test_a_commit_pushes_its_dispatch_and_a_refused_one_nothing(
    redis_url: str, redis_client: RedisClientFactory, publisher: CeleryPublisher
) -> None:
    """With the publisher inline, a commit's dispatch is on its queue when the commit returns,
    with nothing on the outbox and nothing handed to a relay, and the conversation the commit
    writes after it (its messages follow the dispatches among the script's arguments) is the
    one written without inline dispatch; a stale commit refused pushes nothing."""
    handed: list[Sequence[tuple[str, OutboxEntry]]] = []

    async def scenario() -> None:
        async with redis_client() as client:
            await client.delete(keys.reasoning_queue)
            store = TaskStore(client, inline=publisher.inline_messages)
            store.dispatched = lambda _p, entries: handed.append(entries)
            record = _record()
            await store.create(record)
            stale = record.model_copy(deep=True)
            machine = TaskMachine(record, 2.0, MACHINE)
            effects = machine.start()
            dispatches = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
            await store.commit(machine.record, effects, dispatches=dispatches)
            assert await client.llen(keys.reasoning_queue) == 1
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0
            written = await client.lrange(keys.conversation_key("t", 0), 0, -1)
            assert written and written == [
                m.model_dump_json().encode() for m in machine.record.conversation.messages
            ]

            other = TaskMachine(stale, 3.0, MACHINE)
            effects = other.start()
            late = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
            with pytest.raises(CommitConflictError):
                await store.commit(other.record, effects, dispatches=late)
            assert await client.llen(keys.reasoning_queue) == 1

    asyncio.run(scenario())
    assert handed == []
    client = redis.Redis.from_url(redis_url)
    try:
        assert _queued_requests(client) == ["t"]
    finally:
        client.delete(keys.reasoning_queue)
        client.close()


def test_commits_sent_together_push_each_its_own_dispatch(
    redis_url: str, redis_client: RedisClientFactory, publisher: CeleryPublisher
) -> None:
    """Commits of several tasks in one pipeline (``commit_many``) each push their dispatch
    when written; after Redis lost the script, none is written and none pushes, and the
    commit sent again alone (which loads the script) pushes its own."""

    async def scenario() -> None:
        async with redis_client() as client:
            await client.delete(keys.reasoning_queue)
            store = TaskStore(client, inline=publisher.inline_messages)
            pending = []
            for task_id in ("a", "b", "c"):
                record = _record(task_id)
                await store.create(record)
                machine = TaskMachine(record, 2.0, MACHINE)
                effects = machine.start()
                dispatches = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
                pending.append(store.prepare(machine.record, effects, dispatches=dispatches))
            assert await store.commit_many(pending[:2]) == [True, True]
            await client.script_flush()
            assert await store.commit_many(pending[2:]) == [False]
            assert await client.llen(keys.reasoning_queue) == 2
            again = pending[2]
            await store.commit(again.record, again.effects, dispatches=again.dispatches)
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0

    asyncio.run(scenario())
    client = redis.Redis.from_url(redis_url)
    try:
        assert _queued_requests(client) == ["a", "b", "c"]
    finally:
        client.delete(keys.reasoning_queue)
        client.close()


def test_a_dispatch_that_cannot_be_laid_out_goes_through_the_outbox(
    redis_client: RedisClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A transport that fails to lay a dispatch out costs nothing: the commit appends it to the
    outbox and hands it to the relay, as without inline dispatch, and says why in the log."""
    handed: list[Sequence[tuple[str, OutboxEntry]]] = []

    def refuse(entries: Sequence[OutboxEntry]) -> list[tuple[str, bytes]]:
        raise ValueError("no route for orga.reason (test)")

    async def scenario() -> None:
        async with redis_client() as client:
            await client.delete(keys.reasoning_queue)
            store = TaskStore(client, inline=refuse)
            store.dispatched = lambda _p, entries: handed.append(entries)
            record = _record("f")
            await store.create(record)
            machine = TaskMachine(record, 2.0, MACHINE)
            effects = machine.start()
            (sent,) = dispatch_entries(effects.reason_dispatches, effects.tool_dispatches)
            with caplog.at_level(logging.WARNING, logger="orga.coordinator.store"):
                await store.commit(machine.record, effects, dispatches=[sent])
            ((entry_id, fields),) = await client.xrange(keys.commit_outbox_stream(0))
            assert OutboxEntry.from_fields(entry_id.decode(), fields) == sent
            assert await client.llen(keys.reasoning_queue) == 0
            assert [[e for _i, e in h] for h in handed] == [[sent]]

    asyncio.run(scenario())
    (logged,) = [r for r in caplog.records if r.getMessage() == "dispatch.inline_failed"]
    assert logged.__dict__["task_id"] == "f"
    assert "ValueError: no route for orga.reason (test)" in logged.__dict__["error"]


def test_the_coordinators_first_dispatch_is_on_the_queue_with_its_create(
    redis_url: str, redis_client: RedisClientFactory, publisher: CeleryPublisher
) -> None:
    """A coordinator given the inline publisher creates a submitted task with its first
    dispatch already on the reasoning queue: no relay round sends it, none is on the outbox."""
    settings = CoordinatorSettings(machine=MACHINE, block_ms=10)

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            await client.delete(keys.reasoning_queue)
            coordinator = Coordinator(client, publisher=publisher, settings=settings, name="c")
            assert coordinator.store.inline is not None
            await coordinator._ensure_groups()
            for n in (1, 2):
                task = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}
                await client.xadd(
                    keys.intake_stream(0), {"task_id": f"t{n}", "task": json.dumps(task)}
                )
            await coordinator._intake_once()
            assert await client.xlen(keys.commit_outbox_stream(0)) == 0

    asyncio.run(scenario())
    client = redis.Redis.from_url(redis_url)
    try:
        assert _queued_requests(client) == ["t1", "t2"]
    finally:
        client.delete(keys.reasoning_queue)
        client.close()


def test_a_publisher_goes_inline_only_where_nothing_it_adds_is_lost() -> None:
    """Inline on the state Redis by default; not with a broker of its own (another Redis or
    RabbitMQ), not when turned off (``ORGA_INLINE_DISPATCH=false``), not while something
    listens to Celery's publish signals (an instrumentation writing headers there), not with
    compression or a key prefix on the broker."""
    state = "redis://127.0.0.1:1/0"

    def inline(**settings: Any) -> bool:
        made = CeleryPublisher.from_settings(OrgaSettings(redis_url=state, **settings))
        try:
            assert isinstance(made, InlineQueues)
            return made.inline
        finally:
            made.close()

    assert inline()
    assert inline(broker_url=state)
    assert not inline(broker_url="redis://127.0.0.1:1/1")
    assert not inline(broker_url="amqp://guest:guest@127.0.0.1:1//")
    assert not inline(inline_dispatch=False)

    def listening(**_kwargs: Any) -> None:
        return None

    for signal in (signals.before_task_publish, signals.after_task_publish, signals.task_sent):
        signal.connect(listening)
        try:
            assert not inline(), signal.name
        finally:
            signal.disconnect(listening)
    assert inline()

    changes: list[dict[str, Any]] = [
        {"task_compression": "zlib"},
        {"task_send_sent_event": True},
        {"task_default_priority": 5},
        {"task_queue_max_priority": 10},
        {"broker_transport_options": {"global_keyprefix": "x:"}},
    ]
    for change in changes:
        made = CeleryPublisher.from_settings(OrgaSettings(redis_url=state))
        try:
            made.app.conf.update(change)
            assert not made.inline, change
        finally:
            made.close()


def test_laying_a_message_out_needs_no_broker() -> None:
    """The layout is kombu's in-memory channel's: a publisher whose broker refuses every
    connection lays messages out at once, the same as any other's, and closing it twice is
    harmless."""
    made = CeleryPublisher.from_settings(OrgaSettings(redis_url="redis://127.0.0.1:1/0"))
    try:
        entries = both_queues()
        laid_out = made.inline_messages(entries)
        assert [queue for queue, _m in laid_out] == [e.queue for e in entries]
        first = json.loads(laid_out[0][1])
        assert first["headers"]["id"] == entries[0].id
        assert first["properties"]["delivery_info"] == {
            "exchange": "",
            "routing_key": keys.reasoning_queue,
        }
    finally:
        made.close()
        made.close()
