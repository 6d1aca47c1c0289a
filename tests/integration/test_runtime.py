"""The distributed runtime with real parts: Redis, Celery worker processes, the coordinator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.state import TaskStatus
from tests.integration.harness import (
    REPO,
    Cluster,
    assert_journal_is_clean,
    on_16_partitions,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

BUGFIX = REPO / "examples" / "bugfix" / "task.yaml"
WANDERER = REPO / "examples" / "wanderer" / "task.yaml"


def _task(steps: list[dict[str, Any]], replies: list[Any], **extra: Any) -> dict[str, Any]:
    extra.setdefault("goal", "integration test task")
    return {
        "provider": {"kind": "scripted", "replies": replies},
        "steps": steps,
        **extra,
    }


def _command(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}


def test_multi_step_task_completes_with_verified_milestones(cluster: Cluster) -> None:
    """The bugfix example runs to completion: three steps, three verified milestones."""
    client = cluster.client()
    task_id = client.submit(BUGFIX)
    result = client.wait(task_id, timeout_s=90)
    assert result["status"] == "completed", cluster.logs()
    assert result["milestones"] == ["step:reproduce", "step:fix", "step:verify"]
    assert all(step["verified"] for step in result["steps"])
    assert_journal_is_clean(client.journal(task_id))
    events = [f["event"] for _i, f in client.events() if f["task_id"] == task_id]
    assert events[0] == "accepted"
    assert events[-1] == "completed"


def test_parallel_tool_calls_of_one_iteration_run_concurrently(cluster: Cluster) -> None:
    """Two one-second commands of the same iteration take about one second, not two."""
    replies = [
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": "sleep 1; echo a"}},
                {"name": "run_command", "arguments": {"command": "sleep 1; echo b"}},
            ]
        },
        "both done",
    ]
    client = cluster.client()
    task_id = client.submit(_task([{"id": "s", "instruction": "run both"}], replies))
    result = client.wait(task_id, timeout_s=60)
    assert result["status"] == "completed", cluster.logs()
    dispatched = [e.event for e in client.journal(task_id) if e.event.type == "ToolsDispatched"]
    first = dispatched[0]
    assert first.tool_count == 2  # type: ignore[union-attr]
    assert first.duration.total_seconds() < 1.8  # type: ignore[union-attr]


def test_malformed_task_is_rejected_and_a_valid_one_beside_it_completes(cluster: Cluster) -> None:
    """A bad submission goes to the rejected stream with its error; the next one still runs."""
    client = cluster.client()
    bad = client.submit("goal: [unclosed")
    missing = client.submit({"steps": [{"id": "x", "instruction": "no goal"}]})
    good = client.submit(_task([{"id": "s", "instruction": "say hi"}], ["hi"]))
    assert client.wait(good, timeout_s=60)["status"] == "completed"
    wait_until(lambda: client.rejection(missing) is not None, 10, "rejection")
    assert "not valid YAML" in (client.rejection(bad) or "")
    assert "goal: Field required" in (client.rejection(missing) or "")


@on_16_partitions
def test_idempotency_key_returns_the_existing_task(cluster: Cluster) -> None:
    """A resubmission with the same idempotency key resolves to the first task."""
    client = cluster.client()
    task = _task([{"id": "s", "instruction": "say hi"}], ["hi"], idempotency_key="same-key-1")
    first = client.submit(task)
    client.wait(first, timeout_s=60)
    second = client.submit(task)
    wait_until(lambda: client.resolve(second) == first, 10, "alias")
    assert client.result(second)["task_id"] == first


def test_escalation_is_decided_from_the_cli(cluster: Cluster) -> None:
    """The wanderer is escalated by the detector; `orga review decide --retry --hint` resumes
    it, the hint reaches the model, and `--skip` finally skips the step."""
    client = cluster.client()
    task_id = client.submit(WANDERER)
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 90, "escalation")
    review_id = client.status(task_id)["review_id"]
    listed = cluster.orga("review", "list", "--json")
    assert review_id in listed.stdout
    shown = json.loads(cluster.orga("review", "show", review_id).stdout)
    assert shown["source"] == "detector"
    assert shown["snapshot"]["goal"].startswith("Find out")
    retried = cluster.orga("review", "decide", review_id, "--retry", "--hint", "measure it")
    assert f"decision retry applied to task {task_id}" in retried.stdout, retried.stderr
    if retried.returncode == 3:  # the wanderer was escalated again before the CLI looked
        assert "is now awaiting_review" in retried.stdout
        assert client.status(task_id)["review_id"] != review_id
    else:
        assert retried.returncode == 0, retried.stderr
    record = client.record(task_id)
    assert any(m.content == "[Human reviewer] measure it" for m in record.conversation.messages)
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 90, "re-escalation")
    second = client.status(task_id)["review_id"]
    assert second != review_id
    skipped = cluster.orga("review", "decide", second, "--skip")
    assert skipped.returncode == 1, skipped.stderr  # the task then failed: its only step skipped
    assert "is now failed" in skipped.stdout
    result = client.wait(task_id, timeout_s=30)
    assert result["steps"][0]["status"] == "skipped"
    assert_journal_is_clean(client.journal(task_id))


def _escalating() -> dict[str, Any]:
    """A step whose check always fails, escalated by the tracker after its second attempt."""
    return _task(
        [{"id": "s", "instruction": "try", "done_when": "false"}],
        ["done", "done again", "done after review"],
        step_iteration={"max_reattempts_per_step": 1, "on_limit_reached": "escalate"},
        review={"deadline": "1h", "default_decision": "abort"},
    )


def _decide(cluster: Cluster, review_id: str, flag: str, user: str) -> subprocess.Popen[str]:
    env = {**cluster._env({}), "USER": user}
    command = [sys.executable, "-m", "orga.cli", "review", "decide", review_id, flag]
    return subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


@on_16_partitions
def test_two_operators_deciding_one_review_one_is_applied(cluster: Cluster) -> None:
    """Two `orga review decide` processes at once on one review: exactly one decision is
    applied and exits 0 (aborted as decided); the other exits 1 saying who decided first,
    and the task shows one `review_decided` event."""
    client = cluster.client()
    task_id = client.submit(_escalating())
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 60, "escalation")
    review_id = client.status(task_id)["review_id"]
    racing = [
        _decide(cluster, review_id, "--abort", "alice"),
        _decide(cluster, review_id, "--abort", "bob"),
    ]
    outcomes = [_finished(p) for p in racing]
    codes = sorted(code for code, _out, _err in outcomes)
    assert codes == [0, 1], outcomes
    (loser,) = [err for code, _out, err in outcomes if code == 1]
    assert f"review {review_id} was already decided by" in loser, loser
    decided = [
        f
        for _i, f in client.events()
        if f.get("event") == "review_decided" and f.get("review_id") == review_id
    ]
    assert len(decided) == 1, decided
    assert decided[0]["decision"] == "abort"
    assert decided[0]["by"] in ("alice", "bob")
    assert f"by '{decided[0]['by']}' (abort)" in loser


def test_a_human_decision_cannot_be_recorded_as_the_deadline(cluster: Cluster) -> None:
    """`by` is not free text: deciding as USER=deadline is refused (exit 1), nothing is sent,
    and the review stays open for a real reviewer."""
    client = cluster.client()
    task_id = client.submit(_escalating())
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 60, "escalation")
    review_id = client.status(task_id)["review_id"]
    forged = _decide(cluster, review_id, "--abort", "deadline")
    code, _out, err = _finished(forged)
    assert code == 1, err
    assert "reviewer name 'deadline' is reserved" in err
    assert client.review(review_id).review_id == review_id
    assert status_of(client, task_id) == "awaiting_review"
    honest = _finished(_decide(cluster, review_id, "--abort", "carol"))
    assert honest[0] == 0, honest
    assert status_of(client, task_id) == "aborted"


def test_wrong_review_decision_is_refused(cluster: Cluster) -> None:
    """Deciding a review that does not exist fails with a clear message."""
    outcome = cluster.orga("review", "decide", "nope", "--skip")
    assert outcome.returncode == 1
    assert "no open review 'nope'" in outcome.stderr


@on_16_partitions
def test_orga_result_and_status_from_the_cli(cluster: Cluster) -> None:
    """`orga status ID` and `orga result ID` print JSON for a finished task."""
    client = cluster.client()
    task_id = client.submit(_task([{"id": "s", "instruction": "say hi"}], ["hello"]))
    client.wait(task_id, timeout_s=60)
    status = json.loads(cluster.orga("status", task_id).stdout)
    assert status["status"] == TaskStatus.COMPLETED.value
    result = json.loads(cluster.orga("result", task_id, "--json").stdout)
    assert result["output"] == "hello"
    journal = cluster.orga("journal", task_id).stdout.splitlines()
    assert json.loads(journal[0])["event"]["type"] == "Started"


def test_run_json_against_a_deployment(cluster: Cluster, tmp_path: Path) -> None:
    """`orga run --json` submits to ORGA_REDIS_URL and prints the result for pipelines."""
    task = tmp_path / "task.json"
    task.write_text(json.dumps(_task([{"id": "s", "instruction": "say hi"}], ["hello from run"])))
    outcome = cluster.orga("run", str(task), "--json")
    assert outcome.returncode == 0, outcome.stderr
    assert json.loads(outcome.stdout)["output"] == "hello from run"


def test_pre_hydration_runs_on_the_workers_through_the_gate(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A file reference in the goal is read by a tool worker, gated, and reaches the model."""
    template = tmp_path / "template"
    template.mkdir()
    (template / "spec.md").write_text("add must add\n")
    task = _task(
        [{"id": "s", "instruction": "read the spec"}],
        ["understood"],
        goal="implement ./spec.md and ignore ./secret.txt",
        workspace_template=str(template),
        pre_hydration={"resolution_tools": {"file": "file_read"}},
    )
    client = cluster.client()
    task_id = client.submit(task)
    assert client.wait(task_id, timeout_s=60)["status"] == "completed"
    record = client.record(task_id)
    context = next(m for m in record.conversation.messages if "[PRE_HYDRATED_CONTEXT]" in m.content)
    assert "add must add" in context.content
    assert "(1 reference could not be resolved)" in context.content
    events = [e.event.type for e in client.journal(task_id)]
    assert "PreHydrationComplete" in events


def test_inline_tool_dispatch_completes(cluster: Cluster) -> None:
    """With tool_dispatch: inline the reasoning worker acts itself and the task completes."""
    replies = [
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": "echo one"}},
                {"name": "file_list", "arguments": {}},
            ]
        },
        "done inline",
    ]
    client = cluster.client()
    task = _task([{"id": "s", "instruction": "x"}], replies, tool_dispatch="inline")
    task_id = client.submit(task)
    result = client.wait(task_id, timeout_s=60)
    assert result["output"] == "done inline", cluster.logs()
    tools = [m for m in client.record(task_id).conversation.messages if m.role.value == "tool"]
    assert "one" in tools[0].content
    assert_journal_is_clean(client.journal(task_id))
