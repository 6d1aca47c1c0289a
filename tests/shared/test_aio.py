"""The event loop helpers of :mod:`shared.aio`."""

from __future__ import annotations

import asyncio

import pytest

from shared.aio import finish_uncancelled


def test_a_write_finished_uncancelled_ends_before_its_callers_cancellation_is_raised() -> None:
    """A caller cancelled while the write runs waits for its end, then is cancelled."""
    written: list[str] = []

    async def go() -> None:
        started, release = asyncio.Event(), asyncio.Event()

        async def write() -> str:
            started.set()
            await release.wait()
            written.append("done")
            return "kept"

        caller = asyncio.ensure_future(finish_uncancelled(write()))
        await started.wait()
        caller.cancel()
        await asyncio.sleep(0)
        assert not caller.done() and not written
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await caller

    asyncio.run(go())
    assert written == ["done"]


def test_a_write_finished_uncancelled_returns_its_result_and_raises_its_error() -> None:
    async def fails() -> None:
        raise ValueError("refused")

    async def answers() -> int:
        return 3

    async def go() -> int:
        with pytest.raises(ValueError, match="refused"):
            await finish_uncancelled(fails())
        return await finish_uncancelled(answers())

    assert asyncio.run(go()) == 3
