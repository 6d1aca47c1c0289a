"""The worker's Celery app keeps the state's settings, clients and model keys off ``app.conf``,
which ``celery inspect conf`` and Flower's configuration view show."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from shared.settings import OrgaSettings
from workers.app_config import worker_config


def test_the_celery_conf_holds_no_redis_password_nor_orga_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``app.conf.table()`` (what a worker's ``conf`` control command answers, uncensored) has
    neither the state Redis's password nor the orga settings or client builders; the censored
    table hides the broker's password too; the worker's config is kept beside the app."""
    settings = OrgaSettings(
        redis_url="redis://:state-pw@n1:7000/0,redis://:state-pw@n2:7000/0",
        redis_cluster=True,
        broker_url="amqp://orga:broker-pw@rabbit:5672//",
    )
    monkeypatch.setenv("ORGA_REDIS_URL", "redis://127.0.0.1:1/0")  # orga.celery's own app
    app = importlib.import_module("orga.celery").create_app(settings)
    shown = repr(app.conf.table(with_defaults=False))
    assert "state-pw" not in shown
    assert not [key for key in app.conf.table() if key.startswith("orga_")]
    assert "broker-pw" not in repr(app.conf.table(with_defaults=True, censored=True))
    assert worker_config(app).settings is settings
    assert "state-pw" not in repr(worker_config(app))


def test_a_worker_reads_its_connection_urls_from_its_socket_at_its_edge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's settings take ORGA_REDIS_URL and ORGA_BROKER_URL from the socket
    ORGA_CONNECTION_FD names (over the environment's), once: the variable is then gone."""
    from workers import key_handoff

    monkeypatch.setenv("ORGA_REDIS_URL", "redis://127.0.0.1:1/0")  # orga.celery's own app
    celery_module = importlib.import_module("orga.celery")
    urls = {"ORGA_REDIS_URL": "redis://:state-pw@h:6379/0", "ORGA_BROKER_URL": "amqp://u:b@r//"}
    monkeypatch.setenv(key_handoff.CONNECTION_FD_VARIABLE, str(key_handoff.send(urls)))
    app = celery_module.create_app()
    settings = worker_config(app).settings
    assert settings.redis_url == "redis://:state-pw@h:6379/0"
    assert settings.broker_url == "amqp://u:b@r//"
    assert app.conf.broker_url == "amqp://u:b@r//"
    assert key_handoff.CONNECTION_FD_VARIABLE not in os.environ


def test_the_workers_flush_task_events_once_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's consumer blueprint has :mod:`workers.events`' step (one flush per window of
    task events, on the worker's event loop)."""
    from workers.events import TaskEventWindows

    monkeypatch.setenv("ORGA_REDIS_URL", "redis://127.0.0.1:1/0")  # orga.celery's own app
    app = importlib.import_module("orga.celery").create_app(
        OrgaSettings(redis_url="redis://127.0.0.1:1/0")
    )
    assert TaskEventWindows in app.steps["consumer"]


def test_a_pool_process_starts_without_its_services_and_ignores_sighup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a prefork pool process does as it starts (``worker_process_init``): it ignores
    SIGHUP, and builds no services (event loop thread, Redis client, tool registry): its first
    task does, so an idle tool pool process holds none of them (issue 27, memory)."""
    import signal

    from celery.signals import worker_process_init

    import workers.tasks

    monkeypatch.setenv("ORGA_REDIS_URL", "redis://127.0.0.1:1/0")  # orga.celery's own app
    importlib.import_module("orga.celery")
    built: list[object] = []
    monkeypatch.setattr(workers.tasks, "ProcessServices", lambda *a, **k: built.append(a))
    before = signal.getsignal(signal.SIGHUP)
    try:
        worker_process_init.send(sender=None)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
    assert built == []


def test_a_worker_closes_its_services_when_it_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``worker_shutdown`` (sent once the pool stopped and its calls finished) closes the
    process's services: a thread-pool tool worker, which has no pool process to send
    ``worker_process_shutdown``, does not exit with its loop, Redis client and tracing open."""
    from celery.signals import worker_shutdown

    import workers.tasks

    monkeypatch.setenv("ORGA_REDIS_URL", "redis://127.0.0.1:1/0")  # orga.celery's own app
    importlib.import_module("orga.celery")
    closed: list[str] = []
    monkeypatch.setattr(workers.tasks, "close_services", lambda: closed.append("closed"))
    worker_shutdown.send(sender=None)
    assert closed == ["closed"]


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_thread_pool_workers_cold_shutdown_cancels_its_running_call(
    monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    """SIGQUIT to a thread-pool worker (its handler, installed once the worker is ready)
    cancels the call a pool thread runs on the process's loop, which unwinds (its launcher
    kills its command) and is rejected back to its queue, and stops the worker with exit code
    1; a later call is refused at once. A prefork worker keeps Celery's handlers."""
    import asyncio
    import signal
    import threading

    from celery.concurrency.prefork import TaskPool as PreforkTaskPool
    from celery.concurrency.thread import TaskPool as ThreadTaskPool
    from celery.exceptions import Reject
    from celery.signals import worker_ready
    from celery.worker import state

    import workers.tasks

    monkeypatch.setenv("ORGA_REDIS_URL", "redis://127.0.0.1:1/0")  # orga.celery's own app
    app = importlib.import_module("orga.celery").app
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    monkeypatch.setattr(workers.tasks, "_services", SimpleNamespace(loop=loop, run=run))
    monkeypatch.setattr(workers.tasks, "_cancelling", False)
    monkeypatch.setattr(state, "should_terminate", None)
    started, unwound = threading.Event(), threading.Event()

    async def call() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()

    raised: list[BaseException] = []

    def pool_thread() -> None:
        try:
            workers.tasks._run_from_thread(app, call())
        except BaseException as exc:  # what the pool thread's task raised
            raised.append(exc)

    handlers = {s: signal.getsignal(s) for s in (signal.SIGQUIT, signal.SIGINT, signal.SIGHUP)}
    thread = threading.Thread(target=pool_thread)
    thread.start()
    try:
        assert started.wait(10)
        pool_class = ThreadTaskPool if pool == "threads" else PreforkTaskPool
        worker_ready.send(sender=_Consumer(pool_class(1)))
        installed = signal.getsignal(signal.SIGQUIT)
        if pool == "prefork":
            assert installed is handlers[signal.SIGQUIT]
            workers.tasks.cancel_running_calls()  # the thread must end; Celery's handler not run
        else:
            assert callable(installed) and installed is not handlers[signal.SIGQUIT]
            installed(signal.SIGQUIT, None)
            assert state.should_terminate == 1
        thread.join(10)
        assert unwound.is_set()
        assert len(raised) == 1 and isinstance(raised[0], Reject), raised
        assert raised[0].requeue
        with pytest.raises(Reject):
            workers.tasks._run_from_thread(app, call())  # a later call: refused at once
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


def test_a_call_whose_answer_is_being_written_is_not_requeued_by_a_cold_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread-pool worker's cold shutdown cancels only a call's work: a call whose command
    ran and whose answer is being written (its ``MULTI``/``EXEC`` sent, the reply not yet read)
    writes it and is acked, not requeued, lest its command run a second time on redelivery."""
    import asyncio
    import threading

    from celery import Celery
    from celery.exceptions import Reject

    import workers.tasks
    from workers.handlers import DispatchOutcome

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    written, reply = threading.Event(), asyncio.Event()

    async def publish(_message: Any, _calls: Any, answered: Any = ()) -> None:
        written.set()  # the transaction reached Redis: the answer is there
        await reply.wait()  # its reply on the way back

    async def dispatch(*_: Any, **__: Any) -> DispatchOutcome:
        return DispatchOutcome(answers=[object()])  # type: ignore[list-item]  # the command ran

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    runtime = _tool_worker(monkeypatch, loop, run, publish, dispatch)
    request = _shell_request()
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


def test_a_cold_shutdown_reaching_a_call_as_its_work_ends_lets_it_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cold shutdown's cancellation that reaches a call once its work has ended (the work
    done, the call not yet resumed) is withdrawn: the answer is published and the call ends
    normally (acked), not requeued to run its command again."""
    import asyncio

    from celery import Celery

    import workers.tasks
    from workers.handlers import DispatchOutcome

    published: list[object] = []

    async def publish(message: Any, _calls: Any, answered: Any = ()) -> None:
        published.append(message)

    async def dispatch(*_: Any, **__: Any) -> DispatchOutcome:
        workers.tasks.cancel_running_calls()  # lands before the call resumes from its work
        return DispatchOutcome(answers=["ran"])  # type: ignore[list-item]

    loop = asyncio.new_event_loop()
    runtime = _tool_worker(monkeypatch, loop, loop.run_until_complete, publish, dispatch)
    request = _shell_request()
    try:
        workers.tasks._run_from_thread(
            Celery(),
            workers.tasks._answer(request, runtime, "tools"),  # type: ignore[arg-type]
        )
    finally:
        loop.close()
    assert published == ["ran"]


def _tool_worker(
    monkeypatch: pytest.MonkeyPatch, loop: Any, run: Any, publish: Any, dispatch: Any
) -> Any:
    """A thread-pool tool worker's services as ``workers.tasks`` sees them: ``loop`` its event
    loop, ``run`` how a pool thread runs a coroutine there, ``publish`` its answers' write and
    ``dispatch`` the call's work."""

    import workers.tasks

    async def started(*_: Any) -> None:
        return None

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
    return runtime


def _shell_request() -> Any:
    """A tool call of ``shell`` on its own fence."""
    from shared.protocol import Fence, LoopConfig, ToolCallAction, ToolRequest

    fence = Fence(task_id="t", step_id="s", iteration=1, attempt=1, nonce="n", call_id="c1")
    return ToolRequest(
        fence=fence,
        agent_id="a",
        action=ToolCallAction(call_id="c1", name="shell", arguments="{}"),
        workspace="/ws",
        config=LoopConfig(),
    )


class _Liveness:
    """A worker's liveness that watches nothing."""

    @contextlib.contextmanager
    def watching(self, _task_id: str, _work: Any) -> Iterator[None]:
        yield

    def finished(self, _fences: Any) -> None:
        return None


class _Consumer:
    """What ``worker_ready`` is sent by: a worker's consumer, with its pool."""

    def __init__(self, pool: object) -> None:
        self.pool = pool
