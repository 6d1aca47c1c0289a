"""Reading the streams of several partitions (as a consumer group, or not), on a Redis or a Redis
Cluster.

On one Redis, one ``XREADGROUP`` (or ``XREAD``) names the streams of every partition and blocks
until one of them has entries. A Redis Cluster refuses a command whose keys are in several
slots (even on one node), and each partition is a slot of its own (its hash tag ``{p:NN}``):
there, each partition's stream is read by a command of its own, all of them concurrently, each
blocking at most :data:`CLUSTER_BLOCK_MS` so that the entries one read returns are not held
back by the others' blocking. The caller names the streams it serves (the partitions this
coordinator reads), so a coordinator serving a subset of the partitions reads only theirs.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

__all__ = ["CLUSTER_BLOCK_MS", "Rows", "is_cluster", "read_group", "read_streams"]

log = logging.getLogger("orga.coordinator.streams")

CLUSTER_BLOCK_MS = 50
"""On a cluster, how long each partition's read blocks at most: the latency an entry may wait
while the reads of the other partitions end (idle: one read per partition and loop this often)."""

CLUSTER_READ_TIMEOUT_S = 5.0
"""On a cluster, how long a partition's read may take beyond its block before it is abandoned
as failed (the client reconnects; entries it may have delivered stay pending under this
consumer and are claimed again). A read was seen to hang for good across a failover."""

Rows = list[tuple[str, list[tuple[str, dict[Any, Any]]]]]
"""Entries by stream: ``[(stream, [(entry id, fields), ...]), ...]``, streams without entries
left out."""


def is_cluster(client: object) -> bool:
    """Whether ``client`` is redis-py's asyncio ``RedisCluster`` (built by ``orga`` when
    ``ORGA_REDIS_CLUSTER`` is set)."""
    return isinstance(client, RedisCluster)


async def read_group(
    redis: Redis,
    group: str,
    consumer: str,
    streams: Iterable[str],
    *,
    start: str = ">",
    count: int | None = None,
    block_ms: int | None = None,
) -> Rows:
    """``XREADGROUP`` of ``group`` as ``consumer`` on ``streams`` from ``start`` (``>``: new
    entries; ``0``: the consumer's pending ones), with entries deleted while pending left out.
    One command on a Redis; one per stream, concurrently, on a Redis Cluster. There, a read
    that fails does not lose the others' entries: they are returned, and the error is raised
    when no read returned any (the next read meets it again)."""

    def read(names: list[str], block: int | None) -> Awaitable[Any]:
        return redis.xreadgroup(
            group, consumer, dict.fromkeys(names, start), count=count, block=block
        )

    return await _read_each(redis, list(streams), read, block_ms, group)


async def read_streams(
    redis: Redis,
    streams: Iterable[str],
    *,
    start: str = "0-0",
    count: int | None = None,
    block_ms: int | None = None,
) -> Rows:
    """``XREAD`` (no consumer group) on ``streams``, entries after ``start`` (``0-0``: every
    entry still in them), blocking up to ``block_ms`` for one when there are none; as
    :func:`read_group` on a Redis Cluster (one read per stream, concurrently)."""

    def read(names: list[str], block: int | None) -> Awaitable[Any]:
        return redis.xread(dict.fromkeys(names, start), count=count, block=block)

    return await _read_each(redis, list(streams), read, block_ms, "")


async def _read_each(
    redis: Redis,
    names: list[str],
    read: Callable[[list[str], int | None], Awaitable[Any]],
    block_ms: int | None,
    group: str,
) -> Rows:
    """``read`` of every stream in one command, or on a Redis Cluster one per stream."""
    if not names:
        if block_ms:
            await asyncio.sleep(block_ms / 1000)
        return []
    if not is_cluster(redis) or len(names) == 1:
        return _rows(await read(names, block_ms))
    block = None if block_ms is None else min(block_ms, CLUSTER_BLOCK_MS) or CLUSTER_BLOCK_MS
    limit_s = (block or 0) / 1000 + CLUSTER_READ_TIMEOUT_S
    replies = await asyncio.gather(
        *(asyncio.wait_for(read([name], block), limit_s) for name in names),
        return_exceptions=True,
    )
    rows: Rows = []
    errors: list[BaseException] = []
    for reply in replies:
        if isinstance(reply, asyncio.CancelledError):
            raise reply
        if isinstance(reply, BaseException):
            errors.append(reply)
        else:
            rows += _rows(reply)
    if errors:
        if not rows:
            raise errors[0]
        log.warning("streams.read_failed", extra={"group": group, "error": str(errors[0])[:300]})
    return rows


def _rows(response: Any) -> Rows:
    rows = cast(list[Any], response or [])
    batches = [(_text(name), [(_text(i), f) for i, f in got if f]) for name, got in rows]
    return [(stream, got) for stream, got in batches if got]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


CLAIM_DROPS_DELETED = (7, 0, 4)
"""The first Redis whose ``XAUTOCLAIM`` drops the delivery of an entry deleted while pending
(and names it in its reply's third element). Redis 6.2 answers a nil in its place, no id, and
keeps the delivery pending for ever; Redis 7.0.0 to 7.0.3 overrun a buffer (CVE-2022-31144) when
a claim meets more such entries than its ``COUNT``. Before it, an applied observation is
acknowledged as well as deleted (:attr:`coordinator.store.TaskStore.acknowledge_deleted`)."""


_RELEASE = re.compile(r"\s*(\d+)\.(\d+)\.(\d+)")


def parse_release(version: str) -> tuple[int, int, int] | None:
    """``"7.0.15"`` as ``(7, 0, 15)``; None for what does not start with three numbers."""
    match = _RELEASE.match(version)
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def claim_drops_deleted(version: str | None) -> bool:
    """Whether the Redis of ``version`` (``INFO server`` ``redis_version``; None: unread) drops
    the deliveries of entries deleted while pending in ``XAUTOCLAIM``: 7.0.4 and later. An
    unread or unparsable version counts as older (the observation is then acknowledged too:
    one command more per call, right on every Redis)."""
    release = parse_release(version) if version is not None else None
    return release is not None and release >= CLAIM_DROPS_DELETED


async def redis_version(redis: Redis) -> str | None:
    """The server's ``redis_version`` (``INFO server``); on a Redis Cluster the lowest over its
    primaries (a replica promoted later runs the same release in any sane upgrade). None when
    INFO is refused (renamed away) or names none."""
    try:
        if is_cluster(redis):
            cluster = await cast(RedisCluster, redis).initialize()
            versions = [
                (await redis.info("server", target_nodes=node)).get("redis_version")
                for node in cluster.get_primaries()
            ]
        else:
            versions = [(await redis.info("server")).get("redis_version")]
    except ResponseError as exc:
        log.warning("coordinator.redis_version_unread", extra={"error": str(exc)[:300]})
        return None
    known = [str(v) for v in versions if v is not None]
    if len(known) != len(versions) or not known:
        return None
    return min(known, key=lambda v: parse_release(v) or (0, 0, 0))
