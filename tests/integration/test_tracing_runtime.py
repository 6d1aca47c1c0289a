"""One task is one trace across processes: spans per phase from the coordinator and the workers,
exported by the console exporter that the standard ``OTEL_TRACES_EXPORTER`` selects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orga.embedded_redis import EmbeddedRedis
from shared.tracing import task_trace_id
from tests.integration.harness import Cluster, running_cluster, status_of, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    """A worker and a coordinator that export their spans to standard output."""
    worker = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "test-worker"}
    coordinator = {"OTEL_TRACES_EXPORTER": "console"}
    with running_cluster(private_redis.url, tmp_path, worker, coordinator) as running:
        yield running


def _spans(*logs: Path) -> list[dict[str, Any]]:
    """Every span line the console exporter wrote into the processes' logs."""
    spans = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            start = line.find('{"name"')
            if start >= 0 and '"trace_id"' in line:
                spans.append(json.loads(line[start:]))
    return spans


def test_a_task_is_one_trace_with_a_span_per_phase_across_processes(cluster: Cluster) -> None:
    """Coordinator decide spans parent the workers' reason, gate and act spans: one trace id."""
    client = cluster.client()
    write = {"name": "file_write", "arguments": {"path": "a.txt", "content": "hi"}}
    task_id = client.submit(
        {
            "goal": "write a file",
            "provider": {"kind": "scripted", "replies": [{"tool_calls": [write]}, "done"]},
            "steps": [{"id": "s", "instruction": "write"}],
        }
    )
    wait_until(lambda: status_of(client, task_id) == "completed", timeout_s=60, what="done")
    trace_id = f"0x{task_trace_id(task_id):032x}"

    def ours() -> list[dict[str, Any]]:
        logs = [process.log for process in cluster.processes]
        return [s for s in _spans(*logs) if s["context"]["trace_id"] == trace_id]

    wait_until(lambda: {"orga.act"} <= {s["name"] for s in ours()}, timeout_s=20, what="spans")
    spans = ours()
    names = {s["name"] for s in spans}
    assert {"orga.decide", "orga.reason", "orga.gate", "orga.act"} <= names, names
    by_id = {s["context"]["span_id"]: s for s in spans}
    reason = next(s for s in spans if s["name"] == "orga.reason")
    assert by_id[reason["parent_id"]]["name"] == "orga.decide"
    assert reason["resource"]["attributes"]["service.name"] == "test-worker"
    act = next(s for s in spans if s["name"] == "orga.act")
    assert by_id[act["parent_id"]]["name"] == "orga.reason"  # chained by the reasoning worker
    assert act["attributes"]["orga.task_id"] == task_id


def test_genai_spans_join_the_tasks_trace_across_processes(cluster: Cluster) -> None:
    """On a deployment the workers' ``chat`` and ``execute_tool`` spans and the coordinator's
    ``invoke_agent`` span are in the task's trace: chat under ``orga.reason``, the tool call
    under ``orga.act``; the agent's span covers the task."""
    client = cluster.client()
    write = {"name": "file_write", "arguments": {"path": "b.txt", "content": "hi"}}
    task_id = client.submit(
        {
            "goal": "write another file",
            "agent_id": "scribe",
            "provider": {"kind": "scripted", "replies": [{"tool_calls": [write]}, "done"]},
            "steps": [{"id": "s", "instruction": "write"}],
        }
    )
    wait_until(lambda: status_of(client, task_id) == "completed", timeout_s=60, what="done")
    trace_id = f"0x{task_trace_id(task_id):032x}"

    def ours() -> list[dict[str, Any]]:
        logs = [process.log for process in cluster.processes]
        return [s for s in _spans(*logs) if s["context"]["trace_id"] == trace_id]

    wanted = {"chat scripted", "execute_tool file_write", "invoke_agent scribe"}
    wait_until(lambda: wanted <= {s["name"] for s in ours()}, timeout_s=20, what="genai spans")
    spans = ours()
    by_id = {s["context"]["span_id"]: s for s in spans}
    chats = [s for s in spans if s["name"] == "chat scripted"]
    assert len(chats) == 2
    assert all(by_id[c["parent_id"]]["name"] == "orga.reason" for c in chats)
    assert chats[0]["attributes"]["gen_ai.operation.name"] == "chat"
    assert chats[0]["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert "gen_ai.input.messages" not in chats[0]["attributes"]  # capture is off
    tool = next(s for s in spans if s["name"] == "execute_tool file_write")
    assert by_id[tool["parent_id"]]["name"] == "orga.act"
    assert tool["attributes"]["gen_ai.tool.call.id"]
    agent = next(s for s in spans if s["name"] == "invoke_agent scribe")
    assert agent["attributes"]["orga.status"] == "completed"
    assert agent["start_time"] <= min(c["start_time"] for c in chats)
