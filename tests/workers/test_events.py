"""Task events flushed once per window on the hub's thread (:mod:`workers.events`): a real
kombu hub runs in a thread of its own, idle in its poll as a worker's is between calls; the
events are sent from other threads (as the reasoning worker's asyncio loop and tracer threads
send them) and from the hub's; a receiver (Flower's kind) reads every event of a batch, in
order, from one broker message on a real Redis."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from celery.events.dispatcher import EventDispatcher
from kombu.asynchronous import Hub

from workers.events import BUFFER_LIMIT, FLUSH_INTERVAL_S, FlushWindow, TaskEventWindows

IDLE_POLL_S = 10.0
"""How long the test hub's poll waits when nothing wakes it (kombu's longest)."""


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    celery = Celery("tests-events", broker=redis_url, set_as_current=False)
    try:
        yield celery
    finally:
        celery.close()


class _RunningHub:
    """A kombu hub in a thread of its own, idle: one reader that never gets data and a timer
    entry :data:`IDLE_POLL_S` away, so that its poll sleeps that long unless woken."""

    def __init__(self) -> None:
        self.hub = Hub()
        self._quiet, self._other_end = socket.socketpair()
        self.hub.add_reader(self._quiet, lambda: None)
        self.hub.call_repeatedly(IDLE_POLL_S, lambda: None)
        self.thread_id: int | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-hub", daemon=True)
        self._thread.start()
        assert self._started.wait(5)
        time.sleep(0.2)  # in its poll

    def _run(self) -> None:
        self.thread_id = threading.get_ident()
        self._started.set()
        self.hub.run_forever()

    def run(self, function: Callable[[], object]) -> None:
        """Run ``function`` on the hub's thread and wait for it (as Celery starts a consumer's
        steps in the thread that then runs the hub)."""
        done = threading.Event()

        def call() -> None:
            try:
                function()
            finally:
                done.set()

        self.hub.call_soon(call)
        assert done.wait(5)

    def stop(self) -> None:
        self.hub.stop()
        self._thread.join(5)
        self.hub.close()
        self._quiet.close()
        self._other_end.close()


@pytest.fixture
def running_hub() -> Iterator[_RunningHub]:
    running = _RunningHub()
    try:
        yield running
    finally:
        running.stop()


class _RecordingDispatcher(EventDispatcher):  # type: ignore[misc]
    """Celery's dispatcher, recording when and in which thread each flush ran."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flushes: list[tuple[float, int]] = []
        self.flushed = threading.Event()

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        self.flushes.append((time.monotonic(), threading.get_ident()))
        super().flush(errors=errors, groups=groups)
        self.flushed.set()


class _Consumer:
    """What :class:`TaskEventWindows` reads of Celery's consumer, as its ``Events`` step leaves
    it: the hub and a dispatcher whose ``on_send_buffered`` asks the hub for a flush."""

    def __init__(self, app: Celery, hub: Hub) -> None:
        self.hub = hub
        self.celery_flushes = 0
        self.event_dispatcher = _RecordingDispatcher(
            app.connection_for_write(),
            hostname="worker@tests",
            buffer_group=["task"],
            on_send_buffered=self._celery_flush_soon,
            app=app,
        )

    def _celery_flush_soon(self) -> None:  # Consumer.on_send_event_buffered
        self.celery_flushes += 1
        self.hub.call_soon(self.event_dispatcher.flush)


@pytest.fixture
def consumer(app: Celery, running_hub: _RunningHub) -> Iterator[_Consumer]:
    consumer = _Consumer(app, running_hub.hub)
    step = TaskEventWindows(consumer)
    running_hub.run(lambda: step.start(consumer))
    try:
        yield consumer
    finally:
        step.shutdown(consumer)
        consumer.event_dispatcher.close()
        consumer.event_dispatcher.connection.close()


class _Receiver:
    """A receiver of the app's events, as Flower's, in a thread of its own: each task event
    with the time it arrived."""

    def __init__(self, app: Celery, expected: int) -> None:
        self.events: list[tuple[dict[str, Any], float]] = []
        self._expected = expected
        self.done = threading.Event()
        self._receivers: list[Any] = []
        ready = threading.Event()

        def receive() -> None:
            with app.connection() as connection:
                receiver = app.events.Receiver(connection, handlers={"*": self._on_event})
                self._receivers.append(receiver)
                ready.set()
                receiver.capture(limit=None, timeout=None, wakeup=False)

        self._thread = threading.Thread(target=receive, daemon=True)
        self._thread.start()
        assert ready.wait(5)
        time.sleep(0.3)  # the receiver subscribes after it built its consumer

    def stop(self) -> None:
        for receiver in self._receivers:
            receiver.should_stop = True  # kombu's ConsumerMixin: checked every second
        self._thread.join(5)

    def _on_event(self, event: dict[str, Any]) -> None:
        if event["type"].startswith("task-"):
            self.events.append((event, time.monotonic()))
            if len(self.events) >= self._expected:
                self.done.set()


def test_the_step_wraps_the_dispatcher_celerys_events_step_built(consumer: _Consumer) -> None:
    dispatcher = consumer.event_dispatcher
    assert dispatcher.buffer_limit == BUFFER_LIMIT
    assert dispatcher.on_send_buffered != consumer._celery_flush_soon


def test_a_burst_from_other_threads_is_one_flush_on_the_hubs_thread_at_the_windows_end(
    app: Celery, running_hub: _RunningHub, consumer: _Consumer
) -> None:
    """Events sent by three threads that are not the hub's (as the reasoning worker's loop and
    tracer threads send them): one flush, on the hub's thread, one window after the first,
    and one broker message that a receiver reads as every event, in order."""
    receiver = _Receiver(app, 30)
    dispatcher = consumer.event_dispatcher
    try:
        started = time.monotonic()
        for kind in ("task-received", "task-started", "task-succeeded"):
            sender = threading.Thread(
                target=lambda kind=kind: [
                    dispatcher.send(kind, uuid=f"id-{n}", name="orga.reason") for n in range(10)
                ]
            )
            sender.start()
            sender.join()
        assert dispatcher.flushes == []  # nothing flushed while the window is open
        assert dispatcher.flushed.wait(5)
        assert receiver.done.wait(10), f"received {len(receiver.events)} of 30 events"
        time.sleep(3 * FLUSH_INTERVAL_S)
    finally:
        receiver.stop()
    assert len(dispatcher.flushes) == 1  # one flush: one broker message carried all 30
    flushed_at, thread = dispatcher.flushes[0]
    assert thread == running_hub.thread_id
    assert FLUSH_INTERVAL_S * 0.9 <= flushed_at - started < FLUSH_INTERVAL_S + 1.0
    assert consumer.celery_flushes == 0  # Celery's flush per event was not asked for
    assert [(e["type"], e["uuid"]) for e, _ in receiver.events] == [
        (kind, f"id-{n}")
        for kind in ("task-received", "task-started", "task-succeeded")
        for n in range(10)
    ]


@pytest.mark.parametrize("from_hub", [False, True], ids=["other-thread", "hub-thread"])
def test_an_idle_hubs_last_event_is_sent_within_the_window(
    app: Celery, running_hub: _RunningHub, consumer: _Consumer, from_hub: bool
) -> None:
    """The hub asleep in a poll of :data:`IDLE_POLL_S` (no heartbeat, nothing to read): a
    lone event, sent from another thread or from the hub's own, reaches a receiver about one
    window later, not when something else wakes the hub (the batching reverted on 2026-12-06
    kept such an event until then)."""
    receiver = _Receiver(app, 1)
    dispatcher = consumer.event_dispatcher
    try:
        sent = time.monotonic()
        if from_hub:
            running_hub.hub.call_soon(
                lambda: dispatcher.send("task-succeeded", uuid="id-1", runtime=0.5)
            )
        else:
            dispatcher.send("task-succeeded", uuid="id-1", runtime=0.5)
        assert receiver.done.wait(IDLE_POLL_S / 2), "the event waited for the hub's poll"
    finally:
        receiver.stop()
    (event, arrived), *_ = receiver.events
    assert event["uuid"] == "id-1"
    assert arrived - sent < FLUSH_INTERVAL_S + 1.0  # the window, and the receiver's way
    assert [thread for _, thread in dispatcher.flushes] == [running_hub.thread_id]


def test_each_window_is_flushed_on_its_own(consumer: _Consumer) -> None:
    """A later event opens another window: its own flush, one window after it."""
    dispatcher = consumer.event_dispatcher
    dispatcher.send("task-received", uuid="id-1", name="orga.reason")
    assert dispatcher.flushed.wait(5)
    dispatcher.flushed.clear()
    time.sleep(2 * FLUSH_INTERVAL_S)
    second = time.monotonic()
    dispatcher.send("task-succeeded", uuid="id-1", runtime=0.5)
    assert dispatcher.flushed.wait(5)
    assert len(dispatcher.flushes) == 2
    assert dispatcher.flushes[1][0] - second >= FLUSH_INTERVAL_S * 0.9


def test_the_consumers_stop_flushes_the_window_and_hands_later_events_to_celery(
    app: Celery, running_hub: _RunningHub
) -> None:
    """A stopping consumer (the step's stop, in the consumer's thread) sends what the window
    holds at once; events sent after it (a pool draining its tasks) are flushed as Celery
    flushes them; a restarted consumer's new dispatcher gets a window of its own."""
    receiver = _Receiver(app, 1)
    consumer = _Consumer(app, running_hub.hub)
    step = TaskEventWindows(consumer)
    running_hub.run(lambda: step.start(consumer))
    dispatcher = consumer.event_dispatcher
    try:
        dispatcher.send("task-started", uuid="id-1", name="orga.reason")
        step.stop(consumer)
        assert receiver.done.wait(5)  # sent by the stop, not by the window
        assert [thread for _, thread in dispatcher.flushes] == [threading.get_ident()]
        dispatcher.send("task-succeeded", uuid="id-1", runtime=0.5)
        assert consumer.celery_flushes == 1
        time.sleep(2 * FLUSH_INTERVAL_S)
        assert len(dispatcher.flushes) == 2  # Celery's, on the hub
        assert dispatcher.flushes[1][1] == running_hub.thread_id

        restarted = _Consumer(app, running_hub.hub)  # Celery's Events step: a new dispatcher
        running_hub.run(lambda: step.start(restarted))
        restarted.event_dispatcher.send("task-received", uuid="id-2", name="orga.reason")
        assert restarted.event_dispatcher.flushed.wait(5)
        assert restarted.celery_flushes == 0
        step.shutdown(restarted)
        restarted.event_dispatcher.close()
        restarted.event_dispatcher.connection.close()
    finally:
        receiver.stop()
        dispatcher.close()
        dispatcher.connection.close()


def test_a_worker_without_an_event_loop_is_left_as_celery_built_it(app: Celery) -> None:
    """No hub (Celery then buffers nothing and gives no ``on_send_buffered``): no window."""

    class NoLoop:
        hub = None
        event_dispatcher = EventDispatcher(app.connection_for_write(), app=app)

    step = TaskEventWindows(NoLoop)
    step.start(NoLoop)
    assert step.window is None
    assert NoLoop.event_dispatcher.on_send_buffered is None
    NoLoop.event_dispatcher.close()
    NoLoop.event_dispatcher.connection.close()


def test_a_window_must_last() -> None:
    with pytest.raises(ValueError, match="more than 0 s, not 0"):
        FlushWindow(Hub(), lambda: None, hub_thread=threading.get_ident(), interval=0)
