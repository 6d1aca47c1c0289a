"""The workers' broker transport: kombu's Redis transport, with Redis refusing writes treated
like a lost connection.

Out of memory (``maxmemory`` reached), Redis refuses the writes kombu makes around every
message (``ZADD``/``ZREM unacked_index`` on fetch and ack). kombu counts that ``ResponseError``
as a channel error, and Celery then stops the worker: ``Unrecoverable error:
OutOfMemoryError`` (issue 12, item 3). As a connection error it is what it is, a transient
state of the server: an ack that fails is logged and the message comes back after the
visibility timeout (its observation is fenced), and the consumer reconnects with Celery's
back-off until Redis accepts writes again.

It also keeps one Redis client per channel for the synchronous commands kombu makes around
every message (the unacked index on fetch, ack and reject): kombu builds a new ``redis.Redis``
for each (``conn_or_acquire``), about 90 µs of CPU apiece in redis-py 8, two per Celery task.
The client holds no connection of its own (each command borrows one from the channel's pool), so
sharing it between threads is what redis-py supports.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual.base import QoS as VirtualQoS
from redis.exceptions import OutOfMemoryError, ReadOnlyError

__all__ = ["TRANSIENT_WRITE_ERRORS", "Channel", "QoS", "Transport"]

TRANSIENT_WRITE_ERRORS = (OutOfMemoryError, ReadOnlyError)
"""Redis refusing a write for a while: out of memory, or a replica during a failover."""


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, which forgets a message locally even when Redis refused to drop it
    from the unacked index: otherwise each refused ack keeps a prefetch slot taken and, after
    as many refusals as the prefetch count, the worker never fetches again. The message stays
    in the index and is restored after the visibility timeout."""

    def ack(self, delivery_tag: Any) -> None:
        """Acknowledge; when Redis refuses, forget it here and raise (Celery logs it)."""
        try:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
        except TRANSIENT_WRITE_ERRORS:
            VirtualQoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
            raise

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        """Reject; when Redis refuses, forget it here and raise."""
        try:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
        except TRANSIENT_WRITE_ERRORS:
            VirtualQoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
            raise


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with :class:`QoS`, and one kept client for synchronous commands."""

    QoS = QoS
    _kept_client: redis.Redis | None = None

    @contextmanager
    def conn_or_acquire(self, client: redis.Redis | None = None) -> Iterator[redis.Redis]:
        """``client``, else the channel's kept client (rebuilt when kombu replaced its pool,
        after a lost connection)."""
        if client:
            yield client
            return
        kept = self._kept_client
        if kept is None or kept.connection_pool is not self.pool:
            kept = self._kept_client = self._create_client()  # type: ignore[no-untyped-call]
        yield kept


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :data:`TRANSIENT_WRITE_ERRORS` as connection errors."""

    Channel = Channel
    connection_errors = (*kombu_redis.Transport.connection_errors, *TRANSIENT_WRITE_ERRORS)
