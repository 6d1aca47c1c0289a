"""Dispatches as Celery messages, written to the broker by the commit that expects them.

The coordinator never imports worker code and does not go through ``Celery.send_task``: it
builds each message itself, in Celery's task message protocol v2 as kombu's Redis transport
stores it (a JSON envelope pushed on the list named after the queue), and
:meth:`coordinator.store.TaskStore.commit` pushes it in the same Lua script that saves the state
awaiting it. A dispatch is therefore sent exactly once per committed state: never lost between
the commit and the send, never sent for a state that was not saved. ``send_task`` cost about
0.8 ms of the coordinator's CPU per dispatch and one blocking round trip on the event loop
(docs/performance.md).

The whole request travels as one JSON string argument; ``argsrepr`` gives Flower a short,
readable summary (task, step, iteration, attempt, tool) instead of a conversation dump.
``tests/coordinator/test_dispatch.py`` compares these messages with what ``send_task`` writes
for the installed Celery and kombu, so a change of their format fails a test.
"""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared import keys
from shared.protocol import ReasonRequest, ToolRequest

__all__ = ["CeleryDispatcher", "Dispatcher", "QueuedMessage"]


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """One broker message: ``body`` is pushed (LPUSH) on the Redis list ``queue``."""

    queue: str
    body: str
    task_id: str


class Dispatcher(Protocol):
    """Turns the dispatches of a commit into broker messages (Celery's in production)."""

    def messages(
        self, reasons: Sequence[ReasonRequest], tools: Sequence[ToolRequest]
    ) -> list[QueuedMessage]:
        """The messages that send these requests, in order."""
        ...


class CeleryDispatcher:
    """Reasoning iterations on ``orga.reasoning``, tool calls on ``orga.tools``."""

    def __init__(self, origin: str | None = None) -> None:
        self._origin = origin or f"orga-coordinator@{socket.gethostname()}"

    def messages(
        self, reasons: Sequence[ReasonRequest], tools: Sequence[ToolRequest]
    ) -> list[QueuedMessage]:
        """Celery messages for ``orga.reason`` and ``orga.tool_call``."""
        out = [self.reason(request) for request in reasons]
        out.extend(self.tool(request) for request in tools)
        return out

    def reason(self, request: ReasonRequest) -> QueuedMessage:
        """The message of one reasoning iteration (Reason + Gate, and Act when inline)."""
        fence = request.fence
        summary = (
            f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
            f"attempt={fence.attempt} purpose={request.purpose}"
        )
        return self.celery_message(
            keys.reason_task_name, keys.reasoning_queue, request.model_dump_json(), summary
        )

    def tool(self, request: ToolRequest) -> QueuedMessage:
        """The message of one tool call (and the calls batched with it in ``also``)."""
        fence = request.fence
        summary = (
            f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
            f"attempt={fence.attempt} tool={request.action.name} call={fence.call_id} "
            f"purpose={request.purpose}"
            + (f" (+{len(request.also)} more calls)" if request.also else "")
        )
        return self.celery_message(
            keys.tool_task_name, keys.tools_queue, request.model_dump_json(), summary
        )

    def celery_message(self, name: str, queue: str, payload: str, summary: str) -> QueuedMessage:
        """Task ``name`` with the single argument ``payload``, as kombu's Redis transport stores it.

        Headers and body follow Celery's message protocol v2; the envelope (base64 body,
        ``delivery_info``, a unique ``delivery_tag``) is kombu's virtual transport's. Priority 0
        is the list named after the queue itself.
        """
        task_id = str(uuid.uuid4())
        argsrepr = f"({summary})"
        body: list[Any] = [
            [payload],
            {},
            {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
        ]
        headers: dict[str, Any] = {
            "lang": "py",
            "task": name,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": argsrepr,
            "kwargsrepr": "{}",
            "origin": self._origin,
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        envelope = {
            "body": base64.b64encode(json.dumps(body).encode()).decode("ascii"),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "argsrepr": argsrepr,
                "kwargsrepr": "{}",
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        return QueuedMessage(queue=queue, body=json.dumps(envelope), task_id=task_id)
