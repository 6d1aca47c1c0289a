"""The workers' broker transport: kombu's Redis transport, without its ack emulation, with
Redis refusing writes treated like a lost connection.

**No ack emulation.** kombu's Redis transport emulates AMQP acknowledgements by default: each
message fetched is written to an "unacked" hash and index (``ZADD``/``HSET`` on fetch,
``ZREM``/``HDEL`` on ack), and one left there longer than the visibility timeout is put back
in its queue. The runtime does not need that: the coordinator judges every unanswered dispatch
itself (:mod:`coordinator.liveness`: running, answered, queued, not started, lost) from the
workers' heartbeats and its queue's depth and drain rate, and re-sends a lost one under a new
fence that drops a duplicate answer, well before a visibility timeout would
(``ORGA_OBSERVATION_DEADLINE_S`` < ``ORGA_VISIBILITY_TIMEOUT_S``, docs/deploy.md §4.1). So the
workers run with kombu's documented transport option ``ack_emulation: False``
(:func:`shared.settings.celery_config`): a fetch is one ``BRPOP`` and an ack sends nothing. What
kombu still does without it, in the worker's memory (its virtual ``QoS``): a message rejected
with requeue (Celery's ``task_reject_on_worker_lost``, a pool process that died) is pushed back
to its queue at once, and a channel that closes (a warm shutdown, a consumer restart) pushes
back the messages it fetched and did not acknowledge. What only the coordinator brings back: a
message whose worker process was killed (SIGKILL, a lost machine) before it acknowledged it, and
one whose ``BRPOP`` reply was lost with the connection (docs/reliability.md, "Without kombu's
ack emulation").

**Redis refusing writes.** Out of memory (``maxmemory`` reached), Redis refuses the writes a
worker's broker may still make (a requeue's ``LPUSH``; a fetch, ``BRPOP``, is never refused).
kombu counts that ``ResponseError`` as a channel error, and Celery then stops the worker:
``Unrecoverable error: OutOfMemoryError`` (issue 12, item 3). As a connection error
(:class:`Transport`'s ``connection_errors``) it is what it is, a transient state of the server:
the consumer reconnects with Celery's back-off until Redis accepts writes again.

It is chosen by the broker URL's own scheme (:func:`serve_redis_urls`): ``redis://`` and
``rediss://`` name this transport in kombu's alias table, so the connection's URL keeps the
scheme Flower and other tools read (with ``broker_transport`` set to this class's import path,
``as_uri()`` gave ``workers.broker:Transport://...`` and Flower's Broker page refused it).
"""

from __future__ import annotations

import logging

from kombu.transport import TRANSPORT_ALIASES, get_transport_cls
from kombu.transport import redis as kombu_redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError

__all__ = [
    "REDIS_SCHEMES",
    "TRANSIENT_WRITE_ERRORS",
    "Transport",
    "serve_redis_urls",
]

log = logging.getLogger("orga.worker.broker")

TRANSIENT_WRITE_ERRORS = (OutOfMemoryError, ReadOnlyError)
"""Redis refusing a write for a while: out of memory, or a replica during a failover."""


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :data:`TRANSIENT_WRITE_ERRORS` as connection errors (its
    public ``connection_errors``, which Celery reads to reconnect rather than stop)."""

    connection_errors = (*kombu_redis.Transport.connection_errors, *TRANSIENT_WRITE_ERRORS)


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
