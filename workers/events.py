"""Celery task events, flushed once per window on the worker's event loop instead of once each.

A worker with an event loop (every ``orga worker``: kombu's hub) buffers its task events
(``task-received``, ``task-started``, ``task-succeeded``...) and, after each one, asks the hub
to flush the buffer "soon": with calls arriving and ending all the time that is one broker
message (a kombu publish and a Redis ``PUBLISH``, about 0.3 ms of the worker's CPU) per event,
three per model call. :class:`TaskEventWindows`, a step of the worker's consumer, makes the
first event of a window schedule one flush :data:`FLUSH_INTERVAL_S` later on the hub's own
timer, and the events buffered meanwhile go with it: one ``task.multi`` message (Celery's own
batch format, which Flower and every event receiver read as the events one by one, in order).

Which thread does what: events are sent by the hub's thread (``task-received``; every event of
a prefork pool's parent), and in the reasoning worker (:class:`workers.pool.LoopPool`)
also by its asyncio loop's thread (``task-started``, the request's accept callback) and its
tracer threads (``task-succeeded``). The first event of a window, sent in the hub's thread, puts
the flush on the hub's timer (``Hub.call_later``) at once; sent in another thread, it hands the
hub one callback that does, with ``Hub.call_soon``, which kombu 5.7 makes safe from any thread
(under its lock, waking the hub's poll through its waker socket). Only the hub's thread touches
its timer, and the flush always runs there, at the window's end, idle worker or not: the hub
computes its poll's timeout from the timer after running the callbacks handed to it. (A
callback handed over in the hub's own thread, while the hub runs earlier ones, would wait for
its next poll, which an idle hub may spend asleep: hence the timer set directly there.)

A batching that was reverted on 2026-12-06 (docs/performance.md, issue 27, item 13) asked for
the flush from a flusher thread of its own; this one has no thread.

What it changes: an event reaches Flower up to :data:`FLUSH_INTERVAL_S` later. When the
consumer stops (a warm shutdown, or a restart after the broker connection was lost), the window
is closed: its events are flushed at once (best effort, as Celery's own flush: what cannot be
published stays in the dispatcher's outbound buffer, which Celery hands to the next dispatcher
when the consumer restarts, and which is lost when the process ends), and events sent after
that (tasks the pool still drains) are flushed as Celery flushes them. Events are for
monitoring only: no guarantee of the runtime rests on them (docs/reliability.md).

The app adds the step to its consumer's blueprint (``app.steps["consumer"]``,
:func:`orga.celery.create_app`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import bootsteps

__all__ = ["BUFFER_LIMIT", "FLUSH_INTERVAL_S", "FlushWindow", "TaskEventWindows"]

log = logging.getLogger("orga.worker.events")

FLUSH_INTERVAL_S = 0.1
"""How long a buffered task event waits for others before their one message is sent."""
BUFFER_LIMIT = 512
"""Events in one buffer that flush it at once, in the thread that sent the last one. Celery's
default, 24, is reached within one window at a few hundred events a second, which would flush
on the reasoning worker's asyncio loop (a blocking broker call there)."""


class FlushWindow:
    """Runs ``flush`` on ``hub``'s thread at most once per ``interval``: the first
    :meth:`request` of a window puts the flush on the hub's timer for the window's end, later
    ones wait for it.

    ``hub_thread`` is the ident of the thread that runs (or will run) the hub: a request made
    there schedules the flush itself; one made in another thread hands the hub a callback that
    does, with ``Hub.call_soon`` (thread-safe in kombu 5.7, and it wakes the hub's poll).
    Handing that callback over from the hub's own thread would not do: kombu runs the
    callbacks handed over while it runs earlier ones only after its next poll, which an idle
    hub may spend asleep. ``fallback`` is what a request calls once the window is closed
    (Celery's own ``on_send_buffered``: a flush at the hub's next turn), or None to drop it.
    """

    def __init__(
        self,
        hub: Any,
        flush: Callable[[], object],
        *,
        hub_thread: int,
        interval: float = FLUSH_INTERVAL_S,
        fallback: Callable[[], object] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"a flush window must last more than 0 s, not {interval!r}")
        self._hub = hub
        self._hub_thread = hub_thread
        self._flush = flush
        self._interval = interval
        self._fallback = fallback
        self._lock = threading.Lock()
        self._open = False  # a window is open: its flush is scheduled or about to be
        self._closed = False
        self._entry: Any = None  # the hub timer's entry of the open window

    @property
    def interval(self) -> float:
        """The window's length in seconds."""
        return self._interval

    def request(self) -> None:
        """An event was buffered (in any thread): open a window unless one is open."""
        with self._lock:
            closed = self._closed
            if not closed:
                if self._open:
                    return
                self._open = True
        if closed:
            if self._fallback is not None:
                self._fallback()
        elif threading.get_ident() == self._hub_thread:
            self._arm()
        else:
            self._hub.call_soon(self._arm)  # thread-safe: kombu 5.7's lock and waker

    def _arm(self) -> None:
        """On the hub's thread: the window's flush on the hub's timer."""
        with self._lock:
            if self._closed or not self._open or self._entry is not None:
                return
            self._entry = self._hub.call_later(self._interval, self._fire)

    def _fire(self) -> None:
        """On the hub's thread, at the window's end: flush (events buffered from now on open
        the next window)."""
        with self._lock:
            self._open = False
            self._entry = None
            if self._closed:
                return
        self._flush()

    def close(self) -> None:
        """Stop scheduling flushes (the open window's timer entry is cancelled) and flush what
        the buffer holds, in the caller's thread; later requests go to ``fallback``."""
        with self._lock:
            self._closed = True
            self._open = False
            entry, self._entry = self._entry, None
        if entry is not None:
            entry.cancel()
        try:
            self._flush()
        except Exception as exc:  # as Celery's own flush at a close: never raised
            log.debug("events.final_flush_failed", extra={"error": str(exc)[:300]})


class TaskEventWindows(bootsteps.StartStopStep):  # type: ignore[misc]
    """A step of the worker's consumer: the task events its dispatcher buffers are flushed once
    per :data:`FLUSH_INTERVAL_S` window on the hub's thread (:class:`FlushWindow`), not once
    per event.

    It starts after Celery's ``Events`` step, which builds a new dispatcher each time the
    consumer starts; a worker without an event loop (its dispatcher buffers nothing) or
    without events is left as it is.
    """

    label = "task event windows"
    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.window: FlushWindow | None = None

    def start(self, parent: Any) -> None:
        """Wrap the dispatcher that Celery's ``Events`` step has just built. The consumer's
        steps start one after the other in one thread, the event loop's last (Celery's
        ``Evloop`` step), so this runs in the thread that then runs the hub."""
        self._close()
        dispatcher = getattr(parent, "event_dispatcher", None)
        hub = getattr(parent, "hub", None)
        celery_flush_soon = getattr(dispatcher, "on_send_buffered", None)
        if dispatcher is None or hub is None or celery_flush_soon is None:
            return
        self.window = FlushWindow(
            hub, dispatcher.flush, hub_thread=threading.get_ident(), fallback=celery_flush_soon
        )
        dispatcher.buffer_limit = BUFFER_LIMIT
        dispatcher.on_send_buffered = self.window.request

    def stop(self, parent: Any) -> None:
        """The consumer stops or restarts: flush what the window holds."""
        self._close()

    def shutdown(self, parent: Any) -> None:
        """The consumer shuts down (before Celery's ``Events`` step closes the dispatcher)."""
        self._close()

    def _close(self) -> None:
        window, self.window = self.window, None
        if window is not None:
            window.close()
