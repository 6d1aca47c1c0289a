"""Celery task events, sent in batches: one broker message per window instead of one per event.

A worker with an event loop (every ``orga worker``) buffers its task events (``task-received``,
``task-started``, ``task-succeeded``...) and asks its loop to flush them "soon" after each one;
with calls arriving and ending all the time that is one flush, so one broker message (a kombu
publish and a Redis ``PUBLISH``, about 0.3 ms of the worker's CPU), per event: three per model
call. :class:`BatchedEventDispatcher` asks for that flush once per :data:`FLUSH_INTERVAL_S`
instead, so one message carries every event of the window (Celery's own ``task.multi``
batch, which Flower and every event receiver read as the events one by one, in order).

What it changes: an event reaches Flower up to :data:`FLUSH_INTERVAL_S` later. A worker that
stops sends what its window holds when Celery closes the dispatcher, as Celery's own flush does
(best effort: what cannot be published stays in the dispatcher's outbound buffer, which Celery
hands to the next dispatcher when the consumer restarts and which is lost when the process
ends). Events are for monitoring only: no guarantee of the runtime rests on them
(docs/reliability.md).

The app selects it through Celery's public ``events`` argument (:class:`BatchedEvents`,
``Celery(..., events="workers.events:BatchedEvents")``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher

__all__ = ["BUFFER_LIMIT", "FLUSH_INTERVAL_S", "BatchedEventDispatcher", "BatchedEvents"]

log = logging.getLogger("orga.worker.events")

FLUSH_INTERVAL_S = 0.1
"""How long a buffered task event waits for others before its batch is flushed."""
BUFFER_LIMIT = 512
"""Events in one buffer that flush it at once, in the thread that sent the last one (Celery's
default, 24, is reached within one window at a few hundred events a second, which would flush
on the reasoning worker's event loop: a blocking broker call there)."""


class BatchedEventDispatcher(EventDispatcher):  # type: ignore[misc]
    """Celery's event dispatcher, whose buffered events are flushed once per window.

    Celery hands the worker's dispatcher ``on_send_buffered`` (schedules a flush on the
    worker's event loop); this dispatcher calls it at most once per :data:`FLUSH_INTERVAL_S`,
    from a thread of its own, started with the first buffered event. Everything else is
    Celery's: the buffer, the flush, its lock, the message.
    """

    def __init__(
        self,
        *args: Any,
        on_send_buffered: Callable[[], object] | None = None,
        buffer_limit: int = BUFFER_LIMIT,
        **kwargs: Any,
    ) -> None:
        self._window = threading.Condition()  # before Celery's __init__, which enables
        self._due = False
        self._stopped = False
        self._flusher: threading.Thread | None = None
        self._flush_soon: Callable[[], object] | None = None
        super().__init__(*args, buffer_limit=buffer_limit, **kwargs)
        self._flush_soon = on_send_buffered
        self.on_send_buffered = self._flush_later if on_send_buffered is not None else None

    def _flush_later(self) -> None:
        """A buffered event: open a window if none is open (the flusher asks for the flush
        when it ends)."""
        with self._window:
            if self._due or self._stopped:
                return
            self._due = True
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._run, name="orga-event-flusher", daemon=True
                )
                self._flusher.start()
            self._window.notify()

    def _run(self) -> None:
        while self._window_ended():
            assert self._flush_soon is not None
            self._flush_soon()

    def _window_ended(self) -> bool:
        """Wait for a window to open, then for it to end: True, or False once closed."""
        with self._window:
            while not self._due and not self._stopped:
                self._window.wait()
            if not self._stopped:
                self._window.wait(FLUSH_INTERVAL_S)  # only close() wakes it early
            self._due = False
            return not self._stopped

    def enable(self) -> None:
        """Enable (again, after :meth:`close`): buffered events are flushed per window."""
        with self._window:
            self._stopped = False
            if self._flusher is not None and not self._flusher.is_alive():
                self._flusher = None  # it saw the close: the next event starts another
        super().enable()

    def close(self) -> None:
        """Stop the flusher, send what the window holds (best effort: kombu opens the
        connection again if Celery closed it first), and close."""
        with self._window:
            self._stopped = True
            self._due = False  # what the window holds is flushed below
            self._window.notify_all()
        if self._flush_soon is not None:
            try:
                self.flush()
            except Exception as exc:  # as Celery's own flush, never raised at a close
                log.debug("events.final_flush_failed", extra={"error": str(exc)[:300]})
        super().close()


class BatchedEvents(Events):  # type: ignore[misc]
    """Celery's events of an app, with :class:`BatchedEventDispatcher` as its dispatcher."""

    dispatcher_cls = "workers.events:BatchedEventDispatcher"
