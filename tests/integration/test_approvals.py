"""Approval of one call on a deployment: a real Redis, a Celery worker and coordinator processes,
and a model behind the fake OpenAI server (the requests it records are what the model read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orga.embedded_redis import EmbeddedRedis
from shared.events import CallDecided, CallHeld
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import Cluster, status_of, wait_until

pytestmark = pytest.mark.integration

PUSH = {"command": "git push origin main"}
SLOW = {"command": "sleep 1 && echo slow > slow.txt"}
REJECTION = "do not push main; open a pull request instead"


def _task() -> dict[str, Any]:
    return {
        "goal": "ship the fix",
        "provider": {"kind": "openai", "model": "gpt-test"},
        "steps": [{"id": "ship", "instruction": "push the branch"}],
        "policy": {"require_approval": ["run_command:git push*"]},
    }


def test_held_call_waits_alone_survives_a_restart_and_its_rejection_reaches_the_model(
    private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """The push is held while the turn's other call runs and answers; the held call and its
    review outlive the coordinator that opened them; the reviewer's rejection is the push's
    tool result in the model's next request, and the task completes."""
    with FakeOpenAIServer(api_key="sk-right") as model:
        model.respond_tool_calls([("c1", "run_command", PUSH), ("c2", "run_command", SLOW)])
        model.respond_text("opened a pull request instead")
        cluster = Cluster(private_redis.url, tmp_path)
        try:
            cluster.worker(
                ORGA_PROVIDER="openai", ORGA_BASE_URL=model.base_url, ORGA_API_KEY="sk-right"
            )
            first = cluster.coordinator()
            client = cluster.client()
            task_id = client.submit(_task())
            wait_until(
                lambda: status_of(client, task_id) == "awaiting_review", what="the held call"
            )
            review_id = str(client.status(task_id)["review_id"])
            item = client.review(review_id)
            assert item.source == "call" and item.call is not None
            assert item.snapshot["call"]["arguments"] == PUSH

            def other_call_answered() -> bool:
                awaiting = client.record(task_id).awaiting
                return awaiting is not None and "c2" in awaiting.results

            wait_until(other_call_answered, what="the turn's other call, run meanwhile")
            workspace = Path(client.record(task_id).workspace or "")
            assert (workspace / "slow.txt").read_text() == "slow\n"
            assert status_of(client, task_id) == "awaiting_review"

            first.stop()  # a restart while the call is held
            cluster.coordinator(name="c2")
            assert review_id in [r.review_id for r in client.reviews()]
            client.decide(review_id, "reject", REJECTION, by="ann")
            result = client.wait(task_id, timeout_s=60)
            journal = client.journal(task_id)
        finally:
            cluster.stop()
    assert result["status"] == "completed", cluster.logs()
    messages = model.requests[-1].body["messages"]
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    assert results["c1"] == f"[Error] [Rejected by reviewer ann] {REJECTION}"
    assert not results["c2"].startswith("[Error]"), results["c2"]
    held = [e.event for e in journal if isinstance(e.event, CallHeld)]
    decided = [e.event for e in journal if isinstance(e.event, CallDecided)]
    assert [(h.call_id, h.tool) for h in held] == [("c1", "run_command")]
    assert [(d.decision, d.decided_by, d.message) for d in decided] == [
        ("reject", "ann", REJECTION)
    ]
    assert len(model.requests) == 2
