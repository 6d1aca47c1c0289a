"""A model call held in a retry wait: seen by operators, and stopped when its task ends.

The HTTP providers wait between tries (a 429's ``Retry-After``, a 5xx's back-off, another call's
hold on the same key) through :func:`wait_out`. Inside :func:`watching`, the wait goes to a
:class:`WaitWatch` instead of a bare sleep: the worker's (:class:`RedisWaitWatch`) publishes the
wait (``orga:provider_wait:{liveness_id}``, read by ``orga status``: "waiting on the provider")
and, every ``check_every_s``, reads the task's status; once the task has ended (``orga cancel``,
a review's abort) it raises :class:`CallAbandonedError` and the call stops there, instead of
sleeping out its wait and calling the model for a task nobody awaits.

Outside :func:`watching` (the in-process driver, the providers' own tests) a wait is a sleep.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys
from shared.errors import OrgaError
from shared.inference import ProviderWait
from shared.protocol import Fence
from workers.providers.retry import SleepFn

__all__ = [
    "ENDED_STATUSES",
    "CallAbandonedError",
    "RedisWaitWatch",
    "WaitWatch",
    "wait_out",
    "watching",
]

log = logging.getLogger("orga.worker.waiting")

ENDED_STATUSES = frozenset({"completed", "failed", "aborted"})
"""A task in one of these statuses awaits no model call."""

_watch: contextvars.ContextVar[WaitWatch | None] = contextvars.ContextVar(
    "orga_wait_watch", default=None
)


class CallAbandonedError(OrgaError):
    """The task a model call waited for has ended: the call stops (nothing is reported)."""


class WaitWatch(Protocol):
    """Holds a model call for ``delay_s`` (its retry wait), where operators can see it."""

    async def hold(self, wait: ProviderWait, delay_s: float, sleep: SleepFn) -> None:
        """Wait ``delay_s`` with ``sleep``; raise :class:`CallAbandonedError` when the task
        ends meanwhile."""
        ...


@contextmanager
def watching(watch: WaitWatch) -> Iterator[None]:
    """The retry waits of the model calls made inside go through ``watch``."""
    token = _watch.set(watch)
    try:
        yield
    finally:
        _watch.reset(token)


async def wait_out(wait: ProviderWait, delay_s: float, sleep: SleepFn) -> None:
    """Wait before the next try: through the current :func:`watching` watch, else a sleep."""
    watch = _watch.get()
    if watch is None:
        await sleep(delay_s)
        return
    await watch.hold(wait, delay_s, sleep)


class RedisWaitWatch:
    """The watch of one dispatch in a worker: the wait published under the dispatch's
    liveness id, the task's status read every ``check_every_s`` while it lasts.

    Redis failing to answer never fails the call: the wait goes on unpublished (logged).
    """

    def __init__(
        self,
        redis: Redis,
        fence: Fence,
        check_every_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        *,
        partitions: int = 1,
    ) -> None:
        self._redis = redis
        self._partitions = partitions
        self._fence = fence
        self._check_every_s = check_every_s
        self._clock = clock

    async def hold(self, wait: ProviderWait, delay_s: float, sleep: SleepFn) -> None:
        """Publish the wait, then sleep it out in slices, looking at the task in between."""
        ends_at = self._clock() + delay_s
        await self._publish(wait, ends_at, delay_s)
        left_s = delay_s
        while left_s > 0:
            await sleep(min(left_s, self._check_every_s))
            await self._check_task(wait)
            left_s = ends_at - self._clock()

    async def _publish(self, wait: ProviderWait, ends_at: float, delay_s: float) -> None:
        state = {
            "provider": wait.provider,
            "status": wait.status,
            "shared": wait.shared,
            "retry_at": round(ends_at, 3),
        }
        try:
            await self._redis.set(
                keys.provider_wait_key(self._fence.liveness_id()),
                json.dumps(state),
                px=max(math.ceil(delay_s * 1000), 1),
            )
        except RedisError as exc:
            log.warning("provider_wait.unpublished", extra={"error": str(exc)[:300]})

    async def _check_task(self, wait: ProviderWait) -> None:
        task_id = self._fence.task_id
        try:
            key = keys.task_key(task_id, keys.partition_of(task_id, self._partitions))
            raw = await self._redis.hget(key, "status")
        except RedisError as exc:
            log.warning("provider_wait.unchecked", extra={"error": str(exc)[:300]})
            return
        status = raw.decode() if isinstance(raw, bytes) else raw
        if status in ENDED_STATUSES:
            raise CallAbandonedError(
                f"task {task_id} ended ({status}) while its model call waited on "
                f"{wait.provider}: the call stops here"
            )
