"""The workers' kombu transport against a real Redis: the unacked index kept right around each
message, with one kept client per channel."""

from __future__ import annotations

import uuid

import redis
from kombu import Connection

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
