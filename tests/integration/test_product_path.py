"""The loop's features on the path users deploy, tried as a user would: ``orga run`` (the
installed entry point, the embedded runtime: a private Redis, real Celery workers, the
coordinator) against a local OpenAI-compatible model that records every request.

One run: the task seeds conventions and the model recalls them by directory; a small
``context_token_budget`` over a long run never drops the system prompt, the goal or the step's
instruction from a request; the console exporter that ``OTEL_TRACES_EXPORTER`` selects prints
the coordinator's and the workers' spans.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import (
    REPO,
    clean_env,
)

pytestmark = pytest.mark.integration

ORGA = Path(sys.executable).with_name("orga")
SYSTEM = "You are the house-style refactoring agent."
GOAL = "Bring src/api/handlers to the house style."
STEP = "Recall the conventions of src/api/handlers, read the big file, then answer."
READS = 12


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "c", "object": "chat.completion", "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }  # fmt: skip


def _call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {"id": f"call_{n}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
    return _completion({"role": "assistant", "content": None, "tool_calls": [call]})


def _task(tmp_path: Path, base_url: str) -> Path:
    workspace = tmp_path / "template"
    (workspace / "src" / "api" / "handlers").mkdir(parents=True)
    # Each read adds about 900 tokens: far over the budget after two of them.
    (workspace / "big.txt").write_text("lorem ipsum dolor sit amet " * 110)
    task = {
        "goal": GOAL,
        "system_prompt": SYSTEM,
        "agent_id": "house-style",
        "workspace_template": str(workspace),
        "provider": {"kind": "openai", "base_url": base_url, "model": "gpt-test"},
        "knowledge": {
            "conventions": [
                {"language": "python", "directory": "src/api", "content": "return early"},
                {"language": "python", "content": "type-hint public functions"},
            ]
        },
        "limits": {"context_token_budget": 1500, "max_iterations": READS + 5},
        "stagnation": {"enabled": False},
        "steps": [{"id": "style", "instruction": STEP}],
    }
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


def test_orga_run_recalls_conventions_keeps_the_task_and_exports_spans(tmp_path: Path) -> None:
    """Recall by directory answers the seeded conventions; every request keeps the task."""
    home = tmp_path / "home"
    env = clean_env(("ORGA_", "OTEL_"))
    env.update(
        ORGA_HOME=str(home), ORGA_WORKSPACE_ROOT=str(tmp_path / "workspaces"),
        ORGA_ALLOW_TASK_BASE_URL="true", OTEL_TRACES_EXPORTER="console",
    )  # fmt: skip
    with FakeOpenAIServer() as model:
        recall = {"query": "python", "directory": "src/api/handlers", "scope": "conventions"}
        model.respond_json(_call(0, "recall_knowledge", recall))
        for n in range(1, READS + 1):
            model.respond_json(_call(n, "file_read", {"path": "big.txt"}))
        model.respond_json(_completion({"role": "assistant", "content": "styled"}))
        ran = subprocess.run(
            [str(ORGA), "run", str(_task(tmp_path, model.base_url)), "--json"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
        )  # fmt: skip
        requests = [r.body for r in model.requests]
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"
    assert len(requests) == READS + 2
    for number, body in enumerate(requests):
        texts = [m.get("content") or "" for m in body["messages"]]
        assert body["messages"][0] == {"role": "system", "content": SYSTEM}, number
        assert f"Goal: {GOAL}" in texts, (number, texts)
        assert any(STEP in t for t in texts), (number, texts)
    tool_results = [m["content"] for m in requests[1]["messages"] if m["role"] == "tool"]
    assert "return early" in tool_results[0] and "type-hint" in tool_results[0]
    assert tool_results[0].index("return early") < tool_results[0].index("type-hint")
    assert any("[KNOWLEDGE_CONTEXT]" in (m.get("content") or "") for m in requests[1]["messages"])
    compacted = [len(r["messages"]) for r in requests]
    assert max(compacted) < READS, compacted  # the budget dropped old reads
    coordinator_spans = [json.loads(s) for s in ran.stderr.splitlines() if '"trace_id"' in s]
    assert {"orga.decide"} <= {s["name"] for s in coordinator_spans}
    worker_log = (home / "worker.log").read_text()
    assert '"name": "orga.reason"' in worker_log and '"name": "orga.act"' in worker_log
