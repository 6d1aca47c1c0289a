"""Fixtures shared by the worker tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from workers.pool import ASYNC_BODIES, LoopPool


@pytest.fixture
def pool() -> Iterator[LoopPool]:
    """A ``LoopPool`` whose event loop runs in a thread of its own, as the worker's does; the
    coroutine bodies a test registers (``ASYNC_BODIES``) are forgotten afterwards."""
    registered = set(ASYNC_BODIES)
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
        for name in set(ASYNC_BODIES) - registered:
            ASYNC_BODIES.pop(name, None)
