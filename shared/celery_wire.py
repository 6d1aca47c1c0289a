"""Celery task messages as kombu's Redis transport stores them: a pure function, no Celery.

The coordinator (its dispatches, pushed by its commit script) and the reasoning workers (the
tool calls they send straight to the tool workers, pushed with their observation) write these
on the broker themselves, so that a dispatch goes out in the same atomic Redis operation as the
state or observation that accounts for it. Headers and body follow Celery's task message
protocol v2; the envelope (base64 body, ``delivery_info``, a unique ``delivery_tag``) is
kombu's virtual transport's; priority 0 is the list named after the queue itself.
``tests/coordinator/test_dispatch.py`` compares these messages with what ``Celery.send_task``
writes for the installed Celery and kombu, and has kombu read one back. Since the layout is
theirs, every process that writes or reads it checks at start-up that the installed versions
are ones that layout was checked against (:func:`check_versions`).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson

from shared import ids, keys
from shared.errors import ConfigError
from shared.protocol import ReasonRequest, ToolRequest

__all__ = [
    "SUPPORTED",
    "QueuedMessage",
    "celery_message",
    "check_versions",
    "reason_message",
    "tool_message",
]

SUPPORTED: dict[str, tuple[tuple[int, int], int]] = {"celery": ((5, 3), 5), "kombu": ((5, 3), 5)}
"""Per package: the oldest (major, minor) whose message layout this module writes, and the
major version it is checked against (a new major may change the layout)."""


def check_versions(installed: Callable[[str], str] = version) -> dict[str, str]:
    """The installed Celery and kombu versions; a ConfigError naming them when this module's
    message layout was not checked against them."""
    found: dict[str, str] = {}
    for package, (oldest, major) in SUPPORTED.items():
        try:
            text = installed(package)
        except PackageNotFoundError as exc:
            raise ConfigError(f"{package} is not installed; install orga-queue's dependencies "
                              "(pip install -e .)") from exc  # fmt: skip
        numbers = tuple(int(n) for n in re.findall(r"\d+", text)[:2])  # 5.5rc1 is (5, 5)
        if len(numbers) < 2 or numbers < oldest or numbers[0] != major:
            raise ConfigError(
                f"{package} {text} is installed, but orga-queue writes {package}'s Redis "
                f"messages itself and was checked against {package} "
                f"{oldest[0]}.{oldest[1]} to {major}.x; install a {package} {major}.x "
                f"(>= {oldest[0]}.{oldest[1]})"
            )
        found[package] = text
    return found


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """One broker message: ``body`` is pushed (LPUSH) on the Redis list ``queue``."""

    queue: str
    body: str
    task_id: str


def reason_message(request: ReasonRequest, origin: str) -> QueuedMessage:
    """The ``orga.reason`` message of one reasoning iteration, on ``orga.reasoning``."""
    fence = request.fence
    summary = (
        f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
        f"attempt={fence.attempt} purpose={request.purpose}"
    )
    shadow = f"reason {fence.task_id} {fence.step_id} #{fence.iteration} {request.purpose}"
    return celery_message(
        keys.reason_task_name,
        keys.reasoning_queue,
        request.model_dump_json(),
        summary,
        origin,
        shadow=shadow,
    )


def tool_message(request: ToolRequest, origin: str) -> QueuedMessage:
    """The ``orga.tool_call`` message of a tool call (and its ``also`` calls) on ``orga.tools``."""
    fence = request.fence
    summary = (
        f"task={fence.task_id} step={fence.step_id} iteration={fence.iteration} "
        f"attempt={fence.attempt} tool={request.action.name} call={fence.call_id} "
        f"purpose={request.purpose}"
        + (f" (+{len(request.also)} more calls)" if request.also else "")
    )
    shadow = (
        f"{request.purpose} {fence.task_id} {fence.step_id} #{fence.iteration} "
        f"{request.action.name}" + (f" +{len(request.also)}" if request.also else "")
    )
    return celery_message(
        keys.tool_task_name,
        keys.tools_queue,
        request.model_dump_json(),
        summary,
        origin,
        shadow=shadow,
    )


def celery_message(
    name: str, queue: str, payload: str, summary: str, origin: str, *, shadow: str | None = None
) -> QueuedMessage:
    """Task ``name`` with the single argument ``payload``; ``summary`` is Flower's ``argsrepr``
    and ``shadow`` the name Flower and the worker's logs show for it (task, step, iteration,
    purpose) instead of the bare task name."""
    task_id = str(ids.uuid4())
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
        "shadow": shadow,
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
        "origin": origin,
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    envelope = {
        "body": base64.b64encode(orjson.dumps(body)).decode("ascii"),
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
            "delivery_tag": str(ids.uuid4()),
        },
    }
    return QueuedMessage(queue=queue, body=orjson.dumps(envelope).decode(), task_id=task_id)
