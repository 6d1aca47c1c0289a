"""The workers' kombu transport against a real Redis: kombu's Redis transport without ack
emulation (a fetch is one BRPOP, an ack sends nothing), what it still brings back itself (a
requeue, a channel that closes), and Redis refusing writes as a connection error."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue
from kombu.message import Message

from shared.settings import OrgaSettings, celery_config
from tests.redis_server import RedisServer
from workers import broker
from workers.redis_driver import DRIVER_INFO

ROOT = Path(__file__).resolve().parents[2]


def _options(redis_url: str) -> dict[str, Any]:
    """The transport options the workers run with (celery_config's, on Redis)."""
    options: dict[str, Any] = celery_config(OrgaSettings(redis_url=redis_url), redis_url)[
        "broker_transport_options"
    ]
    return options


def _transport(redis_url: str) -> Connection:
    return Connection(redis_url, transport=broker.Transport, transport_options=_options(redis_url))


def _consumer(connection: Connection, queue: str, received: list[Message]) -> Any:
    """A channel consuming ``queue`` (late acks, one message prefetched, as Celery's), each
    message appended to ``received``."""
    channel = connection.default_channel
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(queue, False, received.append, "consumer")
    return channel


def _publish(connection: Connection, queue: str, count: int) -> list[str]:
    """``count`` Celery-like messages; their bodies' markers."""
    producer = Producer(connection.default_channel, exchange=Exchange(queue), routing_key=queue)
    markers = []
    for _ in range(count):
        marker = uuid.uuid4().hex
        body = [[marker], {}, {"callbacks": None, "chain": [], "errbacks": None}]
        producer.publish(body, headers={"task": "t", "id": marker}, serializer="json")
        markers.append(marker)
    return markers


def _declare(connection: Connection) -> str:
    queue = f"test-broker-{uuid.uuid4().hex}"
    Queue(queue, Exchange(queue), routing_key=queue)(connection.default_channel).declare()
    return queue


def _marker(message: Message) -> str:
    marker: str = json.loads(message.body)[0][0]
    return marker


def _queued(raw: redis.Redis, queue: str) -> list[str]:
    """The markers of the messages in ``queue``, the next one to be fetched first."""
    items = raw.lrange(queue, 0, -1)
    bodies = [json.loads(item)["body"] for item in reversed(items)]
    return [json.loads(base64.b64decode(body))[0][0] for body in bodies]


def _drain_one(connection: Connection, received: list[Message]) -> None:
    deadline = time.monotonic() + 5
    count = len(received)
    while len(received) == count and time.monotonic() < deadline:
        connection.drain_events(timeout=5)
    assert len(received) == count + 1


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client of the test's Redis, to look at the lists and commands."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _calls(raw: redis.Redis) -> dict[str, int]:
    """Calls per command (``INFO commandstats``) of the test's Redis."""
    stats = raw.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def test_the_workers_run_kombus_redis_transport_without_ack_emulation(redis_url: str) -> None:
    """celery_config turns kombu's documented ack_emulation option off; the channel then uses
    kombu's virtual QoS (in the worker's memory) and keeps no unacked hash in Redis."""
    assert _options(redis_url)["ack_emulation"] is False
    with _transport(redis_url) as connection:
        channel = connection.default_channel
        assert type(channel).__module__ == "kombu.transport.redis"
        assert channel.ack_emulation is False
        assert type(channel.qos).__module__ == "kombu.transport.virtual.base"


def test_a_fetch_is_one_brpop_and_an_ack_sends_nothing(
    redis_url: str, redis_server_factory: Callable[..., RedisServer]
) -> None:
    """Consuming and acknowledging 20 messages on a Redis of its own sends one BRPOP per
    message, no other command per message (no unacked index, no script), and writes no key
    besides the queue's."""
    server = redis_server_factory()
    with redis.Redis.from_url(server.url) as raw, _transport(server.url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, 20)
        received: list[Message] = []
        _consumer(connection, queue, received)
        raw.config_resetstat()
        for _ in markers:
            _drain_one(connection, received)
            received[-1].ack()
        calls = _calls(raw)
        keys_left = {k.decode() for k in raw.keys("*")}
    assert [_marker(m) for m in received] == markers
    per_message = {name: n for name, n in calls.items() if n >= len(markers)}
    assert set(per_message) == {"brpop"}, calls
    assert calls["brpop"] <= len(markers) + 2, calls
    assert not any("unacked" in key for key in keys_left), keys_left


def test_a_requeued_message_is_pushed_back_at_once(redis_url: str, raw: redis.Redis) -> None:
    """A message rejected with requeue (Celery's task_reject_on_worker_lost when a pool process
    dies) goes back to its queue at once, marked redelivered."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, 2)
        received: list[Message] = []
        _consumer(connection, queue, received)
        _drain_one(connection, received)
        assert _queued(raw, queue) == markers[1:]
        received[0].reject(requeue=True)
        assert sorted(_queued(raw, queue)) == sorted(markers)
        assert json.loads(raw.lindex(queue, 0) or b"{}")["redelivered"] is True


def test_a_channel_that_closes_pushes_back_what_it_fetched_and_did_not_ack(
    redis_url: str, raw: redis.Redis
) -> None:
    """A warm shutdown (or a consumer restart) closes the channel: the messages it fetched and
    did not acknowledge go back to their queue at once; an acknowledged one does not."""
    connection = _transport(redis_url)
    queue = _declare(connection)
    markers = _publish(connection, queue, 3)
    received: list[Message] = []
    channel = _consumer(connection, queue, received)
    channel.basic_qos(prefetch_count=2)
    _drain_one(connection, received)
    _drain_one(connection, received)
    received[0].ack()
    assert _queued(raw, queue) == markers[2:]
    connection.close()
    assert sorted(_queued(raw, queue)) == sorted(markers[1:])


def test_a_message_fetched_by_a_worker_that_dies_stays_with_it(
    redis_url: str, raw: redis.Redis
) -> None:
    """A worker killed holding a message it fetched (SIGKILL: no close, no restore) leaves
    nothing in Redis to restore it from: that message is the coordinator's to re-send
    (coordinator.liveness; tests/integration/test_chaos.py kills workers under load)."""
    connection = _transport(redis_url)
    queue = _declare(connection)
    _publish(connection, queue, 1)
    received: list[Message] = []
    channel = _consumer(connection, queue, received)
    _drain_one(connection, received)
    channel.qos.restore_at_shutdown = False  # killed: its close never runs
    connection.close()
    assert raw.llen(queue) == 0
    assert not raw.keys("unacked*")


def test_out_of_memory_a_fetch_is_served_and_a_refused_requeue_is_a_connection_error(
    redis_url: str, raw: redis.Redis
) -> None:
    """Redis refusing writes (maxmemory 1): BRPOP is not refused, so the consumer keeps
    fetching; a requeue's LPUSH is refused with OutOfMemoryError, which the transport counts
    as a connection error (Celery reconnects instead of stopping the worker)."""
    assert set(broker.TRANSIENT_WRITE_ERRORS) <= set(broker.Transport.connection_errors)
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, 2)
        received: list[Message] = []
        _consumer(connection, queue, received)
        limit = raw.config_get("maxmemory")["maxmemory"] or 0
        raw.config_set("maxmemory", 1)
        try:
            _drain_one(connection, received)
            received[0].ack()
            _drain_one(connection, received)
            with pytest.raises(broker.Transport.connection_errors):
                received[1].reject(requeue=True)
        finally:
            raw.config_set("maxmemory", limit)
    assert [_marker(m) for m in received] == markers


def test_a_connection_lost_while_reading_closes_as_celery_closes_it(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """Redis goes away while the consumer waits in BRPOP holding an unacked message, and a
    channel opened after the consumer's (remote control's fanout queue) fails its close.
    Celery's recovery (``collect``, then ``close``) then closes the consumer's channel after
    kombu let go of the transport's client: the close raises nothing that would end the worker
    (kombu's virtual QoS logs the message it could not push back; the coordinator re-sends
    it)."""
    server = redis_server_factory()
    connection = _transport(server.url)
    queue = _declare(connection)
    received: list[Message] = []
    channel = _consumer(connection, queue, received)
    control = connection.channel()
    fanout = Queue("control", Exchange("control", type="fanout"), auto_delete=True)
    fanout(control).declare()
    control.basic_consume(fanout.name, True, lambda message: None, "control")
    assert control.client is not None
    _publish(connection, queue, 1)
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        connection.drain_events(timeout=5)
    assert len(received) == 1
    channel._brpop_start()  # waiting for the next message, as Celery's event loop does
    server.stop()

    connection.collect(socket_timeout=0.5)  # Celery's on_connection_error_after_connected
    connection.close()  # raises nothing


def test_the_worker_client_shares_one_driver_info(redis_url: str) -> None:
    """The workers' state clients share one DriverInfo, which holds the name and version a
    connection builds for itself without one (what it sends in ``CLIENT SETINFO``)."""
    from redis.asyncio import Redis as AsyncRedis
    from redis.driver_info import DriverInfo

    own = redis.Connection().driver_info
    assert own is not None and own is not DRIVER_INFO
    assert (DRIVER_INFO.formatted_name, DRIVER_INFO.lib_version) == (
        own.formatted_name,
        own.lib_version,
    )
    assert DriverInfo() == DRIVER_INFO
    worker = AsyncRedis.from_url(redis_url, driver_info=DRIVER_INFO)
    assert worker.connection_pool.make_connection().driver_info is DRIVER_INFO


_FLOWER_BROKER_PAGE = """
import asyncio, json
from flower.utils.broker import Broker
from orga.celery import app

with app.connection() as connection:
    uri = connection.as_uri(include_password=True)
    transport = connection.get_transport_cls()
broker = Broker(uri, http_api=None, broker_options=app.conf.broker_transport_options,
                broker_use_ssl=app.conf.broker_use_ssl)
queues = asyncio.run(broker.queues(["orga.reasoning"]))
print(json.dumps({"uri": uri, "transport": f"{transport.__module__}.{transport.__name__}",
                  "broker": type(broker).__name__, "queues": queues}))
"""


def test_flowers_broker_page_reads_the_workers_redis_broker(redis_url: str, tmp_path: Path) -> None:
    """In a fresh process that loads the workers' app, the broker URL keeps its ``redis://``
    scheme, the connection still uses workers.broker's transport, and Flower's Broker page
    (its ``Broker`` factory and ``queues()``) builds its Redis client and counts the messages
    waiting in the reasoning queue of this Redis."""
    raw = redis.Redis.from_url(redis_url)
    raw.delete("orga.reasoning")
    raw.lpush("orga.reasoning", b"one", b"two")
    env = {**os.environ, "ORGA_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _FLOWER_BROKER_PAGE],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    raw.delete("orga.reasoning")
    raw.close()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["uri"].startswith("redis://"), seen
    assert seen["transport"] == "workers.broker.Transport", seen
    assert seen["broker"] == "Redis", seen
    assert seen["queues"] == [{"name": "orga.reasoning", "messages": 2}], seen
