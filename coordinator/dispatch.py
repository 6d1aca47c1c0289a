"""Sending work to the Celery workers by task name (the coordinator never imports worker code).

The whole request travels as one JSON string argument; ``argsrepr`` gives Flower a short,
readable summary (task, step, iteration, attempt, tool) instead of a conversation dump.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from shared import keys
from shared.protocol import ReasonRequest, ToolRequest
from shared.settings import OrgaSettings, celery_config

__all__ = ["CeleryDispatcher", "celery_client"]


def celery_client(settings: OrgaSettings, broker_url: str) -> Any:
    """A Celery app configured like the workers', used only to send tasks."""
    app = Celery("orga-coordinator")
    app.conf.update(celery_config(settings, broker_url))
    return app


class CeleryDispatcher:
    """Publishes reasoning iterations and tool calls on their own queues."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def reason(self, request: ReasonRequest) -> None:
        """Queue Reason + Gate of one iteration on the reasoning queue."""
        fence = request.fence
        summary = (
            f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
            f"attempt={fence.attempt} purpose={request.purpose}"
        )
        await self._send(
            keys.reason_task_name, keys.reasoning_queue, request.model_dump_json(), summary
        )

    async def tool(self, request: ToolRequest) -> None:
        """Queue one tool call on the tools queue."""
        fence = request.fence
        summary = (
            f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
            f"attempt={fence.attempt} tool={request.action.name} call={fence.call_id} "
            f"purpose={request.purpose}"
        )
        await self._send(keys.tool_task_name, keys.tools_queue, request.model_dump_json(), summary)

    async def _send(self, name: str, queue: str, payload: str, summary: str) -> None:
        # On the event loop, not in a thread: the send is one LPUSH on the broker's connection
        # pool (~0.35 ms of CPU), the apply that calls it waits for it anyway, and a thread hop
        # costs another ~0.15 ms of CPU in GIL hand-offs and adds a wake-up to every iteration's
        # latency (docs/performance.md). If the broker is unreachable, kombu's publish retries
        # (a few hundred ms at most) hold the loop, whose every other step needs Redis as well.
        self._app.send_task(
            name,
            args=[payload],
            queue=queue,
            argsrepr=f"({summary})",
            kwargsrepr="{}",
        )
