"""The one place the state's Redis clients are built: a standalone Redis, or a Redis Cluster.

``ORGA_REDIS_URL`` names the Redis that holds the state. With ``ORGA_REDIS_CLUSTER=true`` it
names any node of a Redis Cluster, and every client of the state is redis-py's
``RedisCluster`` (``redis.asyncio.cluster`` for the coordinator and the workers, ``redis.cluster``
for the CLI, the inbox and the metrics), which discovers the other nodes, routes each command
to the node that holds its slot and follows ``MOVED``/``ASK`` during a reshard or a failover.
The processes are assembled here (``orga/``), so this module builds the clients and hands them
to the coordinator, the workers (:mod:`orga.celery` puts :meth:`RedisClients.asyncio` and
:meth:`RedisClients.sync` in the Celery app's configuration) and the CLI.

A ``RedisCluster`` offers the commands, scripts and pipelines a ``Redis`` does, with one
difference that the code respects everywhere (docs/deploy.md, "Redis Cluster"): every script and
every ``MULTI`` names its keys in ``KEYS`` and all of them are in one slot (one partition's hash
tag ``{p:NN}``, or one single key), and a stream read names streams of one slot. The clients are
typed as ``Redis`` for the code that uses them: redis-py has no common base class of the two,
and the commands the code calls are the same methods (the ``*Commands`` mixins both inherit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import hiredis
import redis
import redis.cluster
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.typing import EncodableT

from shared.errors import ConfigError
from shared.settings import OrgaSettings, celery_broker_url, node_urls

__all__ = ["COMMAND_TIMEOUT_S", "CONNECT_TIMEOUT_S", "PackedConnection", "RedisClients"]

CONNECT_TIMEOUT_S = 5.0
"""On a cluster, how long connecting to a node may take (unless the caller says)."""

COMMAND_TIMEOUT_S = 10.0
"""On a cluster, how long a command's reply may take (unless the caller says): a command sent
to a master as it failed was seen to wait for its reply for good (redis-py 8.2's asyncio
``RedisCluster``); the timeout makes it fail, the client re-reads the topology and the caller's
retry reaches the promoted replica. Every stream read blocks at most 50 ms on a cluster
(:mod:`coordinator.streams`), far below it."""


_PLAIN_ARGUMENTS = frozenset({bytes, str, int, float})
"""The argument types hiredis packs exactly as redis-py's encoder does (``bool``, a subclass of
``int`` that redis-py refuses, is not among them: a type is compared, not tested)."""

_INT_BITS = 64
"""An ``int`` of more bits goes to redis-py's packer: hiredis 3.x writes an ``int`` with
``repr`` and does not check that it succeeded, and ``repr`` of an ``int`` beyond 4,300 digits
fails (Python's limit on ``int``-to-text conversion): the process would crash where redis-py
raises ``ValueError``."""


class _HiredisPacking:
    """``pack_command`` in one call to ``hiredis.pack_command`` when every argument is of a
    plain type: redis-py 8's own hiredis packer encodes the arguments one by one in Python
    first (two generator steps and its ``Encoder.encode`` per argument: about 100 of the
    coordinator's 710 Python frames per model call; docs/performance.md). Anything else goes
    to redis-py's own ``pack_command``, unchanged: a ``memoryview``; a command name redis-py
    would split (``CLIENT SETINFO``: any whitespace) or that is empty; a ``bool`` to refuse; an
    ``int`` beyond 64 bits (:data:`_INT_BITS`); an encoding other than strict UTF-8."""

    encoder: Any

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        first = args[0] if args else None
        encoder = self.encoder
        if (
            type(first) is str
            and first.isprintable()  # no tab, newline... (what bytes.split() splits on)
            and " " not in first
            and first
            and encoder.encoding == "utf-8"
            and encoder.encoding_errors == "strict"
        ):
            types = set(map(type, args))
            if types <= _PLAIN_ARGUMENTS and (int not in types or _small_ints(args)):
                # hiredis's stub types its argument as a tuple of one item; it takes any length
                return [hiredis.pack_command(args)]  # type: ignore[arg-type]
        return super().pack_command(*args)  # type: ignore[misc, no-any-return]


def _small_ints(args: tuple[EncodableT, ...]) -> bool:
    """Whether every ``int`` of ``args`` fits in :data:`_INT_BITS` bits (a loop, not ``all()``
    over a generator: no Python frame per argument)."""
    for arg in args:  # noqa: SIM110
        if type(arg) is int and arg.bit_length() > _INT_BITS:
            return False
    return True


class PackedConnection(_HiredisPacking, Connection):
    """redis-py's asyncio TCP connection, its commands packed by :class:`_HiredisPacking`."""


class _PackedSSLConnection(_HiredisPacking, SSLConnection):
    """The same over TLS (``rediss://``)."""


class _PackedUnixConnection(_HiredisPacking, UnixDomainSocketConnection):
    """The same on a Unix socket (``unix://``)."""


def packed_connection_class(url: str) -> type[AbstractConnection]:
    """The packed connection class for ``url``'s scheme, as redis-py would pick its own
    (``connection_class`` given to ``from_url`` overrides the scheme's)."""
    scheme = urlsplit(url).scheme
    if scheme == "rediss":
        return _PackedSSLConnection
    if scheme == "unix":
        return _PackedUnixConnection
    return PackedConnection


@dataclass(frozen=True, slots=True)
class RedisClients:
    """Builds the state's clients for one URL: a standalone Redis, or (``cluster``) a Redis
    Cluster reached through any of its nodes."""

    url: str
    cluster: bool = False

    @classmethod
    def from_settings(cls, settings: OrgaSettings, url: str | None = None) -> RedisClients:
        """The clients of ``ORGA_REDIS_URL`` (or ``url``) as ``ORGA_REDIS_CLUSTER`` says. A
        cluster without ``ORGA_BROKER_URL`` is refused (ConfigError naming the fix)."""
        url = url or settings.redis_url
        if url is None:
            raise ConfigError(
                "ORGA_REDIS_URL is not set: name the Redis that holds the state "
                "(e.g. ORGA_REDIS_URL=redis://127.0.0.1:6379/0)"
            )
        if settings.redis_cluster:
            celery_broker_url(settings)  # Celery cannot use the cluster: ORGA_BROKER_URL
        return cls(url, settings.redis_cluster)

    def asyncio(self, **options: Any) -> Redis:
        """An asyncio client (``decode_responses``, timeouts, pool size as ``options`` say)."""
        if self.cluster:
            # RedisCluster's pool is per node: max_connections bounds each node's. A node that
            # is down without refusing (its host gone) must not hold a command for minutes.
            options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
            options.setdefault("socket_timeout", COMMAND_TIMEOUT_S)
            first, others = self._nodes()
            if others:
                options["startup_nodes"] = [AsyncClusterNode(h, p) for h, p in others]
            return cast("Redis", RedisCluster.from_url(first, **options))
        options.setdefault("connection_class", packed_connection_class(self.url))
        return Redis.from_url(self.url, **options)

    def sync(self, **options: Any) -> redis.Redis:
        """A blocking client, for the CLI, the inbox, the metrics and the workers' checks."""
        if self.cluster:
            options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
            options.setdefault("socket_timeout", COMMAND_TIMEOUT_S)
            first, others = self._nodes()
            if others:
                options["startup_nodes"] = [
                    redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call]
                    for h, p in others
                ]
            return cast("redis.Redis", redis.cluster.RedisCluster.from_url(first, **options))
        return redis.Redis.from_url(self.url, **options)

    def _nodes(self) -> tuple[str, list[tuple[str, int]]]:
        """A cluster's URL may name several nodes, comma-separated (``redis://a:7000/0,
        redis://b:7000/0``): the first gives the credentials and options, each is a node to
        start from, so that a process starting while one node is down finds the others. A
        comma inside a password is not a separator (:func:`shared.settings.node_urls`)."""
        first, *others = node_urls(self.url)
        nodes = []
        for other in others:
            parsed = urlsplit(other if "://" in other else f"redis://{other}")
            nodes.append((parsed.hostname or "127.0.0.1", parsed.port or 6379))
        return first, nodes
