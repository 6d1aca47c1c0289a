"""The event loop every long-running orga process runs on.

uvloop's loop where it is installed: less CPU per socket write and wake-up than asyncio's
selector loop (docs/performance.md, *Slow model*), which matters to a process that makes
hundreds of Redis round trips a second (a reasoning worker, the coordinator). asyncio's loop
where uvloop is not installed (Windows).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["CANCEL_AGAIN_S", "cancel_and_wait", "finish_uncancelled", "new_event_loop", "run"]

_T = TypeVar("_T")

CANCEL_AGAIN_S = 0.05
"""How often :func:`cancel_and_wait` cancels again a task that runs on after a cancel."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop, or asyncio's where uvloop is not installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)`` on :func:`new_event_loop`'s loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


async def finish_uncancelled(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """``coroutine`` run to its end even when the caller is cancelled meanwhile (a write whose
    effect must be complete or absent, never half there); the cancellation is then raised, after
    it. A cancellation of ``coroutine`` itself is raised at once."""
    work = asyncio.ensure_future(coroutine)
    cancelled = False
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            if work.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return work.result()


async def cancel_and_wait(task: asyncio.Future[Any], again_s: float = CANCEL_AGAIN_S) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every ``again_s`` while it
    runs on; an exception it ended with (not its cancellation) is raised.

    On Python 3.11 a cancel can be lost: ``asyncio.wait_for``, which wraps every command of a
    redis-py client with a ``socket_timeout`` (the runtime's clients have one), returns the
    result of an operation that completed as the cancel arrived, and the cancel is dropped
    (CPython gh-86296, fixed in 3.12; a loop of pipelines here lost 138 of 300 cancels). A loop
    that ends by cancellation then runs on, and whoever awaits it waits for ever. For tasks whose
    clean-up on cancellation awaits nothing a second cancel must not interrupt."""
    task.cancel()
    while not task.done():
        await asyncio.wait({task}, timeout=again_s)
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
