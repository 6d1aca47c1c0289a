"""The reasoning worker's ``LoopPool``: a task's coroutine runs on the event loop, and Celery's
tracer (with its blocking acknowledgement) in a thread, so a slow broker never stalls the loop;
a cancelled coroutine is a failure the tracer reports."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from workers.pool import ASYNC_BODIES, LoopPool, ran_on_loop

NAME = "tests.pool.body"


@pytest.fixture
def pool() -> Iterator[LoopPool]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    pool = LoopPool(limit=10)
    pool._loop = loop
    try:
        yield pool
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        ASYNC_BODIES.pop(NAME, None)


def _args(payload: str) -> tuple[Any, ...]:
    """The tracer's arguments: task name, id, request, body, content type, encoding."""
    return (NAME, "id-1", {}, ((payload,), {}, {}), None, None)


def test_a_blocking_acknowledgement_does_not_stall_the_loop(pool: LoopPool) -> None:
    """The tracer sees the coroutine's outcome and blocks for 0.6 s (a slow ack): meanwhile
    the loop still answers within a few milliseconds."""
    seen: list[Future[None] | None] = []

    async def body(payload: str) -> None:
        await asyncio.sleep(0)

    def tracer(*args: Any) -> None:
        seen.append(ran_on_loop(args[3][0][0]))
        time.sleep(0.6)

    ASYNC_BODIES[NAME] = body
    running = pool.on_apply(tracer, args=_args("p1"))
    time.sleep(0.1)  # the tracer is now blocked in its thread
    assert pool._loop is not None
    started = time.monotonic()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), pool._loop).result(5)
    assert time.monotonic() - started < 0.3
    running.wait(5)
    assert len(seen) == 1 and seen[0] is not None and seen[0].result() is None


def test_a_cancelled_coroutine_is_a_failure_the_tracer_reports(pool: LoopPool) -> None:
    """The task body raises what the coroutine did: a cancellation as a RuntimeError, which
    Celery's tracer handles (FAILURE, acknowledgement) like any other failure."""
    outcomes: list[Future[None] | None] = []

    async def body(payload: str) -> None:
        raise asyncio.CancelledError

    ASYNC_BODIES[NAME] = body
    pool.on_apply(lambda *args: outcomes.append(ran_on_loop("p2")), args=_args("p2")).wait(5)
    assert len(outcomes) == 1 and outcomes[0] is not None
    with pytest.raises(RuntimeError, match="cancelled"):
        outcomes[0].result()
