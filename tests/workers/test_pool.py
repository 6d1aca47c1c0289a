"""The reasoning worker's ``LoopPool``: a task's coroutine runs on the event loop, and Celery's
tracer (with its blocking acknowledgement) in a thread, so a slow broker never stalls the loop;
a cancelled coroutine is a failure the tracer reports."""

from __future__ import annotations

import asyncio
import threading
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
    """While the tracer, having seen the coroutine's outcome, is blocked (a slow ack that ends
    only when the test lets it), the loop still runs another coroutine to its end."""
    seen: list[Future[None] | None] = []
    blocked, release = threading.Event(), threading.Event()

    async def body(payload: str) -> None:
        await asyncio.sleep(0)

    def tracer(*args: Any) -> None:
        seen.append(ran_on_loop(args[3][0][0]))
        blocked.set()
        release.wait(30)

    ASYNC_BODIES[NAME] = body
    running = pool.on_apply(tracer, args=_args("p1"))
    assert blocked.wait(5), "the tracer never ran"
    assert pool._loop is not None
    try:  # a loop stalled by the tracer would time out here
        assert asyncio.run_coroutine_threadsafe(_answer(), pool._loop).result(5) == "answered"
    finally:
        release.set()
    running.wait(5)
    assert len(seen) == 1 and seen[0] is not None and seen[0].result() is None


async def _answer() -> str:
    await asyncio.sleep(0)
    return "answered"


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


def test_the_reported_runtime_is_the_calls_not_the_tracers(pool: LoopPool) -> None:
    """The runtime handed to the request's callback (Celery's ``task-succeeded`` event, Flower's
    Runtime) is the coroutine's time plus the tracer's, not the tracer's alone."""
    reported: list[tuple[int, Any, float]] = []

    async def body(payload: str) -> None:
        await asyncio.sleep(0.3)  # the call's own duration: what the runtime must include

    def tracer(*args: Any) -> tuple[int, Any, float]:
        return (0, "ok", 0.0001)  # what Celery's tracer measures: itself only

    ASYNC_BODIES[NAME] = body
    pool.on_apply(tracer, args=_args("p3"), callback=reported.append).wait(5)
    assert len(reported) == 1
    failed, retval, runtime = reported[0]
    assert (failed, retval) == (0, "ok")
    assert 0.3 <= runtime < 5, runtime
