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
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

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
