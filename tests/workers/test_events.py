"""Task events in batches (:mod:`workers.events`): the worker's loop is asked to flush once per
window, not once per event, and a receiver (Flower's kind) reads every event of a batch, in
order, from one broker message on a real Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from workers.events import FLUSH_INTERVAL_S, BatchedEventDispatcher, BatchedEvents


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    celery = Celery("tests-events", broker=redis_url, events=BatchedEvents, set_as_current=False)
    try:
        yield celery
    finally:
        celery.close()


class _Loop:
    """Stands for the worker's event loop: counts the flushes asked for, and runs them."""

    def __init__(self) -> None:
        self.dispatcher: BatchedEventDispatcher | None = None
        self.asked: list[float] = []
        self.flushed = threading.Event()

    def flush_soon(self) -> None:
        self.asked.append(time.monotonic())
        assert self.dispatcher is not None
        self.dispatcher.flush()
        self.flushed.set()


def _dispatcher(app: Celery, loop: _Loop) -> BatchedEventDispatcher:
    dispatcher = app.events.Dispatcher(
        app.connection_for_write(),
        hostname="worker@tests",
        buffer_group=["task"],
        on_send_buffered=loop.flush_soon,
    )
    assert isinstance(dispatcher, BatchedEventDispatcher)
    loop.dispatcher = dispatcher
    return dispatcher


def test_a_burst_of_events_asks_for_one_flush_after_the_window(app: Celery) -> None:
    loop = _Loop()
    dispatcher = _dispatcher(app, loop)
    try:
        started = time.monotonic()
        for n in range(60):
            dispatcher.send("task-received", uuid=f"id-{n}", name="orga.reason")
        assert loop.asked == []  # nothing flushed while the window is open
        assert loop.flushed.wait(5)
        time.sleep(3 * FLUSH_INTERVAL_S)
        assert len(loop.asked) == 1
        assert loop.asked[0] - started >= FLUSH_INTERVAL_S * 0.9
        # a later event opens another window
        loop.flushed.clear()
        dispatcher.send("task-succeeded", uuid="id-0", runtime=0.5)
        assert loop.flushed.wait(5)
        assert len(loop.asked) == 2
    finally:
        dispatcher.close()


class _Receiver:
    """A receiver of the app's events, as Flower's, in a thread of its own."""

    def __init__(self, app: Celery, expected: int) -> None:
        self.events: list[dict[str, Any]] = []
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
            self.events.append(event)
            if len(self.events) >= self._expected:
                self.done.set()


def test_a_receiver_reads_each_event_of_a_batch_in_order(app: Celery) -> None:
    receiver = _Receiver(app, 30)
    loop = _Loop()
    dispatcher = _dispatcher(app, loop)
    try:
        for n in range(10):
            for kind in ("task-received", "task-started", "task-succeeded"):
                dispatcher.send(kind, uuid=f"id-{n}", name="orga.reason")
        assert receiver.done.wait(10), f"received {len(receiver.events)} of 30 events"
    finally:
        dispatcher.close()
        receiver.stop()
    assert len(loop.asked) == 1  # one flush: one broker message carried all 30
    assert [(e["uuid"], e["type"]) for e in receiver.events] == [
        (f"id-{n}", kind)
        for n in range(10)
        for kind in ("task-received", "task-started", "task-succeeded")
    ]


def test_close_sends_what_the_window_holds_and_stops_the_flusher(app: Celery) -> None:
    receiver = _Receiver(app, 1)
    loop = _Loop()
    dispatcher = _dispatcher(app, loop)
    dispatcher.send("task-started", uuid="id-1", name="orga.reason")
    dispatcher.close()
    assert receiver.done.wait(5)  # sent by close, not by the loop
    receiver.stop()
    time.sleep(2 * FLUSH_INTERVAL_S)
    assert loop.asked == []
    dispatcher.enable()  # Celery may enable a closed dispatcher again
    dispatcher.send("task-started", uuid="id-2", name="orga.reason")
    assert loop.flushed.wait(5)
    dispatcher.close()
