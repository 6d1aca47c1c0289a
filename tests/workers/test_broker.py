"""The workers' kombu transport against a real Redis: the unacked index kept right around each
message, with one kept client per channel."""

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
from types import MethodType

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue
from kombu.common import ignore_errors
from kombu.message import Message
from kombu.transport import redis as kombu_redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from tests.redis_server import RedisServer
from workers import broker
from workers.broker import Channel

ROOT = Path(__file__).resolve().parents[2]


def test_fetch_and_ack_keep_the_unacked_index_through_one_client(redis_url: str) -> None:
    """A fetched message is in the unacked index until acked; the channel builds one client for
    all the synchronous commands around it, not one per command."""
    queue = f"test-broker-{uuid.uuid4().hex}"
    raw = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport="workers.broker:Transport") as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        channel.queue_declare(queue)
        channel.basic_publish(channel.prepare_message("payload"), "", queue)
        built: list[redis.Redis] = []
        create = channel._create_client

        def counting(*args: object, **kwargs: object) -> redis.Redis:
            client: redis.Redis = create(*args, **kwargs)
            built.append(client)
            return client

        channel._create_client = counting  # type: ignore[method-assign]
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None and message.body == b"payload"
        unacked = channel.unacked_key
        assert raw.hlen(unacked) == 1
        message.ack()
        assert raw.hlen(unacked) == 0
        channel.basic_publish(channel.prepare_message("again"), "", queue)
        second = channel.basic_get(queue, no_ack=False)
        assert second is not None
        second.ack()
        assert len(built) <= 1
    raw.close()


def test_kept_client_follows_a_replaced_pool(redis_url: str) -> None:
    """After kombu drops its pool (a lost connection), the kept client is built again on the
    new pool instead of holding the disconnected one."""
    with Connection(redis_url, transport="workers.broker:Transport") as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first:
            assert first.ping()
        channel._disconnect_pools()
        with channel.conn_or_acquire() as second:
            assert second.ping()
        assert second is not first
        assert second.connection_pool is channel.pool


def test_fetch_and_ack_write_what_kombus_transactions_write(redis_url: str) -> None:
    """The scripts that keep the unacked index put the same entries there as kombu's
    transactions: the tag scored by the fetch time in the index, kombu's payload under the tag
    in the hash; an ack and a reject remove both."""
    queue = f"test-broker-{uuid.uuid4().hex}"
    raw = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport="workers.broker:Transport") as connection:
        channel = connection.default_channel
        channel.queue_declare(queue)
        for body in ("one", "two"):
            channel.basic_publish(channel.prepare_message(body), "", queue)
        before = time.time()
        first = channel.basic_get(queue, no_ack=False)
        second = channel.basic_get(queue, no_ack=False)
        assert first is not None and second is not None
        tag = first.delivery_tag
        score = raw.zscore(channel.unacked_index_key, tag)
        assert score is not None and before <= score <= time.time()
        stored = json.loads(raw.hget(channel.unacked_key, tag) or b"null")
        delivery = first.delivery_info
        expected = [first._raw, delivery["exchange"], delivery["routing_key"]]
        assert stored == json.loads(json.dumps(expected))
        first.ack()
        second.reject(requeue=False)
        for message in (first, second):
            assert raw.zscore(channel.unacked_index_key, message.delivery_tag) is None
            assert raw.hget(channel.unacked_key, message.delivery_tag) is None
    raw.close()


def test_a_refused_fetch_and_ack_raise_out_of_memory_and_free_the_slot(redis_url: str) -> None:
    """Out of memory, indexing a fetched message raises OutOfMemoryError (a connection error
    of the transport) and writes nothing; an ack still removes the tag (ZREM and HDEL free
    memory), and a refused ack frees the prefetch slot."""
    queue = f"test-broker-{uuid.uuid4().hex}"
    raw = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport="workers.broker:Transport") as connection:
        channel = connection.default_channel
        channel.queue_declare(queue)
        channel.basic_publish(channel.prepare_message("payload"), "", queue)
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None
        limit = raw.config_get("maxmemory")["maxmemory"] or 0
        raw.config_set("maxmemory", 1)
        try:
            message.ack()
            assert raw.hget(channel.unacked_key, message.delivery_tag) is None
            with pytest.raises(OutOfMemoryError):
                channel.qos.append(message, "refused-tag")
            assert raw.zscore(channel.unacked_index_key, "refused-tag") is None
        finally:
            raw.config_set("maxmemory", limit)
        assert "refused-tag" not in channel.qos._delivered
    raw.close()


def test_connections_report_redis_pys_own_name_and_version(redis_url: str) -> None:
    """The channel's connections and the worker's client share one DriverInfo, which holds the
    name and version a connection builds for itself without one (what it sends in
    ``CLIENT SETINFO``; Redis before 7.2 does not keep them, so they are compared here)."""
    from redis.asyncio import Redis as AsyncRedis
    from redis.driver_info import DriverInfo

    from workers.redis_driver import DRIVER_INFO

    own = redis.Connection().driver_info
    assert own is not None and own is not DRIVER_INFO
    assert (DRIVER_INFO.formatted_name, DRIVER_INFO.lib_version) == (
        own.formatted_name,
        own.lib_version,
    )
    assert DriverInfo() == DRIVER_INFO
    with Connection(redis_url, transport="workers.broker:Transport") as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as client:
            assert client.ping()
            built = client.connection_pool.get_connection()
            assert built.driver_info is DRIVER_INFO
            client.connection_pool.release(built)
    worker = AsyncRedis.from_url(redis_url, driver_info=DRIVER_INFO)
    assert worker.connection_pool.make_connection().driver_info is DRIVER_INFO


class _Redis62:
    """What Redis 6.2 answers to a script whose write is refused: a plain ``ERR``."""

    def __init__(self, message: str) -> None:
        self.message = message

    def evalsha(self, *args: object) -> None:
        raise ResponseError(self.message)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("ERR Error running script (call to f_x): @user_script:2: -OOM command not allowed when "
         "used memory > 'maxmemory'.", OutOfMemoryError),
        ("ERR Error running script (call to f_x): @user_script:2: -READONLY You can't write "
         "against a read only replica.", ReadOnlyError),
    ],
)  # fmt: skip
def test_a_write_refused_inside_a_script_on_redis_6_is_the_transient_error_it_wraps(
    message: str, expected: type[Exception]
) -> None:
    with pytest.raises(expected):
        broker._run_script(_Redis62(message), broker._FORGET_SCRIPT, ("a", "b"), "tag")  # type: ignore[arg-type]


def test_another_script_error_stays_what_it_is() -> None:
    with pytest.raises(ResponseError) as raised:
        broker._run_script(_Redis62("ERR wrong number"), broker._FORGET_SCRIPT, ("a", "b"), "t")  # type: ignore[arg-type]
    assert type(raised.value) is ResponseError


# -- A burst in one fetch -------------------------------------------------------------------


def _consumer(
    connection: Connection, queue: str, received: list[Message], prefetch: int = 0
) -> Channel:
    """A channel consuming ``queue`` (late acks), each message appended to ``received``."""
    channel = connection.default_channel
    assert isinstance(channel, Channel)
    channel.basic_qos(prefetch_count=prefetch)
    channel.basic_consume(queue, False, received.append, "consumer")
    return channel


def _publish(connection: Connection, queue: str, count: int, **kwargs: object) -> list[str]:
    """``count`` Celery-like messages (empty lists and objects in body and headers); their
    bodies' markers."""
    producer = Producer(connection.default_channel, exchange=Exchange(queue), routing_key=queue)
    markers = []
    for _ in range(count):
        marker = uuid.uuid4().hex
        body = [[marker], {}, {"callbacks": None, "chain": [], "errbacks": None}]
        headers = {"task": "t", "id": marker, "argsrepr": "[]", "stamps": {}, "ignored": []}
        producer.publish(body, headers=headers, serializer="json", **kwargs)
        markers.append(marker)
    return markers


def _declare(connection: Connection) -> str:
    queue = f"test-broker-{uuid.uuid4().hex}"
    Queue(queue, Exchange(queue), routing_key=queue)(connection.default_channel).declare()
    return queue


def _marker(message: Message) -> str:
    marker: str = json.loads(message.body)[0][0]
    return marker


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client of the test's Redis, to look at the lists and the unacked index."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _transport(redis_url: str) -> Connection:
    return Connection(redis_url, transport="workers.broker:Transport")


def test_a_burst_comes_with_one_brpop_in_order_indexed_as_kombu_indexes_it(
    redis_url: str, raw: redis.Redis
) -> None:
    """The messages fetched with the one BRPOP brought are delivered after it in BRPOP's order
    (priority lists first to last, each oldest first), and each is in the unacked index with
    the very entry kombu's own transaction writes for it."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        low = _publish(connection, queue, 3, priority=9)
        high = _publish(connection, queue, 4, priority=0)
        received: list[Message] = []
        channel = _consumer(connection, queue, received)
        before = time.time()
        connection.drain_events(timeout=5)
        after = time.time()
        assert [_marker(message) for message in received] == high + low
        for message in received:
            tag = message.delivery_tag
            score = raw.zscore(channel.unacked_index_key, tag)
            assert score is not None and before <= score <= after
            ours = raw.hget(channel.unacked_key, tag)
            kombu_redis.QoS.append(channel.qos, message, tag)  # kombu's transaction
            assert ours == raw.hget(channel.unacked_key, tag)
            assert tag in channel.qos._delivered
        assert not channel.qos._indexed and not channel._fetched
        for message in received:
            message.ack()
        assert all(raw.hget(channel.unacked_key, m.delivery_tag) is None for m in received)


def test_a_message_not_kombus_in_a_burst_goes_back_next_with_those_after_it(
    redis_url: str, raw: redis.Redis
) -> None:
    """The fetch pops a list's messages with one RPOP (a count); one that is not kombu's is
    pushed back where it was, still next, with the ones popped after it in their order, and
    fetching stops there: the list is as it was but for the messages delivered."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        first = _publish(connection, queue, 3)
        raw.lpush(queue, b"not a kombu message")
        _publish(connection, queue, 2)
        before = raw.lrange(queue, 0, -1)
        received: list[Message] = []
        channel = _consumer(connection, queue, received)
        connection.drain_events(timeout=5)
        assert [_marker(m) for m in received] == first
        assert raw.lrange(queue, 0, -1) == before[:3]
        assert raw.lindex(queue, -1) == b"not a kombu message"
        assert not channel.qos._indexed and not channel._fetched
        for message in received:
            message.ack()


def test_an_empty_fetch_sends_no_rpop_to_the_priority_lists(
    redis_url: str, raw: redis.Redis
) -> None:
    """With nothing more in the queue, a fetch pops its first list once and looks at kombu's
    priority lists (which nothing fills without a priority) with one EXISTS."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 1)
        received: list[Message] = []
        _consumer(connection, queue, received)
        raw.config_resetstat()
        connection.drain_events(timeout=5)
        assert len(received) == 1
        stats = raw.info("commandstats")
        assert stats["cmdstat_rpop"]["calls"] == 1
        assert stats["cmdstat_exists"]["calls"] == 1
        received[0].ack()


def test_a_fetch_takes_at_most_fetch_more_and_what_the_prefetch_count_allows(
    redis_url: str,
    raw: redis.Redis,
) -> None:
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, broker.FETCH_MORE + 5)
        received: list[Message] = []
        _consumer(connection, queue, received)
        connection.drain_events(timeout=5)
        assert [_marker(m) for m in received] == markers[: broker.FETCH_MORE + 1]
        assert raw.llen(queue) == 4
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, 10)
        received = []
        channel = _consumer(connection, queue, received, prefetch=4)
        connection.drain_events(timeout=5)
        assert [_marker(m) for m in received] == markers[:4]
        assert raw.llen(queue) == 6
        assert not channel.qos.can_consume()
        received[0].ack()
        received[1].ack()
        connection.drain_events(timeout=5)
        assert [_marker(m) for m in received] == markers[:6]


def test_a_message_that_is_not_kombus_is_pushed_back_intact_and_stops_the_fetch(
    redis_url: str,
    raw: redis.Redis,
) -> None:
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        for malformed in (b"not json", b'{"properties": {"delivery_tag": 7}}', b"[]"):
            raw.delete(queue)
            first = _publish(connection, queue, 2)
            raw.lpush(queue, malformed)
            after = _publish(connection, queue, 2)
            listed = raw.lrange(queue, 0, -1)
            received: list[Message] = []
            channel = _consumer(connection, queue, received)
            connection.drain_events(timeout=5)
            channel.basic_cancel("consumer")
            assert [_marker(m) for m in received] == first
            assert raw.lrange(queue, 0, -1) == listed[:3]
            assert raw.lindex(queue, -1) == malformed
            del after


def test_a_delivery_that_raises_pushes_back_the_messages_not_delivered(
    redis_url: str, raw: redis.Redis
) -> None:
    """A callback that raises: the messages after it go back where they were, unchanged and in
    order, and out of the unacked index; the one that raised was delivered (its consumer saw
    it): it stays unacked, as kombu leaves it."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 6)
        listed = raw.lrange(queue, 0, -1)  # newest first
        received: list[Message] = []

        def failing(message: Message) -> None:
            received.append(message)
            if len(received) == 2:
                raise RuntimeError("callback failed")

        channel = connection.default_channel
        assert isinstance(channel, Channel)
        channel.basic_consume(queue, False, failing, "consumer")
        with pytest.raises(RuntimeError):
            connection.drain_events(timeout=5)
        assert raw.lrange(queue, 0, -1) == listed[:4]
        assert not channel.qos._indexed and not channel._fetched
        pending = [json.loads(item)["properties"]["delivery_tag"] for item in listed[:4]]
        assert all(raw.hget(channel.unacked_key, tag) is None for tag in pending)
        assert all(raw.zscore(channel.unacked_index_key, tag) is None for tag in pending)
        assert [m.delivery_tag for m in received] == list(channel.qos._delivered)
        for message in received:
            message.ack()


def test_a_message_whose_delivery_fails_before_its_consumer_is_pushed_back_too(
    redis_url: str,
    raw: redis.Redis,
) -> None:
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 5)
        listed = raw.lrange(queue, 0, -1)
        received: list[Message] = []
        channel = _consumer(connection, queue, received)
        built = 0
        message_class = channel.Message

        def breaking(*args: object, **kwargs: object) -> Message:
            nonlocal built
            built += 1
            if built == 3:
                raise ValueError("cannot build")
            return message_class(*args, **kwargs)

        channel.Message = breaking  # type: ignore[assignment,method-assign]
        with pytest.raises(ValueError, match="cannot build"):
            connection.drain_events(timeout=5)
        assert len(received) == 2
        assert raw.lrange(queue, 0, -1) == listed[:3]
        for message in received:
            message.ack()


def test_a_channel_closed_by_a_callback_pushes_back_the_messages_not_delivered(
    redis_url: str,
    raw: redis.Redis,
) -> None:
    """A callback that closes the channel: the messages fetched and not delivered go back as
    they were. (A callback that cancels its consumer still gets them: kombu defers the cancel
    until what the read brought is delivered, celery/celery#1773.)"""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 4)
        listed = raw.lrange(queue, 0, -1)
        received: list[Message] = []
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        channel.qos.restore_at_shutdown = False

        def closing(message: Message) -> None:
            received.append(message)
            assert len(channel._fetched) == 3
            # kombu's close in a callback would read the reply being delivered again, and
            # defer the consumer's cancel to after the read, when the channel is gone
            channel._in_poll = None
            connection.transport.cycle._in_protected_read = False
            channel.close()

        channel.basic_consume(queue, False, closing, "consumer")
        connection.drain_events(timeout=5)
        assert len(received) == 1
        assert raw.lrange(queue, 0, -1) == listed[:3]
        assert not channel._fetched and not channel.qos._indexed
        assert raw.hget(channel.unacked_key, received[0].delivery_tag) is not None
        raw.hdel(channel.unacked_key, received[0].delivery_tag)
        raw.zrem(channel.unacked_index_key, received[0].delivery_tag)


def test_messages_fetched_by_a_worker_that_dies_come_back_after_the_visibility_timeout(
    redis_url: str,
    raw: redis.Redis,
) -> None:
    """A worker killed between the fetch and the deliveries: every message fetched is in the
    unacked index, and kombu's restore_visible puts each back in its queue."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, 5)
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        channel.qos.restore_at_shutdown = False  # killed: no restore at the close

        def killed(message: Message) -> None:
            raise SystemExit("killed")

        channel.basic_consume(queue, False, killed, "consumer")
        channel._unfetch = lambda: None  # type: ignore[method-assign]  # killed: no push back
        with pytest.raises(SystemExit):
            connection.drain_events(timeout=5)
        assert raw.llen(queue) == 0
    options = {"visibility_timeout": 0}
    transport = "workers.broker:Transport"
    with Connection(redis_url, transport=transport, transport_options=options) as restoring:
        restoring.default_channel.qos.restore_visible(num=1000)
    restored = [
        json.loads(base64.b64decode(json.loads(item)["body"]))[0][0]
        for item in raw.lrange(queue, 0, -1)
    ]
    assert sorted(restored) == sorted(markers)


def test_with_a_global_keyprefix_a_fetch_takes_one_message_as_kombu_does(
    redis_url: str, raw: redis.Redis
) -> None:
    options = {"global_keyprefix": f"pfx-{uuid.uuid4().hex}:"}
    with Connection(
        redis_url, transport="workers.broker:Transport", transport_options=options
    ) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, 3)
        received: list[Message] = []
        channel = _consumer(connection, queue, received)
        connection.drain_events(timeout=5)
        assert [_marker(m) for m in received] == markers[:1]
        assert raw.llen(options["global_keyprefix"] + queue) == 2
        prefixed = options["global_keyprefix"] + channel.unacked_key
        assert raw.hget(prefixed, received[0].delivery_tag) is not None
        received[0].ack()


def test_basic_get_takes_one_message(redis_url: str, raw: redis.Redis) -> None:
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 3)
        message = connection.default_channel.basic_get(queue, no_ack=False)
        assert message is not None
        assert raw.llen(queue) == 2
        message.ack()


def test_out_of_memory_the_fetch_pops_nothing_more(redis_url: str, raw: redis.Redis) -> None:
    """Redis refusing the first write of the fetch script: OutOfMemoryError (a connection
    error), and the messages after the one BRPOP brought stay in their list."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 3)
        received: list[Message] = []
        _consumer(connection, queue, received)
        limit = raw.config_get("maxmemory")["maxmemory"] or 0
        raw.config_set("maxmemory", 1)
        try:
            with pytest.raises(OutOfMemoryError):
                connection.drain_events(timeout=5)
        finally:
            raw.config_set("maxmemory", limit)
        assert received == [] and raw.llen(queue) == 2


@pytest.mark.parametrize("count", [1, 6])
def test_the_messages_of_a_fetch_whose_reply_was_lost_go_back_at_the_next_read(
    redis_url: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """The script ran (the message BRPOP brought indexed, more popped and indexed) but its
    reply was lost: none was delivered, so the next read puts them all back in their queue and
    out of the unacked index, and delivers them; nothing waits for the visibility timeout.
    One message alone (nothing more to fetch) is put back too, where kombu leaves it
    unacked."""
    real = broker._run_script
    lost = []

    def reply_lost(client: redis.Redis, script: bytes, keys: tuple[str, ...], *args: object):  # type: ignore[no-untyped-def]
        result = real(client, script, keys, *args)
        if script is broker._INDEX_AND_FETCH_SCRIPT and not lost:
            lost.append(script)
            raise redis.ConnectionError("the reply was lost (simulated: the script ran)")
        return result

    monkeypatch.setattr(broker, "_run_script", reply_lost)
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        markers = _publish(connection, queue, count)
        received: list[Message] = []
        channel = _consumer(connection, queue, received)
        with pytest.raises(redis.ConnectionError):
            connection.drain_events(timeout=5)
        assert not received and raw.llen(queue) == count - min(count, broker.FETCH_MORE + 1)
        assert raw.hlen(channel.unacked_key) == count
        while len(received) < count:
            connection.drain_events(timeout=5)
        assert sorted(_marker(m) for m in received) == sorted(markers)
        assert all(m.headers.get("redelivered") for m in received)  # kombu marks restores
        assert raw.llen(queue) == 0 and not broker._UNANSWERED
        assert raw.hlen(channel.unacked_key) == count  # each once: delivered and unacked
        for message in received:
            message.ack()
        assert raw.hlen(channel.unacked_key) == 0


def test_with_celerys_disable_prefetch_a_fetch_takes_one_message(
    redis_url: str, raw: redis.Redis
) -> None:
    """Celery's ``--disable-prefetch`` replaces the QoS's ``can_consume`` with one that counts
    the worker's reserved tasks: the fetch then takes no more messages along."""
    with _transport(redis_url) as connection:
        queue = _declare(connection)
        _publish(connection, queue, 5)
        received: list[Message] = []
        channel = _consumer(connection, queue, received)
        qos = channel.qos
        original = qos.can_consume

        def can_consume(self: object) -> bool:  # as Celery's: reserved tasks, then kombu's
            return bool(original())

        qos.can_consume = MethodType(can_consume, qos)  # type: ignore[method-assign]
        connection.drain_events(timeout=5)
        assert len(received) == 1 and raw.llen(queue) == 4
        for message in received:
            message.ack()


def test_a_connection_lost_while_reading_closes_as_celery_closes_it(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """Redis goes away while the consumer waits in BRPOP holding an unacked message, and a
    channel opened after the consumer's (remote control's fanout queue) fails its close.
    Celery's recovery (``collect``, then ``close``) then closes the consumer's channel after
    kombu let go of the transport's client: that close fails as a connection error, which
    Celery ignores before it reconnects, not as the ``AttributeError`` (kombu 5.7) that ends
    the worker. The message stays in the unacked index, for ``restore_visible``."""
    server = redis_server_factory(appendonly=True)
    connection = _transport(server.url)
    queue = _declare(connection)
    received: list[Message] = []
    channel = _consumer(connection, queue, received)
    control = connection.channel()
    fanout = Queue("control", Exchange("control", type="fanout"), auto_delete=True)
    fanout(control).declare()
    control.basic_consume(fanout.name, True, lambda message: None, "control")
    assert control.client is not None  # used, so its close deletes its auto-delete queue
    _publish(connection, queue, 1)
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        # An event on the fanout's subscription (its confirmation) also ends a drain.
        connection.drain_events(timeout=5)
    assert len(received) == 1
    channel._brpop_start()  # waiting for the next message, as Celery's event loop does
    server.stop()

    connection.collect(socket_timeout=0.5)  # Celery's on_connection_error_after_connected
    assert not channel.closed
    ignore_errors(connection, connection.close)

    server.start()
    with redis.Redis.from_url(server.url) as client:
        assert client.hkeys(channel.unacked_key) == [received[0].delivery_tag.encode()]


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
