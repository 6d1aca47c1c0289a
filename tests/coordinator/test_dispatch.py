"""Dispatch messages: Celery's own format, read back by kombu, pushed only by a landed commit."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection
from redis.asyncio import Redis

from coordinator.dispatch import CeleryDispatcher
from coordinator.machine import MachineSettings, TaskMachine
from coordinator.state import TaskRecord
from coordinator.store import CommitConflictError, TaskStore
from shared import keys
from shared.celery_wire import celery_message
from shared.settings import OrgaSettings, celery_config
from shared.task_spec import parse_task

PAYLOAD = json.dumps({"fence": {"task_id": "t"}, "text": "héllo"})


def _sent_by_celery(redis_url: str) -> dict[str, Any]:
    app = Celery("reference")
    app.conf.update(celery_config(OrgaSettings(), redis_url))
    app.send_task(
        keys.reason_task_name,
        args=[PAYLOAD],
        queue=keys.reasoning_queue,
        argsrepr="(summary)",
        kwargsrepr="{}",
    )
    with redis.Redis.from_url(redis_url) as client:
        raw = client.rpop(keys.reasoning_queue)
    assert isinstance(raw, bytes)
    message: dict[str, Any] = json.loads(raw)
    return message


def _body(message: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(message["body"]))


def test_messages_have_the_layout_send_task_writes(redis_url: str, redis_client: Any) -> None:
    """Same envelope, headers, properties and body as Celery's send_task (ids aside)."""
    theirs = _sent_by_celery(redis_url)
    queued = celery_message(
        keys.reason_task_name, keys.reasoning_queue, PAYLOAD, "summary", "orga@test"
    )
    ours = json.loads(queued.body)

    assert queued.queue == keys.reasoning_queue
    assert set(ours) == set(theirs)
    assert set(ours["headers"]) == set(theirs["headers"])
    varying = {"id", "root_id", "origin"}
    for name, value in theirs["headers"].items():
        if name not in varying:
            assert ours["headers"][name] == value, name
    assert ours["headers"]["id"] == ours["headers"]["root_id"] == queued.task_id
    # reply_to only matters for results, which orga never stores (task_ignore_result).
    assert set(theirs["properties"]) - set(ours["properties"]) == {"reply_to"}
    for name in ("delivery_mode", "delivery_info", "priority", "body_encoding", "argsrepr"):
        assert ours["properties"][name] == theirs["properties"][name], name
    assert ours["properties"]["correlation_id"] == queued.task_id
    for name in ("content-type", "content-encoding"):
        assert ours[name] == theirs[name]
    assert _body(ours) == _body(theirs)


def test_kombu_reads_the_message_back(redis_url: str, redis_client: Any) -> None:
    """A kombu consumer on the queue decodes the task name and the single JSON argument."""
    queued = celery_message(keys.tool_task_name, keys.tools_queue, PAYLOAD, "s", "orga@test")
    with redis.Redis.from_url(redis_url) as client:
        client.lpush(queued.queue, queued.body)
    with Connection(redis_url) as connection:
        queue = connection.SimpleQueue(keys.tools_queue)
        message = queue.get(timeout=5)
        assert message.headers["task"] == keys.tool_task_name
        args, kwargs, _embed = message.decode()
        assert args == [PAYLOAD] and kwargs == {}
        message.ack()
        queue.close()


def test_a_refused_commit_pushes_nothing(redis_url: str, redis_client: Any) -> None:
    """The messages go out with the commit that awaits them, and not with a stale one."""

    async def scenario() -> None:
        client = Redis.from_url(redis_url)
        store = TaskStore(client)
        dispatcher = CeleryDispatcher()
        try:
            spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "x"}]})
            record = TaskRecord(task_id="t", spec=spec, created_at=1.0, updated_at=1.0)
            await store.create(record)
            stale = record.model_copy(deep=True)
            settings = MachineSettings(workspace_root="/ws")

            machine = TaskMachine(record, 2.0, settings)
            effects = machine.start()
            messages = dispatcher.messages(effects.reason_dispatches, effects.tool_dispatches)
            assert len(messages) == 1
            await store.commit(machine.record, effects, messages=messages)
            assert await client.llen(keys.reasoning_queue) == 1

            other = TaskMachine(stale, 3.0, settings)
            effects = other.start()
            messages = dispatcher.messages(effects.reason_dispatches, effects.tool_dispatches)
            with pytest.raises(CommitConflictError):
                await store.commit(other.record, effects, messages=messages)
            assert await client.llen(keys.reasoning_queue) == 1
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_the_installed_celery_and_kombu_are_checked_at_start_up() -> None:
    """The versions the message layout was checked against pass; another major is refused."""
    import pytest

    from shared.celery_wire import check_versions
    from shared.errors import ConfigError

    assert set(check_versions()) == {"celery", "kombu"}
    with pytest.raises(ConfigError, match=r"kombu 6\.0\.0 is installed.*install a kombu 5\.x"):
        check_versions(lambda package: "6.0.0" if package == "kombu" else "5.4.0")
    with pytest.raises(ConfigError, match=r"celery 5\.2\.7 is installed"):
        check_versions(lambda package: "5.2.7")
