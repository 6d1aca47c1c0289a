"""The Celery tasks: thin. Decode, call the library, publish the observation, and return.

A task never waits on another task's result: its answer goes to the coordinator through the
observations stream. A payload that cannot be decoded is dead-lettered (there is no fence to
answer to); a failure inside the library is reported as ``worker_failed`` with its fence, and
the coordinator decides to re-dispatch or dead-letter it.

The tasks are declared with :func:`celery.shared_task`: they belong to whichever app includes
this module (:mod:`orga.celery`, the Celery app, which is process assembly), so the workers never
import that app; a task reads the settings and the model keys from its own app's configuration.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from celery import Celery, Task, current_app, shared_task
from celery.exceptions import Reject
from pydantic import ValidationError
from redis.exceptions import AskError, ClusterError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from shared import keys
from shared.mcp import McpListRequest
from shared.protocol import (
    Fence,
    ReasonRequest,
    ToolRequest,
    WorkerFailedMessage,
)
from shared.settings import OrgaSettings, TelemetrySettings
from workers.app_config import worker_config
from workers.broker import TRANSIENT_WRITE_ERRORS
from workers.handlers import live_fences, run_dispatch
from workers.pool import ASYNC_BODIES, ran_on_loop
from workers.providers.settings import ProviderSettings
from workers.providers.streaming import streaming_to
from workers.providers.waiting import RedisWaitWatch, watching
from workers.runtime import ProcessServices
from workers.telemetry import configure_tracing, flush_tracing
from workers.token_stream import RedisTokenSink
from workers.tools.base import Tool
from workers.tools.registry import ToolRegistry, default_registry

__all__ = [
    "DispatchFailedError",
    "cancel_running_calls",
    "close_services",
    "handle",
    "reason",
    "services",
    "tool_call",
]

log = logging.getLogger("orga.worker")

PUBLISH_PATIENCE_S = 120.0
"""How long a worker keeps trying to publish an answer while Redis refuses writes."""
SLOT_MOVING_ERRORS: tuple[type[Exception], ...] = (TryAgainError, ClusterError, AskError)
"""What a Redis Cluster moving a slot (a live reshard) makes redis-py raise for a command it
did not run: ``TRYAGAIN`` (a script's or ``MULTI``'s keys split between the two nodes), ``TTL
exhausted`` (redis-py 8.2's asyncio ``RedisCluster`` sends ``ASKING`` on another pooled
connection than the command, so a key already moved is redirected back and forth until the
redirects run out) and ``MOVED``/``ASK`` (a ``MovedError`` is an ``AskError``) out of a
``MULTI``. A dispatch that meets one is retried like one that found Redis unreachable (Celery
runs it again after a back-off, no attempt of the task spent), and a publish waits it out."""
_PUBLISH_WAITS_OUT: tuple[type[Exception], ...] = (*TRANSIENT_WRITE_ERRORS, *SLOT_MOVING_ERRORS)
"""What :func:`_publish` waits out: Redis refusing writes, a slot being moved."""
RETRIED_REDIS_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, *SLOT_MOVING_ERRORS)
"""A dispatch failing with one of these is run again by Celery (``autoretry_for``, with
back-off), not answered ``worker_failed``."""
_services: ProcessServices | None = None
_services_lock = threading.Lock()
_calls: set[asyncio.Task[Any]] = set()
"""The calls a thread of this process runs on its loop (:func:`_cancellable`), for
:func:`cancel_running_calls`; touched on the loop thread only."""
_cancelling = False
"""Set by :func:`cancel_running_calls`: a call that starts later is cancelled at once."""
COLD_SHUTDOWN_REJECT = (
    "cold shutdown: the call was cancelled, its message goes back to its queue (as a prefork "
    "worker's pool process killed: task_reject_on_worker_lost)"
)


class DispatchFailedError(Exception):
    """Raised by a Celery task after it told the coordinator its dispatch failed, so that the
    Celery task itself ends FAILURE (Flower's Failed tab) instead of SUCCESS."""


def services(app: Celery | None = None) -> ProcessServices:
    """This process's services, built on first use (after the fork; once for all threads of
    a thread-pool worker) from the configuration of ``app``, the worker's Celery app (by
    default the current one, which a Celery worker sets to its own in every process)."""
    global _services  # noqa: PLW0603 - one per worker process, by design
    if _services is None:
        with _services_lock:
            if _services is None:
                conf = (app or current_app).conf
                config = worker_config(app or current_app)
                settings: OrgaSettings = config.settings
                assert settings.redis_url is not None
                configure_tracing(TelemetrySettings(), "orga-worker", out=sys.__stdout__)
                provider = ProviderSettings.with_keys(config.model_keys)
                _services = ProcessServices(
                    settings,
                    provider,
                    settings.redis_url,
                    registry=_registry(conf),
                    connect=config.async_redis,
                )
                _services.mcp_list_sender = functools.partial(_send_mcp_list, app or current_app)
    return _services


def _registry(conf: Any) -> ToolRegistry | None:
    """The default registry plus the tools in the app's ``conf.orga_extra_tools``, if any.

    An application that embeds the workers (a benchmark's no-op tool, an in-house tool that is
    not packaged as an ``orga.tools`` entry point) sets that list before the worker starts.
    """
    extra: list[Tool] = list(conf.get("orga_extra_tools") or ())
    if not extra:
        return None
    registry = default_registry()
    for tool in extra:
        registry.register(tool)
    return registry


def _send_mcp_list(app: Celery, request: McpListRequest) -> None:
    """Ask a tool worker to list a task's MCP tools (blocking: a broker call)."""
    app.send_task(
        keys.mcp_list_task_name,
        args=[request.model_dump_json()],
        queue=keys.tools_queue,
        declare=[],  # as the relay sends: the workers declare their queues
    )


async def list_mcp_tools(payload: str) -> None:
    """The body of ``orga.mcp_list``: list the task's MCP tools and answer on its reply key
    (an undecodable payload is dead-lettered)."""
    runtime = services()
    try:
        request = McpListRequest.model_validate_json(payload)
    except ValidationError as exc:
        await runtime.dead_letter_payload(keys.mcp_list_task_name, payload, str(exc))
        raise DispatchFailedError(f"undecodable MCP listing request: {str(exc)[:500]}") from exc
    await runtime.answer_mcp_listing(request)


def cancel_running_calls() -> None:
    """Cancel the calls this process's threads run on its loop, and every later one: a cold
    shutdown of a thread-pool worker (:mod:`orga.celery`), which has no pool process to kill.
    A cancelled call's commands are killed by their launcher as it unwinds, and it answers
    nothing (its message goes back to its queue); the thread waiting for it then returns. Only
    a call's work is cancelled: a call whose work has ended publishes its answer and is acked
    (:func:`_answer`), lest the answer be written and its command run again on redelivery.
    Callable from any thread and from a signal handler; nothing to do when no call ever ran."""
    global _cancelling  # noqa: PLW0603
    _cancelling = True
    runtime = _services
    if runtime is not None and not runtime.loop.is_closed():
        runtime.loop.call_soon_threadsafe(_cancel_calls)


def _cancel_calls() -> None:
    for call in list(_calls):
        call.cancel()


def _run_from_thread(app: Celery, coroutine: Coroutine[Any, Any, None]) -> None:
    """``coroutine`` run on the process's loop from this pool thread, as a call that
    :func:`cancel_running_calls` cancels; its message then goes back to its queue."""
    try:
        services(app).run(_cancellable(coroutine))
    except concurrent.futures.CancelledError as exc:
        if not _cancelling:
            raise
        raise Reject(COLD_SHUTDOWN_REJECT, requeue=True) from exc


async def _cancellable(coroutine: Coroutine[Any, Any, None]) -> None:
    """``coroutine`` run as a call :func:`cancel_running_calls` cancels."""
    if _cancelling:
        coroutine.close()
        raise asyncio.CancelledError
    call = asyncio.current_task()
    assert call is not None
    _calls.add(call)
    try:
        await coroutine
    finally:
        _calls.discard(call)


def close_services() -> None:
    """Release the process's services."""
    global _services  # noqa: PLW0603
    if _services is not None:
        _services.close()
        _services = None
    flush_tracing()


async def handle(name: str, payload: str) -> None:
    """The body of task ``name``, on the process's loop: decode, answer, and raise
    :class:`DispatchFailedError` when the dispatch failed (an undecodable payload is
    dead-lettered)."""
    model, queue = _TASKS[name]
    runtime = services()
    try:
        request = model.model_validate_json(payload)
    except ValidationError as exc:
        log.error("task.undecodable", extra={"task": name, "error": str(exc)[:500]})
        await runtime.dead_letter_payload(name, payload, str(exc))
        raise DispatchFailedError(f"undecodable {name} payload: {str(exc)[:500]}") from exc
    failure = await _answer(request, runtime, queue)
    if failure is not None:
        raise DispatchFailedError(failure.error)


def _handle(task: Task, name: str, payload: str) -> None:
    """A task's body: what :class:`~workers.pool.LoopPool` already ran on the loop, else
    (another pool: threads, solo) :func:`handle` run on the loop from this thread."""
    ran = ran_on_loop(payload)
    if ran is not None:
        ran.result()  # raises what the coroutine raised
        return
    _run_from_thread(task.app, handle(name, payload))


async def _answer(
    request: ReasonRequest | ToolRequest,
    runtime: ProcessServices,
    queue: str,
) -> WorkerFailedMessage | None:
    """Say the dispatch started, run it (heartbeating it), and publish what it answered with
    the dispatch marked answered, in one transaction; a failure is published as
    ``worker_failed`` at once, and returned. A dispatch whose task ends while it runs is
    cancelled (:meth:`Liveness.watching`: a command's processes are killed) and answers
    nothing."""
    fences = live_fences(request)
    await runtime.started(request, fences, queue)
    # A model call held in a retry wait is shown to operators and stops when its task ends:
    # the watch is in the context the work's task copies when it is created.
    watch = RedisWaitWatch(runtime.redis, request.fence, partitions=runtime.settings.partitions)
    with watching(watch), _streaming(request, runtime):
        work = asyncio.ensure_future(
            run_dispatch(request, runtime, passthrough=RETRIED_REDIS_ERRORS)
        )
    current = asyncio.current_task()
    try:
        with runtime.liveness.watching(request.fence.task_id, work):
            outcome = await work
    except asyncio.CancelledError:
        if _cancelling and work.done() and not work.cancelled() and current is not None:
            # A cold shutdown's cancellation reached the call as its work ended: the work's
            # effects are done, so its answer is published and its message acked.
            current.uncancel()
            outcome = work.result()
        elif not work.cancelled() or (current is not None and current.cancelling()):
            raise
        else:
            # The task ended (cancelled, or with its parent): its commands were killed, and no
            # one waits for an answer.
            log.info("dispatch.abandoned", extra={"task_id": request.fence.task_id})
            return None
    finally:
        runtime.liveness.finished(fences)
    # From here on the call only publishes what its work did: a cold shutdown does not cancel
    # it (:func:`cancel_running_calls`), lest the answer be written AND the message requeued.
    if current is not None:
        _calls.discard(current)
    if not outcome.answers:
        await _publish(runtime, None, outcome.chained, fences)
    for index, each in enumerate(outcome.answers):
        chained = outcome.chained if index == 0 else ()
        await _publish(runtime, each, chained, fences)
    return outcome.failure


def _streaming(
    request: ReasonRequest | ToolRequest, runtime: ProcessServices
) -> AbstractContextManager[None]:
    """A reasoning's model call streams its answer to the task's tokens stream
    (:mod:`workers.token_stream`), unless ``ORGA_STREAM_TOKENS`` is off."""
    if not isinstance(request, ReasonRequest) or not runtime.settings.stream_tokens:
        return nullcontext()
    sink = RedisTokenSink(
        runtime.redis, request.fence, request.purpose, partitions=runtime.settings.partitions
    )
    return streaming_to(sink)


async def _publish(
    runtime: ProcessServices,
    message: Any,
    calls: Sequence[ToolRequest],
    fences: Sequence[Fence],
    give_up_after_s: float = PUBLISH_PATIENCE_S,
) -> None:
    """Publish the answer; while Redis refuses writes (out of memory) or a Redis Cluster moves
    the slot of its keys (:data:`SLOT_MOVING_ERRORS`: the transaction did not run), try again
    with back-off for up to ``give_up_after_s``, so a dispatch that ran is not lost to a short
    episode."""
    deadline = time.monotonic() + give_up_after_s
    delay_s = 0.25
    while True:
        try:
            await runtime.publish(message, calls, answered=fences)
            return
        except _PUBLISH_WAITS_OUT as exc:
            if time.monotonic() + delay_s > deadline:
                raise
            log.warning("publish.refused", extra={"error": str(exc)[:300], "retry_in_s": delay_s})
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 5.0)


@shared_task(  # type: ignore[untyped-decorator]
    name=keys.reason_task_name,
    bind=True,
    autoretry_for=RETRIED_REDIS_ERRORS,
    retry_backoff=True,
    max_retries=5,
)
def reason(self: Task, payload: str) -> None:
    """Reason and Gate for one iteration; publishes a ``reasoned`` observation."""
    _handle(self, keys.reason_task_name, payload)


@shared_task(  # type: ignore[untyped-decorator]
    name=keys.tool_task_name,
    bind=True,
    autoretry_for=RETRIED_REDIS_ERRORS,
    retry_backoff=True,
    max_retries=5,
)
def tool_call(self: Task, payload: str) -> None:
    """One tool call; publishes a ``tool_observed`` observation."""
    _handle(self, keys.tool_task_name, payload)


_TASKS: dict[str, tuple[type[ReasonRequest] | type[ToolRequest], str]] = {
    keys.reason_task_name: (ReasonRequest, keys.reasoning_queue),
    keys.tool_task_name: (ToolRequest, keys.tools_queue),
}
"""Each task's request model and queue."""
ASYNC_BODIES.update({name: functools.partial(handle, name) for name in _TASKS})


@shared_task(  # type: ignore[untyped-decorator]
    name=keys.mcp_list_task_name,
    bind=True,
    autoretry_for=RETRIED_REDIS_ERRORS,
    retry_backoff=True,
    max_retries=5,
)
def mcp_list(self: Task, payload: str) -> None:
    """Start a task's MCP servers and list their tools (for a reasoning worker)."""
    ran = ran_on_loop(payload)
    if ran is not None:
        ran.result()
        return
    _run_from_thread(self.app, list_mcp_tools(payload))


ASYNC_BODIES[keys.mcp_list_task_name] = list_mcp_tools
