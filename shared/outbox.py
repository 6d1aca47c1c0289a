"""Dispatches as outbox entries: what a commit appends to ``orga:outbox`` for a relay to send.

A dispatch is written to the outbox stream (:func:`shared.keys.outbox_stream`) in the same
atomic Redis operation as the state or observation that accounts for it: the coordinator's
commit script, a reasoning worker's publish of the tool calls it chains. A relay in each
coordinator (:mod:`coordinator.relay`) then sends it through Celery's own API and removes it.
No broker message is built here: an entry holds what ``Celery.send_task`` needs (the task
name, the queue, the one JSON argument, the text Flower shows) and the Celery task id, fixed
when the entry is written so that a dispatch sent twice (a relay killed between the send and
the removal) carries the same id both times. Pure: no Celery, no Redis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared import ids, keys
from shared.errors import OrgaError
from shared.protocol import ReasonRequest, ToolRequest

__all__ = [
    "FIELDS",
    "OutboxEntry",
    "OutboxEntryError",
    "dispatch_entries",
    "reason_entry",
    "tool_entry",
]

FIELDS = ("id", "task", "queue", "argsrepr", "shadow", "payload")
"""The fields of an outbox entry, in the order they are written."""


class OutboxEntryError(OrgaError):
    """An outbox entry lacks a field a relay needs to send it."""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One dispatch: Celery task ``task`` with the single argument ``payload`` on ``queue``.

    ``id`` is the Celery task id; ``argsrepr`` is what Flower and ``celery events`` show
    instead of the payload, ``shadow`` the name they show for the task (task, step,
    iteration, purpose) instead of the bare task name.
    """

    id: str
    task: str
    queue: str
    argsrepr: str
    shadow: str
    payload: str

    def fields(self) -> dict[str, str]:
        """The stream entry's fields (``XADD``)."""
        return {name: getattr(self, name) for name in FIELDS}

    def head(self) -> list[str]:
        """Every field but ``payload``, flattened (name, value, ...): what a commit script
        receives in its JSON argument, the payload going apart as a script argument."""
        return [part for name in FIELDS[:-1] for part in (name, getattr(self, name))]

    @classmethod
    def from_fields(cls, entry_id: str, fields: Mapping[Any, Any]) -> OutboxEntry:
        """The entry ``entry_id`` as read from the stream (bytes or text)."""
        text = {_text(k): _text(v) for k, v in fields.items()}
        missing = [name for name in FIELDS if name not in text]
        if missing:
            raise OutboxEntryError(
                f"outbox entry {entry_id} lacks {', '.join(missing)} (has {sorted(text)}); "
                "entries are written by the commit script and the workers' publish only"
            )
        return cls(**{name: text[name] for name in FIELDS})


def reason_entry(request: ReasonRequest) -> OutboxEntry:
    """The ``orga.reason`` dispatch of one reasoning iteration, on ``orga.reasoning``."""
    fence = request.fence
    summary = (
        f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
        f"attempt={fence.attempt} purpose={request.purpose}"
    )
    shadow = f"reason {fence.task_id} {fence.step_id} #{fence.iteration} {request.purpose}"
    return OutboxEntry(
        id=str(ids.uuid4()),
        task=keys.reason_task_name,
        queue=keys.reasoning_queue,
        argsrepr=f"({summary})",
        shadow=shadow,
        payload=request.model_dump_json(),
    )


def tool_entry(request: ToolRequest) -> OutboxEntry:
    """The ``orga.tool_call`` dispatch of a tool call (and its ``also`` calls) on
    ``orga.tools``."""
    fence = request.fence
    more = f" (+{len(request.also)} more calls)" if request.also else ""
    summary = (
        f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
        f"attempt={fence.attempt} tool={request.action.name} call={fence.call_id} "
        f"purpose={request.purpose}{more}"
    )
    shadow = (
        f"{request.purpose} {fence.task_id} {fence.step_id} #{fence.iteration} "
        f"{request.action.name}" + (f" +{len(request.also)}" if request.also else "")
    )
    return OutboxEntry(
        id=str(ids.uuid4()),
        task=keys.tool_task_name,
        queue=keys.tools_queue,
        argsrepr=f"({summary})",
        shadow=shadow,
        payload=request.model_dump_json(),
    )


def dispatch_entries(
    reasons: Sequence[ReasonRequest], tools: Sequence[ToolRequest]
) -> list[OutboxEntry]:
    """The outbox entries of a commit's dispatches, in order: reasoning, then tool calls."""
    return [*map(reason_entry, reasons), *map(tool_entry, tools)]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
