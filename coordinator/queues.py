"""How deep the Celery queues are and how fast workers drain them, sampled by a coordinator.

Workers count every dispatch they start on ``orga:started:{queue}`` (:mod:`workers.liveness`);
the coordinator samples those counters with the queues' lengths at most once a second, when a
task's deadline makes it look, and keeps an exponentially weighted drain rate per queue. The
deadline of a dispatch that has not started grows with the queue it waits in
(:mod:`coordinator.liveness`), and a queue that holds messages but drains nothing has no
consumer: that is logged, once a minute per queue.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from shared import keys

__all__ = ["QueueGauge"]

log = logging.getLogger("orga.coordinator.queues")

QUEUES = (keys.reasoning_queue, keys.tools_queue)
SAMPLE_EVERY_S = 1.0
SMOOTHING = 0.3
"""Weight of the newest sample in the drain rate."""
WARN_EVERY_S = 60.0


@dataclass
class QueueGauge:
    """Depth and drain rate of each queue, as last sampled."""

    _depth: dict[str, int] = field(default_factory=dict)
    _rate: dict[str, float] = field(default_factory=dict)
    _started: dict[str, int] = field(default_factory=dict)
    _sampled_at: float = 0.0
    _warned_at: dict[str, float] = field(default_factory=dict)
    observations_backlog: int = 0
    """Observations the coordinators have not yet read, or read and not yet applied."""

    def depth(self, queue: str) -> int:
        """Messages waiting in ``queue`` at the last sample."""
        return self._depth.get(queue, 0)

    def drain_per_s(self, queue: str) -> float:
        """Dispatches of ``queue`` started per second, lately."""
        return self._rate.get(queue, 0.0)

    async def sample(self, redis: Redis, now: float | None = None) -> None:
        """Read the queues' lengths and start counters (at most once a second)."""
        now = time.monotonic() if now is None else now
        if now - self._sampled_at < SAMPLE_EVERY_S:
            return
        pipe = redis.pipeline(transaction=False)
        for queue in QUEUES:
            pipe.llen(queue)
            pipe.get(keys.queue_started_key(queue))
        pipe.xinfo_stream(keys.observations_stream)
        pipe.xinfo_groups(keys.observations_stream)
        replies = await pipe.execute(raise_on_error=False)
        elapsed = now - self._sampled_at if self._sampled_at else 0.0
        self._sampled_at = now
        for index, queue in enumerate(QUEUES):
            depth, started = int(replies[2 * index]), int(replies[2 * index + 1] or 0)
            self._update(queue, depth, started, elapsed, now)
        self.observations_backlog = _backlog(*replies[2 * len(QUEUES) :])

    def _update(self, queue: str, depth: int, started: int, elapsed: float, now: float) -> None:
        previous = self._started.get(queue)
        self._started[queue] = started
        self._depth[queue] = depth
        if previous is not None and elapsed > 0:
            rate = max(started - previous, 0) / elapsed
            old = self._rate.get(queue)
            self._rate[queue] = rate if old is None else SMOOTHING * rate + (1 - SMOOTHING) * old
        idle = depth > 0 and self._rate.get(queue, 0.0) == 0.0 and previous is not None
        if idle and now - self._warned_at.get(queue, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned_at[queue] = now
            role = "reasoning" if queue == keys.reasoning_queue else "tools"
            log.warning(
                "queue.no_consumer",
                extra={"queue": queue, "depth": depth, "fix": f"orga worker --role {role}"},
            )


def _backlog(stream: Any, groups: Any) -> int:
    """Entries of the coordinators' group still to apply: pending ones, plus the unread ones
    (``lag`` on Redis 7; on 6.2, at least one when the group has not reached the stream's end).
    A stream or group that does not exist yet holds nothing."""
    if isinstance(stream, Exception) or isinstance(groups, Exception):
        return 0
    for group in groups:
        if _text(group.get("name")) != keys.coordinator_group:
            continue
        pending = int(group.get("pending") or 0)
        lag = group.get("lag")
        if lag is not None:
            return pending + int(lag)
        unread = _text(group.get("last-delivered-id")) != _text(stream.get("last-generated-id"))
        return pending + int(unread)
    return 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
