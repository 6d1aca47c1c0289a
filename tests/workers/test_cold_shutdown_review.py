"""Review of branch ``fixm``: a thread-pool worker's cold shutdown (SIGQUIT, a second SIGINT)
cancels its running calls and rejects their messages back to their queue. A call whose command
already ran and whose answer is being written (the ``MULTI``/``EXEC`` sent, its reply not yet
read) is cancelled too: the answer is in Redis, yet the message is requeued and the command
runs a second time on redelivery (no fence stops a same-fence redelivery before it runs)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Reject

import workers.tasks
from shared.protocol import Fence, LoopConfig, ToolCallAction, ToolRequest
from workers.handlers import DispatchOutcome


class _Liveness:
    @contextlib.contextmanager
    def watching(self, _task_id: str, _work: Any) -> Iterator[None]:
        yield

    def finished(self, _fences: Any) -> None:
        return None


def test_a_call_whose_answer_is_being_written_is_not_requeued_by_a_cold_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    written, reply = threading.Event(), asyncio.Event()

    async def started(*_: Any) -> None:
        return None

    async def publish(_message: Any, _calls: Any, answered: Any = ()) -> None:
        written.set()  # the transaction reached Redis: the answer is there
        await reply.wait()  # its reply on the way back

    async def dispatch(*_: Any, **__: Any) -> DispatchOutcome:
        return DispatchOutcome(answers=[object()])  # type: ignore[list-item]  # the command ran

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    runtime = SimpleNamespace(
        loop=loop,
        run=run,
        redis=None,
        settings=SimpleNamespace(partitions=1),
        started=started,
        publish=publish,
        liveness=_Liveness(),
    )
    monkeypatch.setattr(workers.tasks, "_services", runtime)
    monkeypatch.setattr(workers.tasks, "_cancelling", False)
    monkeypatch.setattr(workers.tasks, "run_dispatch", dispatch)
    fence = Fence(task_id="t", step_id="s", iteration=1, attempt=1, nonce="n", call_id="c1")
    request = ToolRequest(
        fence=fence,
        agent_id="a",
        action=ToolCallAction(call_id="c1", name="shell", arguments="{}"),
        workspace="/ws",
        config=LoopConfig(),
    )
    raised: list[BaseException] = []

    def pool_thread() -> None:
        try:
            workers.tasks._run_from_thread(
                Celery(),
                workers.tasks._answer(request, runtime, "tools"),  # type: ignore[arg-type]
            )
        except BaseException as exc:  # what the pool thread's task raised
            raised.append(exc)

    thread = threading.Thread(target=pool_thread)
    thread.start()
    try:
        assert written.wait(10)
        workers.tasks.cancel_running_calls()  # the SIGQUIT handler's work
        loop.call_soon_threadsafe(reply.set)  # the reply arrives right after
        thread.join(10)
        assert not thread.is_alive()
        requeued = [e for e in raised if isinstance(e, Reject) and e.requeue]
        assert not requeued, (
            "a call whose answer was written was rejected with requeue: its command runs again"
        )
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
