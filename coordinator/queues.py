"""How deep the Celery queues are and how fast workers drain them, sampled by a coordinator.

Workers count every dispatch they start on ``orga:started:{queue}`` (:mod:`workers.liveness`),
adding a process's starts with its next heartbeat beat; the coordinator samples the queues'
lengths at most once a second, when a task's deadline makes it look, and those counters at most
once per ``rate_window_s`` (two heartbeat intervals: a window shorter than a beat would see a
beat's starts in one sample and none in the next), and keeps an exponentially weighted drain
rate per queue. The
deadline of a dispatch that has not started grows with the queue it waits in
(:mod:`coordinator.liveness`), and a queue that holds messages but drains nothing has no
consumer: that is logged, once a minute per queue.

The queues' lengths are the lists of the Redis broker on the state Redis; on a broker of its own
(RabbitMQ: ``ORGA_BROKER_URL=amqp://``) they are asked of the broker through the transport
(:class:`~coordinator.transport.QueueDepths`), in a thread; a broker that does not answer (an
error, or no answer within ``BROKER_TIMEOUT_S``: a hung socket does not stall the tick) leaves
the last depths read (logged once a minute).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from coordinator.liveness import UNKNOWN_PROGRESS, StreamProgress
from coordinator.transport import QueueDepths
from shared import keys

__all__ = ["QueueGauge"]

log = logging.getLogger("orga.coordinator.queues")

QUEUES = (keys.reasoning_queue, keys.tools_queue)
SAMPLE_EVERY_S = 1.0
SMOOTHING = 0.3
"""Weight of the newest sample in the drain rate."""
WARN_EVERY_S = 60.0
BROKER_TIMEOUT_S = 3.0
"""How long a tick waits for the broker's depths (a hung broker socket must not stall it)."""


@dataclass
class QueueGauge:
    """Depth and drain rate of each queue, as last sampled."""

    _depth: dict[str, int] = field(default_factory=dict)
    _rate: dict[str, float] = field(default_factory=dict)
    _started: dict[str, int] = field(default_factory=dict)
    _sampled_at: float = 0.0
    _counted_at: float = 0.0
    rate_window_s: float = SAMPLE_EVERY_S
    """The shortest time over which the start counters are read again (the service: two
    heartbeat intervals, as a worker adds its starts once per beat)."""
    _warned_at: dict[str, float] = field(default_factory=dict)
    partitions: int = 1
    """The deployment's partition count: the observations stream of each is sampled."""
    _progress: list[StreamProgress] = field(default_factory=list)
    broker: QueueDepths | None = None
    """Where the queues' depths are read when the broker is not the state Redis (None, or a
    broker answering None: the lists on the state Redis)."""
    _broker_warned_at: float = -WARN_EVERY_S
    broker_timeout_s: float = BROKER_TIMEOUT_S
    """How long a sample waits for the broker; past it, the last depths read stay."""
    _broker_call: asyncio.Future[Any] | None = None
    """The broker's answer still awaited (one at a time: a hung call is not asked again)."""

    @property
    def observations(self) -> StreamProgress:
        """How far the coordinators have read and applied partition 0's observations."""
        return self.progress(0)

    def progress(self, partition: int) -> StreamProgress:
        """How far the coordinators have read and applied one partition's observations."""
        if partition < len(self._progress):
            return self._progress[partition]
        return UNKNOWN_PROGRESS

    def depth(self, queue: str) -> int:
        """Messages waiting in ``queue`` at the last sample."""
        return self._depth.get(queue, 0)

    def drain_per_s(self, queue: str) -> float:
        """Dispatches of ``queue`` started per second, lately."""
        return self._rate.get(queue, 0.0)

    async def sample(self, redis: Redis, now: float | None = None) -> None:
        """Read the queues' lengths (at most once a second) and start counters (at most once
        per :attr:`rate_window_s`); the depths come from the broker instead when it is not the
        state Redis (:attr:`broker`)."""
        now = time.monotonic() if now is None else now
        if now - self._sampled_at < SAMPLE_EVERY_S:
            return
        counting = not self._counted_at or now - self._counted_at >= self.rate_window_s
        pipe = redis.pipeline(transaction=False)
        _lengths(pipe)
        for queue in QUEUES if counting else ():
            pipe.get(keys.queue_started_key(queue))
        for p in range(self.partitions):  # each task is judged on its partition's stream
            pipe.xinfo_groups(keys.observations_stream(p))
            pipe.xpending(keys.observations_stream(p), keys.coordinator_group)
        replies = list(await pipe.execute(raise_on_error=False))
        ours = len(QUEUES) * (2 if counting else 1)
        failed = [r for r in replies[:ours] if isinstance(r, Exception)]
        if failed:  # only the stream's replies may fail (no stream or group yet)
            raise failed[0]
        on_broker = await self._broker_depths(now)
        elapsed = now - self._counted_at if self._counted_at else 0.0
        self._sampled_at = now
        if counting:
            self._counted_at = now
        for index, queue in enumerate(QUEUES):
            depth = int(replies[index])
            if on_broker is not None:
                depth = on_broker.get(queue, self._depth.get(queue, 0))
            if counting:
                self._count(queue, int(replies[len(QUEUES) + index] or 0), elapsed)
            self._update(queue, depth, now)
        streams = replies[ours:]
        self._progress = [_progress(*streams[2 * p : 2 * p + 2]) for p in range(self.partitions)]

    async def _broker_depths(self, now: float) -> dict[str, int] | None:
        """The depths the broker tells (None: read the lists); the last ones read when it
        does not answer."""
        if self.broker is None:
            return None
        call = self._broker_call
        if call is None:  # the thread of a call that timed out is awaited again, not doubled
            call = asyncio.ensure_future(asyncio.to_thread(self.broker.queue_depths, QUEUES))
            self._broker_call = call
        try:
            depths = await asyncio.wait_for(asyncio.shield(call), self.broker_timeout_s)
        except Exception as exc:
            if call.done():
                self._broker_call = None
            error = (f"no answer within {self.broker_timeout_s:g}s"
                     if isinstance(exc, TimeoutError) and not call.done()
                     else f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
            if now - self._broker_warned_at >= WARN_EVERY_S:
                self._broker_warned_at = now
                log.warning(
                    "queue.depth_unavailable", extra={"error": error, "kept": dict(self._depth)}
                )
            return dict(self._depth)
        self._broker_call = None
        return None if depths is None else dict(depths)

    def _count(self, queue: str, started: int, elapsed: float) -> None:
        """A reading of ``queue``'s start counter, ``elapsed`` seconds after the last one."""
        previous = self._started.get(queue)
        self._started[queue] = started
        if previous is not None and elapsed > 0:
            rate = max(started - previous, 0) / elapsed
            old = self._rate.get(queue)
            self._rate[queue] = rate if old is None else SMOOTHING * rate + (1 - SMOOTHING) * old

    def _update(self, queue: str, depth: int, now: float) -> None:
        self._depth[queue] = depth
        idle = depth > 0 and self._rate.get(queue, 0.0) == 0.0 and queue in self._rate
        if idle and now - self._warned_at.get(queue, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned_at[queue] = now
            role = "reasoning" if queue == keys.reasoning_queue else "tools"
            log.warning(
                "queue.no_consumer",
                extra={"queue": queue, "depth": depth, "fix": f"orga worker --role {role}"},
            )


def _lengths(pipe: Any) -> None:
    """Add the queues' ``LLEN`` to ``pipe``."""
    for queue in QUEUES:
        pipe.llen(queue)


def _progress(groups: Any, pending: Any) -> StreamProgress:
    """The coordinators' group's progress from XINFO GROUPS and the XPENDING summary (a stream
    or group that does not exist yet: unknown)."""
    if isinstance(groups, Exception):
        return UNKNOWN_PROGRESS
    for group in groups:
        if _text(group.get("name")) != keys.coordinator_group:
            continue
        delivered = _millis(group.get("last-delivered-id"))
        oldest = None
        if not isinstance(pending, Exception) and pending and pending.get("pending"):
            oldest = _millis(pending.get("min"))
        return StreamProgress(delivered, oldest)
    return UNKNOWN_PROGRESS


def _millis(entry_id: Any) -> int | None:
    if entry_id is None:
        return None
    head = _text(entry_id).split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
