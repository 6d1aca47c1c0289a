"""The transport seam: how the dispatches of a commit reach the workers.

The coordinator decides; moving its dispatches to the workers' queues is the transport's job,
behind this one Protocol, as httpx keeps every transport behind ``BaseTransport``: the
coordinator (:class:`coordinator.service.Coordinator`, its ``dispatcher``) knows
:class:`Transport` only, and a test gives it a transport of its own.

The one implementation today is :class:`coordinator.dispatch.CeleryDispatcher`: Celery
messages in kombu's Redis layout (:mod:`shared.celery_wire`), which the commit script of
:meth:`coordinator.store.TaskStore.commit` pushes with the state that awaits them, so a
dispatch is sent exactly once per committed state. The workers' side of the same transport is
:mod:`workers.broker` (the kombu transport a worker consumes with). Inside the coordinator,
only the transport modules (this one and :mod:`coordinator.dispatch`) may import Celery or
kombu (``tests/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from shared.celery_wire import QueuedMessage
from shared.protocol import ReasonRequest, ToolRequest

__all__ = ["QueuedMessage", "Transport"]


@runtime_checkable
class Transport(Protocol):
    """Turns the dispatches of one commit into the broker messages that commit writes."""

    def messages(
        self, reasons: Sequence[ReasonRequest], tools: Sequence[ToolRequest]
    ) -> list[QueuedMessage]:
        """The messages that send these requests, in order."""
        ...
