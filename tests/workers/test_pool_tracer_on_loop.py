"""Review of branch ``hop``: what Celery's tracer of a task that *succeeded* still does that is a
broker or backend call, which ``acks_send_nothing`` does not see, and which then runs on the
reasoning worker's event loop (stalling every call in flight and its heartbeats)."""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task
from celery.app.trace import trace_task_ret

from workers.pool import ASYNC_BODIES, LoopPool, acks_send_nothing, ran_on_loop

NAME = "tests.pool_review.body"
NEXT = "tests.pool_review.next"


@pytest.fixture
def silent_broker() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel's backlog) and never answers: a hung
    broker."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _app(port: int) -> Celery:
    app = Celery("tests.pool_review", broker=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    app.conf.update(
        broker_transport_options={
            "ack_emulation": False,  # what orga worker runs
            "socket_timeout": 1.0,
            "socket_connect_timeout": 1.0,
        },
        task_publish_retry=False,
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
    )

    @app.task(name=NAME, bind=True, shared=False)  # type: ignore[untyped-decorator]
    def body(self: Task, payload: str) -> str:
        ran = ran_on_loop(payload)
        assert ran is not None
        ran.result()
        return "done"

    @app.task(name=NEXT, shared=False)  # type: ignore[untyped-decorator]
    def following(result: str) -> None:
        return None

    return app


async def _ticks(gaps: list[float], stop: threading.Event) -> None:
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


@pytest.mark.parametrize("embed_key", ["callbacks", "chain"])
def test_a_successful_task_with_a_link_does_not_publish_on_the_loop(
    pool: LoopPool, silent_broker: int, embed_key: str
) -> None:
    """A Celery message may carry ``link`` callbacks or a ``chain`` (any producer can send
    them): on success, Celery's tracer publishes them (``app.amqp._retry_publish``), a broker
    write. ``acks_send_nothing`` says the success's tracer "makes no broker call" and the pool
    runs it on the loop, so a hung broker stalls the loop (every call in flight, heartbeats)
    for the publish's socket timeout; on ``main`` it blocked a tracer thread only."""
    app = _app(silent_broker)
    pool._trace_success_on_loop = acks_send_nothing(app)
    assert pool._trace_success_on_loop  # the decision the branch makes from orga's config

    async def coroutine(payload: str) -> None:
        await asyncio.sleep(0)

    ASYNC_BODIES[NAME] = coroutine
    following = dict(app.signature(NEXT))
    embed: dict[str, Any] = {embed_key: [following]}
    args: tuple[Any, ...] = (
        NAME,
        "id-link",
        {"id": "id-link"},
        (("p-link",), {}, embed),
        None,
        None,
    )
    target = functools.partial(trace_task_ret, app=app)

    assert pool._loop is not None
    gaps: list[float] = []
    stop = threading.Event()
    ticker = asyncio.run_coroutine_threadsafe(_ticks(gaps, stop), pool._loop)
    time.sleep(0.1)
    try:
        pool.on_apply(target, args=args, callback=lambda ret: None).wait(30)
        time.sleep(0.1)
    finally:
        stop.set()
        ticker.result(30)
    assert max(gaps) < 0.5, f"the loop stalled {max(gaps):.2f} s on the tracer's publish"


def test_a_task_that_stores_its_result_keeps_the_tracer_off_the_loop() -> None:
    """``acks_send_nothing`` reads the app's ``task_ignore_result`` only; a task declared with
    ``ignore_result=False`` (or a message whose ``ignore_result`` is False: Celery's
    ``get_actual_ignore_result``) still stores its success, a backend write, then on the
    loop."""
    app = Celery(
        "tests.pool_review.backend", broker="redis://localhost:6390/0", set_as_current=False
    )
    app.conf.broker_transport_options = {"ack_emulation": False}
    app.conf.result_backend = "redis://localhost:6390/1"
    app.conf.task_ignore_result = True

    @app.task(name="tests.pool_review.stored", ignore_result=False, shared=False)  # type: ignore[untyped-decorator]
    def stored(payload: str) -> None:
        return None

    app.finalize()
    assert not app.tasks["tests.pool_review.stored"].ignore_result
    assert not acks_send_nothing(app)
