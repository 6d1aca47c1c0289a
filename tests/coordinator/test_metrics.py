"""Prometheus metrics: counters from commits, gauges read from a real Redis, the HTTP endpoint."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from redis.asyncio import Redis

from coordinator.machine import MachineSettings, TaskMachine
from coordinator.metrics import CoordinatorMetrics, RedisStateCollector, serve_metrics
from coordinator.state import TaskRecord
from coordinator.store import TaskStore
from shared import keys
from shared.actions import RespondAction
from shared.conversation import ConversationMessage
from shared.inference import Usage
from shared.protocol import ReasonedMessage
from shared.task_spec import parse_task


def _record(task_id: str) -> TaskRecord:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
    return TaskRecord(task_id=task_id, spec=spec, created_at=0.0, updated_at=0.0)


async def _run_one_task(url: str, metrics: CoordinatorMetrics) -> None:
    client = Redis.from_url(url)
    store = TaskStore(client)
    record = _record("m1")
    await store.create(record)
    machine = TaskMachine(record, 1.0, MachineSettings(workspace_root="/ws"))
    effects = machine.start()
    await store.commit(machine.record, effects)
    assert record.awaiting is not None
    answer = ReasonedMessage(
        fence=record.awaiting.fence,
        new_messages=[ConversationMessage.assistant("done")],
        actions=[RespondAction(content="done")],
        terminal_output="done",
        usage=Usage(prompt_tokens=7, completion_tokens=3, total_tokens=10),
    )
    machine = TaskMachine(record, 2.0, MachineSettings(workspace_root="/ws"))
    effects = machine.on_reasoned(answer)
    await store.commit(machine.record, effects)
    metrics.record(machine.record, effects)
    stale = TaskMachine(record, 3.0, MachineSettings(workspace_root="/ws")).on_reasoned(answer)
    assert not stale.changed
    metrics.ignored()
    await client.aclose()


def _value(text: str, name: str, **labels: str) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    wanted = f"{name}{{{label_text}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{wanted} not in metrics:\n{text}")


def test_counters_and_gauges(redis_url: str, redis_client: Any) -> None:
    """A finished task shows in tasks-by-status; its iteration and tokens are counted."""
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url))
    metrics = CoordinatorMetrics(registry)
    asyncio.run(_run_one_task(redis_url, metrics))
    text = generate_latest(registry).decode()
    assert _value(text, "orga_tasks", status="completed") == 1
    assert _value(text, "orga_tasks", status="running") == 0
    assert _value(text, "orga_iterations_total") == 1
    assert _value(text, "orga_tokens_total", kind="prompt") == 7
    assert _value(text, "orga_steps_total", outcome="completed") == 1
    assert _value(text, "orga_observations_total", result="ignored") == 1
    assert _value(text, "orga_escalations_waiting") == 0


def test_observation_lag_and_pending(redis_url: str, redis_client: Any) -> None:
    """Entries not yet read count as lag; read but unacknowledged ones as pending."""

    async def scenario() -> None:
        async with redis_client() as client:
            await client.xgroup_create(
                keys.observations_stream, keys.coordinator_group, mkstream=True
            )
            for index in range(3):
                await client.xadd(keys.observations_stream, {"n": str(index)})
            await client.xreadgroup(
                keys.coordinator_group, "c", {keys.observations_stream: ">"}, count=1
            )

    asyncio.run(scenario())
    registry = CollectorRegistry()
    registry.register(RedisStateCollector(redis_url))
    text = generate_latest(registry).decode()
    assert _value(text, "orga_observation_pending") == 1
    assert _value(text, "orga_observation_lag") == 2


def test_http_endpoint_serves_the_metrics(redis_url: str, redis_client: Any) -> None:
    """``serve_metrics`` answers Prometheus scrapes on its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve_metrics(port, redis_url)
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert response.status_code == 200
    assert "orga_escalations_waiting" in response.text
