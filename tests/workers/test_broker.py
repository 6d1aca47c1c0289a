"""The workers' kombu transport against a real Redis: the unacked index kept right around each
message, with one kept client per channel."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from kombu import Connection
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from workers import broker
from workers.broker import Channel


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
