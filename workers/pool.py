"""The reasoning worker's Celery pool: each task's coroutine runs on the process's event loop.

Celery's thread pool (``-P threads -c 200``) gives every task a thread that hands its coroutine
to the process's one event loop and waits on it (:meth:`ProcessServices.run`): two thread
switches and a wake-up of the loop per task, and 200 threads. :class:`LoopPool` skips them:
the consumer hands each message to the loop (one ``call_soon_threadsafe``), where an asyncio
task awaits the task's coroutine (its :data:`ASYNC_BODIES` entry, given the message's single
argument) and then runs Celery's own tracer, whose task body only returns or raises what the
coroutine did (:func:`ran_on_loop`); the runtime it reports (the ``task-succeeded`` event's,
which Flower shows) has the coroutine's time added. Where the tracer runs: on the loop, right
after the coroutine, when the coroutine succeeded and the broker's acknowledgement sends
nothing (kombu's Redis transport without ack emulation, what ``orga worker`` runs:
:func:`acks_send_nothing`), so that a call costs no hand-off to a thread and back; else (a
failure, whose retry publishes a message; a broker whose ack is a write, RabbitMQ or Redis with
ack emulation: Celery 5.7 hands an ack to the consumer's hub when there is one, but the pool
does not rely on it) in one of :data:`TRACER_THREADS` threads, so that a slow or unreachable
broker stalls acknowledgements, never the calls in flight. Everything
Celery does around a task is thus unchanged: late acknowledgement after the tracer,
``autoretry_for`` and its retry message, FAILURE and its log line, the task signals. A
message that dies with its process (killed, never closing its channel) is gone from the broker
(no ack emulation, :mod:`workers.broker`): the coordinator judges its dispatch lost and re-sends
it (:mod:`coordinator.liveness`).

A task that has no coroutine body (none of ours) runs in a thread, as in the thread pool.
At most ``-c`` messages run at once, as with threads: Celery prefetches that many.

Select it with ``-P custom`` and ``CELERY_CUSTOM_WORKER_POOL=workers.pool:LoopPool`` (what
``orga worker`` starts for reasoning; :mod:`orga.topology`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from celery.concurrency.base import BasePool, apply_target
from kombu.serialization import loads, prepare_accept_content
from kombu.transport import redis as kombu_redis

__all__ = ["ASYNC_BODIES", "TRACER_THREADS", "LoopPool", "acks_send_nothing", "ran_on_loop"]

log = logging.getLogger("orga.worker.pool")

TRACER_THREADS = 4
"""Threads that run Celery's tracer (and so the late acknowledgement, a retry's publish) once a
task's coroutine is done, when that may be a blocking broker call (a failure, whose retry
publishes; any acknowledgement on a broker where it is a write): kept off the event loop so
that a slow or unreachable broker stalls acknowledgements, never the calls in flight or their
heartbeats."""

LINKED = ("callbacks", "errbacks", "chain", "chord")
"""The keys of a Celery message's embed whose value the tracer publishes on success."""

ASYNC_BODIES: dict[str, Callable[[str], Awaitable[None]]] = {}
"""Task name → the coroutine function of its body, given the task's single argument (filled by
:mod:`workers.tasks`)."""

_ran: contextvars.ContextVar[tuple[str, Future[None]] | None] = contextvars.ContextVar(
    "orga_ran_on_loop", default=None
)


def ran_on_loop(payload: str) -> Future[None] | None:
    """In a task body that :class:`LoopPool` traces: the outcome of the coroutine it already
    awaited for ``payload`` (a done future: its result, or its exception to raise); else None
    (the body must run the coroutine itself)."""
    ran = _ran.get()
    if ran is None or ran[0] != payload:
        return None
    return ran[1]


def acks_send_nothing(app: Any) -> bool:
    """Whether ``app``'s broker acknowledges a message in the worker's memory alone: kombu's
    Redis transport (``workers.broker``'s, or kombu's own) with its documented transport option
    ``ack_emulation`` off (``shared.settings.celery_config``). Then the tracer of a task that
    succeeded makes no broker call: the ack drops the message from kombu's in-memory
    ``QoS``, and the ``task-succeeded`` event goes to the dispatcher's buffer, which the
    consumer's hub flushes (``workers.events``; a flush of its own at 512 buffered events is a
    publish, which 200 calls in flight per process do not reach); and no result backend is
    configured (a task or a message may ask for its result stored even under
    ``task_ignore_result``). A message with callbacks, errbacks, a chain or a chord publishes
    them on success: :meth:`LoopPool._job` traces those in a thread, message by message."""
    if app.conf.broker_transport_options.get("ack_emulation", True) is not False:
        return False
    if app.conf.result_backend:
        return False  # a task or a message may still ask for its result stored: a backend write
    with app.connection_for_read() as connection:
        return isinstance(connection.transport, kombu_redis.Transport)


def _with_call_time(callback: Callable[..., Any], call_s: float) -> Callable[[Any], Any]:
    """``callback`` (the request's ``on_success``), given the tracer's ``(failed, retval,
    runtime)`` with ``call_s``, the time the coroutine ran, added to the runtime.

    The tracer only returns or raises what the coroutine already did, so its runtime alone is
    a fraction of a millisecond: the ``task-succeeded`` event (Flower's Runtime) then says how
    long the call took, coroutine and tracer. Anything else is passed on as it is."""

    def report(ret: Any) -> Any:
        if isinstance(ret, tuple) and len(ret) == 3 and isinstance(ret[2], (int, float)):
            ret = (ret[0], ret[1], ret[2] + call_s)
        return callback(ret)

    return report


class _Running:
    """What :meth:`LoopPool.on_apply` returns (Celery keeps it on the request)."""

    def __init__(self, future: Future[None]) -> None:
        self._future = future

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the task to end."""
        with contextlib.suppress(Exception):  # the tracer reported it already
            self._future.result(timeout)


class LoopPool(BasePool):  # type: ignore[misc]
    """A Celery pool whose tasks run as asyncio tasks on the worker process's event loop."""

    body_can_be_buffer = True
    signal_safe = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accept: set[str] = set()
        self._running: set[asyncio.Task[None]] = set()
        self._tracers = ThreadPoolExecutor(TRACER_THREADS, thread_name_prefix="orga-tracer")
        self._trace_success_on_loop = False

    def on_start(self) -> None:
        """Build the process's services (and their loop) now, not at the first task."""
        from workers.tasks import services

        conf = self.app.conf  # the worker's app, which Celery hands its pool
        self._accept = prepare_accept_content(conf.accept_content)  # type: ignore[no-untyped-call]
        self._trace_success_on_loop = acks_send_nothing(self.app)
        self._loop = services(self.app).loop

    def on_stop(self) -> None:
        """Warm shutdown: wait for the running tasks (and their acknowledgements)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._drain(), loop).result()
        self._tracers.shutdown(wait=True)

    async def _drain(self) -> None:
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> _Running:
        """Start the task on the loop (called by the consumer's thread)."""
        assert self._loop is not None, "LoopPool.on_apply before on_start"
        done: Future[None] = Future()
        self._loop.call_soon_threadsafe(
            self._spawn, done, target, args or (), kwargs or {}, callback, accept_callback
        )
        return _Running(done)

    def _spawn(self, done: Future[None], *job: Any) -> None:
        task = asyncio.get_running_loop().create_task(self._job(*job))
        self._running.add(task)

        def finished(task: asyncio.Task[None]) -> None:
            self._running.discard(task)
            if task.cancelled():
                log.warning("pool.task_cancelled")
                done.set_exception(asyncio.CancelledError())
                return
            exc = task.exception()
            if exc is None:
                done.set_result(None)
            else:  # the tracer reports a task's own failure: this is the pool's
                log.error("pool.task_failed", exc_info=exc)
                done.set_exception(exc)

        task.add_done_callback(finished)

    async def _job(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        callback: Callable[..., Any] | None,
        accept_callback: Callable[..., Any] | None,
    ) -> None:
        if accept_callback is not None:
            accept_callback(os.getpid(), time.monotonic())
        try:
            body, payload, quiet, decoded = self._async_body(args)
        except Exception:  # Celery's consumer rejects such a body first; here, a thread traces it
            body, payload, quiet, decoded = None, None, False, None
        if body is None or payload is None:  # not ours: a thread runs it, as Celery's would
            await asyncio.get_running_loop().run_in_executor(
                self._tracers, apply_target, target, args, kwargs, callback
            )
            return
        outcome: Future[None] = Future()
        started = time.monotonic()
        try:
            await body(payload)
            outcome.set_result(None)
        except Exception as exc:  # the tracer raises it in the task body
            outcome.set_exception(exc)
        except asyncio.CancelledError:  # a failure the tracer reports (and acknowledges)
            outcome.set_exception(RuntimeError("the task's coroutine was cancelled"))
        # The tracer is given the body decoded above, with no content type: what Celery's own
        # request hands it for a message it decoded already (its tracers then decode nothing).
        args = (*args[:3], decoded, None, None, *args[6:])
        # The tracer sees this outcome through a copied context (in a thread, or on the loop).
        context = contextvars.copy_context()
        context.run(_ran.set, (payload, outcome))
        if callback is not None:
            callback = _with_call_time(callback, time.monotonic() - started)
        if self._trace_success_on_loop and quiet and outcome.exception() is None:
            # No broker call in it (acks_send_nothing, and nothing linked to publish): no
            # hand-off to a thread and back.
            context.run(apply_target, target, args, kwargs, callback)
            return
        await asyncio.get_running_loop().run_in_executor(
            self._tracers, context.run, apply_target, target, args, kwargs, callback
        )

    def _async_body(
        self, args: tuple[Any, ...]
    ) -> tuple[Callable[[str], Awaitable[None]] | None, str | None, bool, Any]:
        """The coroutine body of the traced task and its single argument, if it has one;
        whether the message links nothing the tracer would publish on success (no callbacks,
        errbacks, chain or chord in its embed: Celery's ``link``, ``chain``, a chord's body);
        and the decoded body (positional arguments, named arguments, embed).

        ``args`` are the tracer's: task name, id, request, body, content type, encoding (no
        content type: a body Celery decoded already).
        """
        if len(args) < 6 or args[0] not in ASYNC_BODIES:
            return None, None, False, None
        body, content_type, encoding = args[3], args[4], args[5]
        if content_type:
            body = loads(body, content_type, encoding, accept=self._accept)  # type: ignore[no-untyped-call]
        positional, named, embed = body
        if named or len(positional) != 1 or not isinstance(positional[0], str):
            return None, None, False, None
        quiet = isinstance(embed, dict) and not any(embed.get(k) for k in LINKED)
        return ASYNC_BODIES[args[0]], positional[0], quiet, body

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update({"max-concurrency": self.limit, "running": len(self._running)})
        return info
