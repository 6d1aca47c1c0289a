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

And it keeps the unacked index in one Lua script per message event instead of kombu's
``MULTI``/``ZADD``/``HSET``/``EXEC`` on fetch and ``MULTI``/``ZREM``/``HDEL``/``EXEC`` on ack
(:class:`QoS`): the same commands on the same keys with the same values, one command to send and
one reply to parse instead of four (about 15 µs of the worker's CPU per fetch and per ack).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from time import time
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual.base import QoS as VirtualQoS
from kombu.utils.json import dumps
from redis.exceptions import NoScriptError, OutOfMemoryError, ReadOnlyError, ResponseError

from workers.redis_driver import DRIVER_INFO

__all__ = ["TRANSIENT_WRITE_ERRORS", "Channel", "QoS", "Transport"]

TRANSIENT_WRITE_ERRORS = (OutOfMemoryError, ReadOnlyError)
"""Redis refusing a write for a while: out of memory, or a replica during a failover."""


_INDEX_SCRIPT = b"""
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
"""
"""kombu's fetch transaction (``QoS.append``): the message's delivery tag in the unacked index
scored by the time of the fetch, and the message under its tag in the unacked hash."""

_FORGET_SCRIPT = b"""
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
"""
"""kombu's ack transaction (``QoS._remove_from_indices``): the tag out of both."""

_SHAS = {
    script: hashlib.sha1(script, usedforsecurity=False).hexdigest()
    for script in (_INDEX_SCRIPT, _FORGET_SCRIPT)
}


def _run_script(client: redis.Redis, script: bytes, keys: tuple[str, str], *args: Any) -> None:
    """``EVALSHA`` the script; ``EVAL`` it (which also caches it) when Redis does not know it.

    Redis before 7 reports a write refused inside a script as ``ERR Error running script ...
    -OOM ...`` (or ``-READONLY``), which redis-py raises as a plain ``ResponseError``: it is
    raised here as the :data:`TRANSIENT_WRITE_ERRORS` it is, as Redis 7 reports it."""
    try:
        try:
            client.evalsha(_SHAS[script], len(keys), *keys, *args)
        except NoScriptError:
            client.eval(script, len(keys), *keys, *args)  # type: ignore[arg-type]
    except TRANSIENT_WRITE_ERRORS:
        raise
    except ResponseError as exc:
        refused = _refused_write(str(exc))
        if refused is None:
            raise
        raise refused(str(exc)) from exc


def _refused_write(message: str) -> type[OutOfMemoryError] | type[ReadOnlyError] | None:
    """The transient write error a script's error message wraps (Redis 6.2), if any."""
    if "OOM command not allowed" in message:
        return OutOfMemoryError
    if "READONLY" in message:
        return ReadOnlyError
    return None


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS, with the unacked index kept by one Lua script per fetch and per ack,
    and which forgets a message locally even when Redis refused to drop it from the unacked
    index.

    The scripts run the very commands kombu's ``MULTI``/``EXEC`` transactions run, on the same
    keys, with the same values (the score is still this process's clock at the fetch, as
    kombu's ``restore_visible`` compares it with its own clock; the payload is kombu's
    ``dumps([raw, exchange, routing_key])``), and a Lua script is atomic as a transaction is:
    no client sees the index without the hash entry or the other way round. Redis refusing a
    write still raises what the transaction raised: out of memory, the ``ZADD`` in the script
    fails with ``OutOfMemoryError`` (before anything was written). One difference, in the
    safe direction: out of memory, Redis refuses a whole ``MULTI`` transaction, the ack's
    ``ZREM``/``HDEL`` included, but runs them from a script (they free memory), so an ack
    then goes through instead of leaving the message to come back after the visibility
    timeout. A requeue, ``restore_by_tag`` and ``restore_visible`` are kombu's own, unchanged.
    With a ``global_keyprefix`` transport option (which kombu adds to each command's keys, but
    to one key only of an ``EVALSHA``) kombu's transactions run instead.

    Forgetting locally: otherwise each refused ack keeps a prefetch slot taken and, after as
    many refusals as the prefetch count, the worker never fetches again. The message stays in
    the index and is restored after the visibility timeout.
    """

    def append(self, message: Any, delivery_tag: Any) -> None:
        """Index a fetched message as unacked (kombu's transaction, as one script)."""
        if self.channel.global_keyprefix:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        delivery = message.delivery_info
        raw = [message._raw, delivery["exchange"], delivery["routing_key"]]
        payload = dumps(raw)  # type: ignore[no-untyped-call]
        with self.channel.conn_or_acquire() as client:
            keys = (self.unacked_index_key, self.unacked_key)
            _run_script(client, _INDEX_SCRIPT, keys, delivery_tag, time(), payload)
        VirtualQoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def ack(self, delivery_tag: Any) -> None:
        """Acknowledge; when Redis refuses, forget it here and raise (Celery logs it)."""
        try:
            self._forget(delivery_tag)
        except TRANSIENT_WRITE_ERRORS:
            VirtualQoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
            raise
        VirtualQoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        """Reject; when Redis refuses, forget it here and raise."""
        if requeue:
            try:
                super().reject(delivery_tag, requeue=True)  # type: ignore[no-untyped-call]
            except TRANSIENT_WRITE_ERRORS:
                VirtualQoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
                raise
            return
        self.ack(delivery_tag)

    def _forget(self, delivery_tag: Any) -> None:
        """The tag out of the unacked index and hash (kombu's transaction, as one script)."""
        if self.channel.global_keyprefix:
            self._remove_from_indices(delivery_tag).execute()  # type: ignore[no-untyped-call]
            return
        with self.channel.conn_or_acquire() as client:
            keys = (self.unacked_index_key, self.unacked_key)
            _run_script(client, _FORGET_SCRIPT, keys, delivery_tag)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with :class:`QoS`, one kept client for synchronous commands, and
    the process's one :data:`~workers.redis_driver.DRIVER_INFO` for its connections."""

    QoS = QoS
    _kept_client: redis.Redis | None = None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        """kombu's connection parameters, with the process's driver info."""
        params: dict[str, Any] = super()._connparams(asynchronous)  # type: ignore[no-untyped-call]
        params["driver_info"] = DRIVER_INFO
        return params

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
