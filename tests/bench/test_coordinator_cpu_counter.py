"""``bench/coordinator_cpu.py``'s call counter: it counts the Python frames entered (each
resumption of a coroutine too) and the C functions called while it is on, and nothing after."""

from __future__ import annotations

import asyncio

from bench.coordinator_cpu import CallCounter


def _leaf() -> int:
    return len("abc")


def _three_leaves() -> int:
    return _leaf() + _leaf() + _leaf()


async def _resumed_twice() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_the_counter_counts_python_frames_and_c_calls_while_on() -> None:
    with CallCounter() as idle:  # what turning it off counts itself
        pass
    with CallCounter() as counter:
        _three_leaves()
    assert counter.python - idle.python == 4  # _three_leaves and three _leaf
    assert counter.native - idle.native == 3  # three len
    counted = (counter.python, counter.native)
    _three_leaves()
    assert (counter.python, counter.native) == counted, "it counted after it was turned off"


def test_each_resumption_of_a_coroutine_is_a_frame_entered() -> None:
    coroutine = _resumed_twice()
    coroutine.send(None)  # started: it waits in its first sleep(0)
    with CallCounter() as idle:
        pass
    with CallCounter() as resumed:
        coroutine.send(None)  # resumed once: it waits in its second sleep(0)
    # the coroutine's own frame entered again, and those of the sleep it was waiting in
    assert resumed.python - idle.python >= 2
    coroutine.close()
