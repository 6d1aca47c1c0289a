"""The in-process start counts: a start counted by a process that closes cleanly reaches
``orga:started:{queue}`` (a stranger's review found a beat cancelled mid-send lost them)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from shared import keys
from shared.protocol import Fence
from workers.liveness import Liveness

FENCE = Fence(task_id="t1", step_id="s", iteration=2, attempt=3, nonce="abc")


class _Pipe:
    def __init__(self, redis: _Redis) -> None:
        self.redis = redis
        self.incr: Counter[str] = Counter()
        self.size = 0

    def zadd(self, *_args: Any, **_kwargs: Any) -> _Pipe:
        self.size += 1
        return self

    def zmscore(self, *_args: Any, **_kwargs: Any) -> _Pipe:
        self.size += 1
        return self

    def incrby(self, key: str, amount: int) -> _Pipe:
        self.incr[key] += amount
        self.size += 1
        return self

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.incr and not self.redis.stalled:
            # The beat's pipeline waits for a connection (a slow or reconnecting Redis):
            # nothing was sent when the process is asked to stop.
            self.redis.stalled = True
            self.redis.waiting.set()
            await asyncio.Event().wait()
        self.redis.counters.update(self.incr)
        return [1] * self.size


class _Redis:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.stalled = False
        self.waiting = asyncio.Event()

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self)


def test_close_during_a_beat_still_adds_the_starts_that_beat_took() -> None:
    """Liveness.close says it adds the starts no beat added yet. A beat takes the counted
    starts out of ``_starts`` before its pipeline is sent; close cancels the beat while that
    pipeline waits: the beat gives them back on its CancelledError, and close adds them."""

    async def run() -> int:
        redis = _Redis()
        liveness = Liveness(redis, interval_s=0.01)  # type: ignore[arg-type]
        await liveness.started([FENCE], keys.reasoning_queue)
        await asyncio.wait_for(redis.waiting.wait(), 5)  # the beat's pipeline is out
        await liveness.close()
        return redis.counters[keys.queue_started_key(keys.reasoning_queue)]

    assert asyncio.run(run()) == 1
