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

__all__ = ["PUBLISH_SOCKET_TIMEOUT_S", "CeleryDispatcher", "celery_client"]

PUBLISH_SOCKET_TIMEOUT_S = 5.0
"""A publish (or the connection it needs) that takes longer fails instead of waiting forever on
a broker that vanished without closing the connection: the send runs on the event loop."""


def celery_client(settings: OrgaSettings, broker_url: str) -> Any:
    """A Celery app configured like the workers', used only to send tasks."""
    app = Celery("orga-coordinator")
    app.conf.update(celery_config(settings, broker_url))
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "socket_timeout": PUBLISH_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": PUBLISH_SOCKET_TIMEOUT_S,
    }
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
            + (f" (+{len(request.also)} more calls)" if request.also else "")
        )
        await self._send(keys.tool_task_name, keys.tools_queue, request.model_dump_json(), summary)

    async def _send(self, name: str, queue: str, payload: str, summary: str) -> None:
        # On the event loop, not in a thread: the send is one LPUSH on the broker's connection
        # pool (~0.35 ms of CPU), the apply that calls it waits for it anyway, and a thread hop
        # costs another ~0.15 ms of CPU in GIL hand-offs and adds a wake-up to every iteration's
        # latency (docs/performance.md). A broker that is down holds the loop for kombu's publish
        # retries (0.6 s) or PUBLISH_SOCKET_TIMEOUT_S, and every other step needs Redis too.
        self._app.send_task(
            name,
            args=[payload],
            queue=queue,
            argsrepr=f"({summary})",
            kwargsrepr="{}",
        )
