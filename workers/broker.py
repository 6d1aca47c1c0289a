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

And it takes a burst in one round trip (:data:`FETCH_MORE`): kombu reads one message per
``BRPOP`` and indexes it with one more round trip, so the coordinator's batch of 200 messages
costs the consumer thread 400 round trips. When a message arrives by ``BRPOP``, the script that
indexes it also pops up to :data:`FETCH_MORE` more ready messages of the same queue (in the
order ``BRPOP`` reads its lists) and indexes each exactly as kombu would; the channel then
delivers them one by one, as if each had come by its own ``BRPOP``. A popped message is in the
unacked index from the moment it leaves its list, so a worker that dies before delivering it
loses nothing (kombu's ``restore_visible`` brings it back); one that is not delivered (the
channel closes, a delivery raises) is pushed back where it came from, unchanged. A fetch whose
reply is lost (the connection drops after Redis ran the script) delivered none of the messages
it indexed: the process's next read restores them (kombu's ``restore_by_tag``, found by the
fetch's score, this process's clock at the fetch), where kombu alone leaves even the one message
for the visibility timeout. With Celery's ``--disable-prefetch`` a fetch takes one message.

It is chosen by the broker URL's own scheme (:func:`serve_redis_urls`): ``redis://`` and
``rediss://`` name this transport in kombu's alias table, so the connection's URL keeps the
scheme Flower and other tools read (with ``broker_transport`` set to this class's import path,
``as_uri()`` gave ``workers.broker:Transport://...`` and Flower's Broker page refused it).
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from time import time
from typing import Any

import redis
from kombu.transport import TRANSPORT_ALIASES, get_transport_cls
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual.base import QoS as VirtualQoS
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.exceptions import NoScriptError, OutOfMemoryError, ReadOnlyError, ResponseError

from workers.redis_driver import DRIVER_INFO

__all__ = [
    "FETCH_MORE",
    "REDIS_SCHEMES",
    "TRANSIENT_WRITE_ERRORS",
    "Channel",
    "QoS",
    "Transport",
    "serve_redis_urls",
]

log = logging.getLogger("orga.worker.broker")

_LOST_REPLY = (redis.ConnectionError, redis.TimeoutError)
"""A command sent whose reply never came: it may have run."""

_UNANSWERED: deque[float] = deque()
"""Scores of this process's fetches whose reply was lost (:meth:`Channel._restore_unanswered`;
the consumer thread only: it fetches, and a new channel after a reconnect reads it)."""

FETCH_MORE = 16
"""At most this many more messages taken with one that ``BRPOP`` brought (fewer when the
prefetch count leaves less room). Two reasoning processes share one queue: a larger batch
would give one of them a whole burst while the other waits for the next."""

TRANSIENT_WRITE_ERRORS = (OutOfMemoryError, ReadOnlyError)
"""Redis refusing a write for a while: out of memory, or a replica during a failover."""


_FORGET_SCRIPT = b"""
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
"""
"""kombu's ack transaction (``QoS._remove_from_indices``): the tag out of both."""

_INDEX_AND_FETCH_SCRIPT = b"""
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local more = tonumber(ARGV[4])
local fetched = {}
local function put_back(list, items, from)
  for j = #items, from, -1 do
    redis.call('RPUSH', list, items[j])
  end
end
for k = 3, #KEYS do
  if more <= 0 then break end
  if k == 4 and redis.call('EXISTS', unpack(KEYS, 4)) == 0 then break end
  local items = redis.call('RPOP', KEYS[k], more)
  if items then
    for i = 1, #items do
      local item = items[i]
      local tag, exchange, routing_key
      local decoded, message = pcall(cjson.decode, item)
      if decoded and type(message) == 'table' then
        local properties = message['properties']
        if type(properties) == 'table' then
          tag = properties['delivery_tag']
          local info = properties['delivery_info']
          if type(info) == 'table' then
            exchange = info['exchange']
            routing_key = info['routing_key']
          end
        end
      end
      if type(tag) ~= 'string' or type(exchange) ~= 'string' or type(routing_key) ~= 'string' then
        put_back(KEYS[k], items, i)
        return fetched
      end
      local payload = '[' .. item .. ', ' .. cjson.encode(exchange) .. ', '
        .. cjson.encode(routing_key) .. ']'
      local indexed = redis.pcall('ZADD', KEYS[1], ARGV[2], tag)
      if type(indexed) == 'table' and indexed['err'] then
        put_back(KEYS[k], items, i)
        return fetched
      end
      local stored = redis.pcall('HSET', KEYS[2], tag, payload)
      if type(stored) == 'table' and stored['err'] then
        redis.pcall('ZREM', KEYS[1], tag)
        put_back(KEYS[k], items, i)
        return fetched
      end
      fetched[#fetched + 1] = k - 2
      fetched[#fetched + 1] = tag
      fetched[#fetched + 1] = item
      more = more - 1
    end
  end
end
return fetched
"""
"""kombu's fetch transaction (``QoS.append``: the message's delivery tag in the unacked index
scored by the time of the fetch, and the message under its tag in the unacked hash), then
up to ``ARGV[4]`` more messages popped from its queue's lists (``KEYS[3]`` on, in ``BRPOP``'s
order; each list with one ``RPOP list count``, and the lists after the first, kombu's
priority lists, which nothing fills unless a task is sent with a priority, only when one of
them exists: one ``EXISTS`` instead of an empty ``RPOP`` each, since issue 27), each indexed
as kombu's transaction would: its tag scored by the same time, and under
it ``[message, exchange, routing_key]`` (the message as it was in the list, byte for byte, not
decoded and encoded again: cjson turns an empty JSON array into an object). A message that is
not kombu's (no string ``delivery_tag``, ``exchange`` or ``routing_key`` in its properties) is
pushed back where it was, still next, with the ones popped after it in their order, and
fetching stops: the ``BRPOP`` path deals with it. A script is not rolled back on an error, so
nothing can fail between a pop and its indexing without the message (and those popped after
it) being pushed back. Returns ``[list index, tag, message, ...]``."""

_UNFETCH_SCRIPT = b"""
for i = #ARGV / 2, 1, -1 do
  local tag = ARGV[2 * i - 1]
  if redis.call('HDEL', KEYS[2], tag) == 1 then
    redis.call('ZREM', KEYS[1], tag)
    redis.call('RPUSH', KEYS[2 + i], ARGV[2 * i])
  end
end
"""
"""Messages fetched and never delivered, back where they were (``KEYS[2 + i]``, ``ARGV[2i-1]`` its
tag, ``ARGV[2i]`` the message) in their order, the first one next, and out of the unacked
index. One that is no longer in the unacked hash was restored already (``restore_visible``
of another process): it is not pushed twice. Writing nothing before the first ``HDEL``, the
script is not refused out of memory once it has freed one."""

_SHAS = {
    script: hashlib.sha1(script, usedforsecurity=False).hexdigest()
    for script in (_FORGET_SCRIPT, _INDEX_AND_FETCH_SCRIPT, _UNFETCH_SCRIPT)
}


def _run_script(client: redis.Redis, script: bytes, keys: tuple[str, ...], *args: Any) -> Any:
    """``EVALSHA`` the script; ``EVAL`` it (which also caches it) when Redis does not know it.

    Redis before 7 reports a write refused inside a script as ``ERR Error running script ...
    -OOM ...`` (or ``-READONLY``), which redis-py raises as a plain ``ResponseError``: it is
    raised here as the :data:`TRANSIENT_WRITE_ERRORS` it is, as Redis 7 reports it."""
    try:
        try:
            return client.evalsha(_SHAS[script], len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(script, len(keys), *keys, *args)  # type: ignore[arg-type]
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._indexed: set[str] = set()
        """Tags of messages fetched with another and indexed by its script, not yet delivered
        (only the consumer thread, which fetches and delivers, reads or changes it)."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        """Index a fetched message as unacked (kombu's transaction, as one script); one that
        ``BRPOP`` brought takes more of its queue along (:data:`FETCH_MORE`)."""
        if self.channel.global_keyprefix:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        indexed = self._indexed
        if indexed and delivery_tag in indexed:
            indexed.discard(delivery_tag)
            VirtualQoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]
            return
        delivery = message.delivery_info
        raw = [message._raw, delivery["exchange"], delivery["routing_key"]]
        payload = dumps(raw)  # type: ignore[no-untyped-call]
        channel: Channel = self.channel
        queue = channel._fetching_for()
        more = self._room() if queue is not None else 0
        score = time()
        try:
            with channel.conn_or_acquire() as client:
                lists = []
                if queue is not None and more:
                    steps = channel.priority_steps
                    lists = [channel._q_for_pri(queue, pri) for pri in steps]  # type: ignore[no-untyped-call]
                keys = (self.unacked_index_key, self.unacked_key, *lists)
                fetched = _run_script(
                    client, _INDEX_AND_FETCH_SCRIPT, keys, delivery_tag, score, payload, more
                )
            if queue is not None:
                channel._hold(queue, lists, fetched)
        except _LOST_REPLY:
            _UNANSWERED.append(score)  # restored at this process's next read
            raise
        VirtualQoS.append(self, message, delivery_tag)  # type: ignore[no-untyped-call]

    def _room(self) -> int:
        """How many more messages may come with the one being appended: :data:`FETCH_MORE`, or
        fewer when the prefetch count leaves less room (kombu's estimate counts the delivered
        messages, not yet the one being appended)."""
        if "can_consume" in vars(self):
            return 0  # Celery's --disable-prefetch replaced it: take one message at a time
        estimate: int | None = self.can_consume_max_estimate()  # type: ignore[no-untyped-call]
        if estimate is None:  # prefetch count 0: unlimited
            return FETCH_MORE
        return max(min(FETCH_MORE, estimate - 1), 0)

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
    """kombu's Redis channel with :class:`QoS`, one kept client for synchronous commands, the
    process's one :data:`~workers.redis_driver.DRIVER_INFO` for its connections, and the
    messages fetched along with one that ``BRPOP`` brought delivered after it."""

    QoS = QoS
    _kept_client: redis.Redis | None = None
    _reading_brpop = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._fetched: deque[tuple[str, str, str, bytes]] = deque()
        """(queue, list, tag, message) of messages fetched and indexed, not yet delivered."""
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        """kombu's connection parameters, with the process's driver info.

        A channel whose connection kombu has already let go of (``Connection.collect``
        clears the transport's ``client``) has none: asked for them (its close restoring its
        unacked messages), it raises a connection error, which the close's callers ignore,
        where kombu raises ``AttributeError`` and Celery stops the worker. This happens when
        Redis goes away while the consumer waits in ``BRPOP`` and a channel closed after it
        (remote control's, with its fanout queue) fails its own close: Celery's ``collect``
        then leaves the consumer's channel open and its ``close`` finds no client. The unacked
        messages stay in the unacked index, and ``restore_visible`` brings them back."""
        if self.connection is None or self.connection.client is None:
            raise redis.ConnectionError(
                "this broker channel's connection is already closed (kombu let go of it after"
                " the connection to Redis was lost); its unacknowledged messages come back"
                " after the visibility timeout"
            )
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

    def _brpop_read(self, **options: Any) -> Any:
        """kombu's: deliver the message ``BRPOP`` brought; then those fetched with it, in order.

        If a delivery raises, the messages not yet delivered are pushed back, and the error
        goes on (to Celery, which restarts the consumer)."""
        if _UNANSWERED:
            self._restore_unanswered()
        self._reading_brpop = not self._closing
        try:
            delivered = super()._brpop_read(**options)  # type: ignore[no-untyped-call]
        except BaseException:
            self._unfetch()
            raise
        finally:
            self._reading_brpop = False
        fetched = self._fetched
        while fetched:
            queue, key, tag, item = fetched[0]
            if self.closed or self.connection is None or queue not in self.connection._callbacks:
                self._unfetch()  # the consumer is gone: another process takes them
                break
            fetched.popleft()
            try:
                self.connection._deliver(loads(bytes_to_str(item)), queue)  # type: ignore[no-untyped-call]
            except BaseException:
                if tag in self.qos._indexed:  # it never reached the consumer
                    fetched.appendleft((queue, key, tag, item))
                self._unfetch()
                raise
        return delivered

    def _restore_unanswered(self) -> None:
        """Put back the messages of fetches whose reply was lost (the script may have run):
        the tags the unacked index holds with such a fetch's score (the fetch's clock, one per
        fetch) were never delivered, and go back to their queue by kombu's ``restore_by_tag``
        (a watched transaction: a message another process restored meanwhile is not pushed
        twice). While Redis cannot be reached, they wait for the next read."""
        while _UNANSWERED:
            score = _UNANSWERED[0]
            try:
                with self.conn_or_acquire() as client:
                    tags = client.zrangebyscore(self.unacked_index_key, score, score)
                    for tag in tags:
                        self.qos.restore_by_tag(bytes_to_str(tag), client)  # type: ignore[no-untyped-call]
            except _LOST_REPLY:
                return
            except Exception:  # logged; the visibility timeout brings them back
                log.warning("could not restore a fetch whose reply was lost", exc_info=True)
                tags = []
            _UNANSWERED.popleft()
            if tags:
                log.warning("restored %d messages of a fetch whose reply was lost", len(tags))

    def _fetching_for(self) -> str | None:
        """The queue of the message ``BRPOP`` brought, when it is the one being appended
        (once: a message another append brings, say ``basic_get`` in a callback, takes none
        along)."""
        if not self._reading_brpop:
            return None
        self._reading_brpop = False
        queue: str | None = self.connection._delivering
        return queue

    def _hold(self, queue: str, lists: list[str], fetched: list[Any]) -> None:
        """Keep the messages the fetch script returned (``[list index, tag, message, ...]``)
        for delivery once the one ``BRPOP`` brought is delivered."""
        indexed = self.qos._indexed
        for i in range(0, len(fetched), 3):
            tag = bytes_to_str(fetched[i + 1])  # type: ignore[no-untyped-call]
            indexed.add(tag)
            self._fetched.append((queue, lists[fetched[i] - 1], tag, fetched[i + 2]))

    def _unfetch(self) -> None:
        """Push the fetched messages not delivered back where they were, in their order (the
        first one next). If Redis cannot be reached they stay in the unacked index, and
        ``restore_visible`` brings them back after the visibility timeout."""
        fetched, self._fetched = list(self._fetched), deque()
        if not fetched:
            return
        indexed = self.qos._indexed
        keys = [self.unacked_index_key, self.unacked_key]
        args: list[Any] = []
        for _, key, tag, item in fetched:
            indexed.discard(tag)
            keys.append(key)
            args += (tag, item)
        try:
            with self.conn_or_acquire() as client:
                _run_script(client, _UNFETCH_SCRIPT, tuple(keys), *args)
        except Exception:
            log.warning(
                "could not push back %d fetched messages; they come back after the visibility"
                " timeout",
                len(fetched),
                exc_info=True,
            )

    def close(self) -> None:
        """kombu's, after pushing back fetched messages not delivered (a callback closed the
        channel while they were being delivered)."""
        self._unfetch()
        super().close()  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :data:`TRANSIENT_WRITE_ERRORS` as connection errors, which
    notes the queue of the message it is delivering (for :meth:`QoS.append`)."""

    Channel = Channel
    connection_errors = (*kombu_redis.Transport.connection_errors, *TRANSIENT_WRITE_ERRORS)
    _delivering: str | None = None

    def _deliver(self, message: Any, queue: str) -> None:
        """kombu's, noting ``queue`` while its consumer's callback runs."""
        if queue not in self._callbacks:  # kombu rejects it: nothing to fetch along
            super()._deliver(message, queue)  # type: ignore[no-untyped-call]
            return
        outer, self._delivering = self._delivering, queue
        try:
            super()._deliver(message, queue)  # type: ignore[no-untyped-call]
        finally:
            self._delivering = outer


TRANSPORT_PATH = "workers.broker:Transport"

REDIS_SCHEMES = ("redis", "rediss")
"""The broker URL schemes this transport serves in a process that called
:func:`serve_redis_urls` (``redis+socket://`` too: kombu reads its transport as ``redis``)."""


def serve_redis_urls() -> None:
    """Make :data:`REDIS_SCHEMES` name :class:`Transport` in kombu's alias table
    (``kombu.transport.TRANSPORT_ALIASES``), in this process.

    A connection whose URL says ``redis://`` then uses this transport and still reports
    ``redis://...`` as its URL. kombu remembers the class of each name it has resolved: a
    process that opened a ``redis://`` connection before this call keeps kombu's transport
    for it, which is logged (the worker and Flower call this when they load the app, before any
    connection)."""
    for scheme in REDIS_SCHEMES:
        TRANSPORT_ALIASES[scheme] = TRANSPORT_PATH
        if get_transport_cls(scheme) is not Transport:
            log.warning(
                "broker.transport_alias_too_late: kombu resolved %r:// before orga.celery"
                " was imported, so connections to it use kombu's own Redis transport; import"
                " orga.celery before opening a broker connection",
                scheme,
            )
