"""The reasoning worker's ``LoopPool``: a task's coroutine runs on the event loop, and Celery's
tracer in a thread when it may make a broker call (a failure's retry, an ack that is a broker
write), so a slow broker never stalls the loop, else on the loop; a cancelled coroutine is a
failure the tracer reports."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from concurrent.futures import Future
from typing import Any

import pytest
from celery import Celery
from celery.app.trace import build_tracer, fast_trace_task, trace_task_ret
from kombu.serialization import prepare_accept_content, register, unregister

from shared.settings import OrgaSettings, celery_config
from workers.pool import ASYNC_BODIES, LoopPool, acks_send_nothing, ran_on_loop

NAME = "tests.pool.body"


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


def _where_traced(pool: LoopPool, payload: str, body: Any) -> tuple[int, int]:
    """(the loop's thread, the thread the tracer ran in) for one task."""
    assert pool._loop is not None
    loop_thread = asyncio.run_coroutine_threadsafe(_thread_id(), pool._loop).result(5)
    traced: list[int] = []
    ASYNC_BODIES[NAME] = body
    pool.on_apply(lambda *args: traced.append(threading.get_ident()), args=_args(payload)).wait(5)
    assert len(traced) == 1
    return loop_thread, traced[0]


async def _thread_id() -> int:
    return threading.get_ident()


async def _succeeds(payload: str) -> None:
    await asyncio.sleep(0)


async def _fails(payload: str) -> None:
    raise ValueError("the call failed")


def test_a_success_is_traced_on_the_loop_when_the_ack_sends_nothing(pool: LoopPool) -> None:
    """No hand-off to a thread: the tracer of a task that succeeded makes no broker call when
    the ack is kombu's in-memory one (Redis without ack emulation)."""
    pool._trace_success_on_loop = True
    loop_thread, tracer_thread = _where_traced(pool, "p4", _succeeds)
    assert tracer_thread == loop_thread


def test_a_failure_is_traced_in_a_thread_as_before(pool: LoopPool) -> None:
    """A failure's tracer may publish a retry (a blocking broker call): never on the loop."""
    pool._trace_success_on_loop = True
    loop_thread, tracer_thread = _where_traced(pool, "p5", _fails)
    assert tracer_thread != loop_thread


def test_without_the_in_memory_ack_every_tracer_runs_in_a_thread(pool: LoopPool) -> None:
    assert pool._trace_success_on_loop is False  # before on_start, and on RabbitMQ
    loop_thread, tracer_thread = _where_traced(pool, "p6", _succeeds)
    assert tracer_thread != loop_thread


@pytest.mark.parametrize(
    ("broker", "options", "expected"),
    [
        ("redis://localhost:6390/0", {"ack_emulation": False}, True),
        ("rediss://localhost:6390/0", {"ack_emulation": False}, True),
        ("redis://localhost:6390/0", {}, False),  # kombu's default: the ack is a Redis write
        ("redis://localhost:6390/0", {"ack_emulation": True}, False),
        ("amqp://guest@localhost:5690//", {"ack_emulation": False}, False),
    ],
)
def test_the_ack_sends_nothing_only_on_redis_without_ack_emulation(
    broker: str, options: dict[str, Any], expected: bool
) -> None:
    app = Celery("tests.pool", broker=broker, set_as_current=False)
    app.conf.broker_transport_options = options
    assert acks_send_nothing(app) is expected


def test_a_result_backend_that_stores_successes_sends_the_tracer_to_a_thread() -> None:
    """A backend write per success is a broker-like call: not on the loop."""
    app = Celery("tests.pool.backend", broker="redis://localhost:6390/0", set_as_current=False)
    app.conf.broker_transport_options = {"ack_emulation": False}
    app.conf.result_backend = "redis://localhost:6390/1"
    app.conf.task_ignore_result = False
    assert not acks_send_nothing(app)
    app.conf.task_ignore_result = True  # a task or a message may still ask for its result
    assert not acks_send_nothing(app)


def test_orga_workers_ack_in_memory() -> None:
    """What ``orga worker`` configures (shared.settings.celery_config) is the case traced on
    the loop."""
    settings = OrgaSettings()
    app = Celery("tests.pool.orga", set_as_current=False)
    app.conf.update(celery_config(settings, "redis://localhost:6390/0"))
    assert acks_send_nothing(app)


COUNTED = "application/x-orga-counted"


@pytest.mark.parametrize("tracer", ["trace_task_ret", "fast_trace_task"])
def test_a_message_body_is_decoded_once_for_the_coroutine_and_the_tracer(
    pool: LoopPool, tracer: str
) -> None:
    """The pool decodes a message's body to find the coroutine's argument; Celery's own tracer
    (``trace_task_ret``, or ``fast_trace_task``, which ``celery worker`` uses) is then given that
    decoded body with no content type, as Celery's request gives it a body it decoded already,
    and decodes nothing again. The body here is in a serializer that counts its decodes
    (kombu's public ``register``). Celery's consumer decodes a message once more before the
    pool sees it (its strategy reads the payload), which this test does not run."""
    decodes: list[bytes] = []

    def decode(data: bytes) -> Any:
        decodes.append(data)
        return json.loads(data)

    register(COUNTED, json.dumps, decode, content_type=COUNTED, content_encoding="utf-8")  # type: ignore[no-untyped-call]
    try:
        app = Celery("tests.pool.decode", set_as_current=False)
        app.conf.update(result_backend=None, task_ignore_result=True, accept_content=[COUNTED])
        pool._accept = accept = prepare_accept_content([COUNTED])  # type: ignore[no-untyped-call]
        seen: list[str] = []

        @app.task(name=NAME, shared=False)  # type: ignore[untyped-decorator]
        def task_body(payload: str) -> str:
            ran = ran_on_loop(payload)
            assert ran is not None, "the tracer ran the coroutine again"
            ran.result()
            seen.append(payload)
            return "done"

        async def coroutine(payload: str) -> None:
            await asyncio.sleep(0)

        ASYNC_BODIES[NAME] = coroutine
        if tracer == "fast_trace_task":  # as celery worker's optimizations set it up
            task_body.__trace__ = build_tracer(NAME, task_body, app=app)
            target = functools.partial(fast_trace_task, _loc=(app.tasks, accept, "host"))
        else:
            target = functools.partial(trace_task_ret, app=app)
        body = json.dumps([["p-once"], {}, {}]).encode()
        reported: list[Any] = []
        args = (NAME, "id-once", {"id": "id-once"}, body, COUNTED, "utf-8")
        pool.on_apply(target, args=args, callback=reported.append).wait(5)
    finally:
        unregister(COUNTED)  # type: ignore[no-untyped-call]
    assert seen == ["p-once"]
    assert len(reported) == 1, f"the tracer reported {reported}"
    assert reported[0][0] == 0, f"the tracer reported a failure: {reported}"
    assert decodes == [body], f"the body was decoded {len(decodes)} times"
