"""The event loop every long-running orga process runs on.

uvloop's loop where it is installed: less CPU per socket write and wake-up than asyncio's
selector loop (docs/performance.md, *Slow model*), which matters to a process that makes
hundreds of Redis round trips a second (a reasoning worker, the coordinator). asyncio's loop
where uvloop is not installed (Windows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["finish_uncancelled", "new_event_loop", "run"]

_T = TypeVar("_T")


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
