"""The transport seam: how the dispatches of a commit reach the workers.

The coordinator decides; moving its dispatches to the workers' queues is the transport's job,
behind this one-method Protocol, as httpx keeps every transport behind ``BaseTransport``. A
commit appends its dispatches to the outbox stream (:mod:`shared.outbox`) atomically with the
state that awaits them; the relay (:class:`coordinator.relay.OutboxRelay`) reads them and hands
each batch to a :class:`Transport`, which sends them to the task queues. The coordinator and
the relay know :class:`Transport` only (``Coordinator.publisher``); a test gives them a
transport of its own.

The one implementation today is :class:`coordinator.relay.CeleryPublisher`:
``Celery.send_task`` over the configured broker (Redis, or RabbitMQ with ``ORGA_BROKER_URL``).
Inside the coordinator only the transport modules (this one and :mod:`coordinator.relay`) may
import Celery or kombu (``tests/test_layers.py``).

How deep the task queues are is the broker's to say too: a transport that can tell implements
:class:`QueueDepths` (``CeleryPublisher`` does on a broker of its own, RabbitMQ through a
passive ``queue_declare``), and the coordinator's queue gauge asks it instead of reading the
queues' lists on the state Redis, which only the Redis broker keeps there.

When the broker is the state Redis itself, its task queues are lists beside the state: a commit
script can push a dispatch onto its queue in the same atomic step as the state that awaits it,
and the outbox (an entry written, relayed, then removed) has nothing left to do. A transport
that can say what to push implements :class:`InlineQueues`; the coordinator's store then
writes dispatches there instead of to the commits' outbox (:class:`coordinator.store.TaskStore`,
``inline``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from shared.errors import OrgaError
from shared.outbox import OutboxEntry

__all__ = ["InlineQueues", "OutboxEntry", "PublishError", "QueueDepths", "Transport"]


class PublishError(OrgaError):
    """A send to the broker failed; ``sent`` entries of the batch (the first ones) went out."""

    def __init__(self, message: str, sent: int) -> None:
        super().__init__(message)
        self.sent = sent


@runtime_checkable
class Transport(Protocol):
    """Sends outbox entries to the task queues (blocking; called by the relay)."""

    def publish(self, entries: Sequence[OutboxEntry]) -> None:
        """Send ``entries`` in order; on a failure raise :class:`PublishError` saying how many
        of the first ones were sent."""
        ...


@runtime_checkable
class QueueDepths(Protocol):
    """Reads how many messages wait in the task queues, on the broker itself."""

    def queue_depths(self, queues: Sequence[str]) -> Mapping[str, int] | None:
        """Messages ready in each of ``queues`` (blocking; a queue not declared yet: 0); None
        when the broker is the state Redis, whose lists the caller reads itself."""
        ...


@runtime_checkable
class InlineQueues(Transport, Protocol):
    """A transport to a broker that is the state Redis: the message of each dispatch, for a
    commit script to push onto its queue's list itself (no outbox entry, no relay, no second
    send)."""

    @property
    def inline(self) -> bool:
        """Whether dispatches may go inline: the broker is the state Redis, and nothing that a
        send through the broker's client would add to a message (or that would hear of it: a
        receiver of its publish signals) is configured."""
        ...

    def inline_messages(self, entries: Sequence[OutboxEntry]) -> list[tuple[str, bytes]]:
        """For each entry, in order, the broker's list to push it on (``LPUSH``) and the
        message's bytes: what the broker's own publish of it would push."""
        ...
