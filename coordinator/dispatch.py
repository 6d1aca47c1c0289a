"""Dispatches as Celery messages, written to the broker by the commit that expects them.

The coordinator never imports worker code and does not go through ``Celery.send_task``: it
builds each message itself (:mod:`shared.celery_wire`, Celery's task message protocol v2 as
kombu's Redis transport stores it), and :meth:`coordinator.store.TaskStore.commit` pushes it in
the same Lua script that saves the state awaiting it. A dispatch is therefore sent exactly once
per committed state: never lost between the commit and the send, never sent for a state that
was not saved. ``send_task`` cost about 0.8 ms of the coordinator's CPU per dispatch and one
blocking round trip on the event loop (docs/performance.md).

The whole request travels as one JSON string argument; ``argsrepr`` gives Flower a short,
readable summary (task, step, iteration, attempt, tool) instead of a conversation dump.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from shared.celery_wire import QueuedMessage, reason_message, tool_message
from shared.protocol import ReasonRequest, ToolRequest

__all__ = ["CeleryDispatcher", "QueuedMessage"]


class CeleryDispatcher:
    """The :class:`~coordinator.transport.Transport` of Celery messages: reasoning iterations on
    ``orga.reasoning``, tool calls on ``orga.tools``."""

    def __init__(self, origin: str | None = None) -> None:
        self._origin = origin or f"orga-coordinator@{socket.gethostname()}"

    def messages(
        self, reasons: Sequence[ReasonRequest], tools: Sequence[ToolRequest]
    ) -> list[QueuedMessage]:
        """Celery messages for ``orga.reason`` and ``orga.tool_call``."""
        out = [reason_message(request, self._origin) for request in reasons]
        out.extend(tool_message(request, self._origin) for request in tools)
        return out
