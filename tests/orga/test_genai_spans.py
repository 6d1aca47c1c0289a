"""GenAI spans (OpenTelemetry's semantic conventions) of a whole task, recorded by the SDK's
in-memory exporter: ``chat {model}`` per model call, ``execute_tool {tool}`` per tool call,
``invoke_agent {agent}`` for the task; message contents only when capture is on.

Each case runs in a subprocess: the SDK's tracer provider is process-wide and set once, and
the rest of the suite runs without one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from shared.tracing import task_trace_id

PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from coordinator.machine import MachineSettings
    from orga.inprocess import InProcessDriver
    from shared.genai import capture_content
    from workers.runtime import local_core

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    capture_content(sys.argv[1] == "on")
    task = json.loads(sys.argv[2])
    settings = MachineSettings(workspace_root=sys.argv[3])
    run = asyncio.run(InProcessDriver(local_core(), settings).run(task, task_id="spans-1"))
    spans = [
        {
            "name": s.name,
            "trace_id": s.context.trace_id,
            "attributes": dict(s.attributes or {}),
            "start": s.start_time,
            "end": s.end_time,
        }
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps({"status": run.status.value, "spans": spans}))
    """
)

USAGE = {"prompt_tokens": 1200, "completion_tokens": 300, "total_tokens": 1500}
WRITE = {"name": "file_write", "id": "call-w", "arguments": {"path": "a.txt", "content": "hi"}}
TASK = {
    "goal": "write a file",
    "agent_id": "writer",
    "provider": {
        "kind": "scripted",
        "model": "gpt-4o",
        "replies": [{"tool_calls": [WRITE], "usage": USAGE}, {"text": "written", "usage": USAGE}],
    },
    "steps": [{"id": "s", "instruction": "write a.txt"}],
    "limits": {"max_cost_usd": 1.0},
}


def _probe(tmp_path: Path, capture: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, capture, json.dumps(TASK), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def test_a_task_has_chat_execute_tool_and_invoke_agent_spans(tmp_path: Path) -> None:
    """Two model calls, one tool call, one agent invocation, with the conventions' attributes
    and the call's cost; nothing of the messages without capture."""
    result = _probe(tmp_path, "off")
    assert result["status"] == "completed"
    spans = result["spans"]
    chats = _named(spans, "chat gpt-4o")
    assert len(chats) == 2, [s["name"] for s in spans]
    chat = chats[0]["attributes"]
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.provider.name"] == "scripted"
    assert chat["gen_ai.request.model"] == "gpt-4o"
    assert chat["gen_ai.response.model"] == "scripted"
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (1200, 300)
    assert chat["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert chat["orga.cost_usd"] == pytest.approx(1200 * 2.5e-6 + 300 * 10e-6)  # the table's
    assert "gen_ai.input.messages" not in chat and "gen_ai.output.messages" not in chat
    (tool,) = _named(spans, "execute_tool file_write")
    assert tool["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert tool["attributes"]["gen_ai.tool.name"] == "file_write"
    assert tool["attributes"]["gen_ai.tool.call.id"] == "call-w"
    assert "gen_ai.tool.call.arguments" not in tool["attributes"]
    (agent,) = _named(spans, "invoke_agent writer")
    attributes = agent["attributes"]
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.agent.id"] == "spans-1"
    assert attributes["gen_ai.usage.input_tokens"] == 2400
    assert attributes["orga.cost_usd"] == pytest.approx(2 * 0.006)
    assert agent["start"] <= chats[0]["start"] and agent["end"] >= chats[-1]["end"]
    assert {s["trace_id"] for s in spans} == {task_trace_id("spans-1")}  # one trace


def test_message_contents_only_when_capture_is_on(tmp_path: Path) -> None:
    """With capture on, the prompt, the answer and the tool's arguments and result are there."""
    spans = _probe(tmp_path, "on")["spans"]
    first, last = _named(spans, "chat gpt-4o")
    assert "write a.txt" in first["attributes"]["gen_ai.input.messages"]
    assert "file_write" in first["attributes"]["gen_ai.output.messages"]
    assert "written" in last["attributes"]["gen_ai.output.messages"]
    (tool,) = _named(spans, "execute_tool file_write")
    assert json.loads(tool["attributes"]["gen_ai.tool.call.arguments"])["path"] == "a.txt"
    assert "gen_ai.tool.call.result" in tool["attributes"]
