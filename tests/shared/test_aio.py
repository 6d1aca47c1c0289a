"""The event loop helpers of :mod:`shared.aio`."""

from __future__ import annotations

import asyncio

import pytest

from shared.aio import cancel_and_wait, finish_uncancelled


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


def test_a_task_that_drops_a_cancel_is_cancelled_again_until_it_ends() -> None:
    """A loop that swallows the first cancel (as Python 3.11's ``wait_for`` may) is stopped by
    the next one, and the wait returns."""
    dropped: list[int] = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if dropped:
                    raise
                dropped.append(1)
                current = asyncio.current_task()
                assert current is not None
                current.uncancel()  # as a lost cancel leaves it: nothing pending

    async def run() -> bool:
        task = asyncio.create_task(loop())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(cancel_and_wait(task, again_s=0.01), 5)
        return task.cancelled()

    assert asyncio.run(run()) is True
    assert dropped == [1]


def test_a_task_s_own_error_is_raised_by_the_wait() -> None:
    """A task that ends with an error on its cancellation: the error reaches the caller."""

    async def failing() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ValueError("clean-up failed") from None

    async def run() -> None:
        task = asyncio.create_task(failing())
        await asyncio.sleep(0)
        await cancel_and_wait(task)

    with pytest.raises(ValueError, match="clean-up failed"):
        asyncio.run(run())
