"""Sub-agents end to end: a real Redis, real Celery workers and real coordinator processes, the
``orga`` entry point in a subprocess, the scripted model driving parents and children."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.client import OrgaClient
from shared import keys
from tests.integration.harness import (
    REPO,
    Cluster,
    clean_env,
    on_16_partitions,
    run_orga,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "delegation"
AGENTS = [EXAMPLE / "agents" / f"{name}.yaml" for name in ("summarizer", "checker", "editor")]


def _env(tmp_path: Path) -> dict[str, str]:
    env = clean_env()
    env.update(ORGA_HOME=str(tmp_path / "home"), ORGA_WORKSPACE_ROOT=str(tmp_path / "ws"))
    env["COLUMNS"] = "200"
    return env


def _ok(done: Any) -> str:
    assert done.returncode == 0, (done.args, done.stdout, done.stderr)
    return str(done.stdout)


def test_the_example_delegates_to_two_subagents_with_orga_run(tmp_path: Path) -> None:
    """``orga run`` (embedded: a private Redis, real workers, the coordinator) runs the example:
    two children created in one turn, both completed, their answers combined; ``orga status``
    shows the tree."""
    env = _env(tmp_path)
    for agent in AGENTS:
        _ok(run_orga("agents", "add", str(agent), env=env))
    result = json.loads(_ok(run_orga("run", str(EXAMPLE / "task.yaml"), "--json", env=env)))
    assert result["status"] == "completed", result
    assert "step:combine" in result["milestones"]
    task_id = result["task_id"]
    status = json.loads(_ok(run_orga("status", task_id, env=env)))
    critic = status["critic"]  # the combine step's critic approved the combined note
    assert critic["critic"] == "agent:editor" and critic["revisions"] == 0, critic
    assert [v["verdict"] for v in critic["verdicts"]] == ["approve"], critic
    tree = {c["task_id"]: c for c in status["children"]}
    assert set(tree) == {f"{task_id}.1", f"{task_id}.2"}
    assert [tree[f"{task_id}.{n}"]["agent"] for n in (1, 2)] == ["summarizer", "checker"]
    assert all(c["status"] == "completed" and c["steps_done"] == 1 for c in tree.values())
    assert tree[f"{task_id}.1"]["milestones"] == ["step:summarize"]
    child = json.loads(_ok(run_orga("status", f"{task_id}.2", env=env)))
    assert child["parent"] == task_id
    workspace = Path(status["workspace"])
    assert (workspace / "RELEASE.md").read_text().startswith("# Release 1.2")
    assert (workspace / "subagents" / f"{task_id}.2" / "CHECK.txt").exists()  # a subfolder
    assert not (workspace / "SUMMARY.txt").exists()  # the summarizer wrote in its copy
    journal = _ok(run_orga("journal", f"{task_id}.1", env=env))  # its own journal
    assert "file_write" in journal and "SUMMARY.txt" in journal


def _slow_agent(name: str, seconds: int) -> dict[str, Any]:
    return {
        "name": name,
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch first"}}]},
            "first step done",
            {"tool_calls": [{"name": "run_command",
                             "arguments": {"command": f"sleep {seconds}; echo late"}}]},
            "second step done",
        ]},
        "tools": ["run_command"],
        "limits": {"tool_timeout": f"{seconds * 2}s", "max_iterations": 5},
    }  # fmt: skip


def _parent(*agents: str, goal: str = "wait on two sub-agents") -> dict[str, Any]:
    calls = [
        {"name": "delegate", "arguments": {
            "agent": agent, "goal": f"two steps as {agent}",
            "steps": [{"id": "one", "instruction": "touch first", "done_when": "test -f first"},
                      {"id": "two", "instruction": "wait"}]}}
        for agent in agents
    ]  # fmt: skip
    return {
        "goal": goal,
        "steps": [{"id": "main", "instruction": "delegate, then answer"}],
        "provider": {"kind": "scripted", "replies": [{"tool_calls": calls}, "both answered"]},
    }


def _register(cluster: Cluster, tmp_path: Path, profile: dict[str, Any]) -> None:
    path = tmp_path / f"{profile['name']}.json"
    path.write_text(json.dumps(profile))
    _ok(cluster.orga("agents", "add", str(path), "--replace"))


def test_cancelling_a_parent_cancels_its_children_keeping_their_milestones(
    cluster: Cluster, tmp_path: Path
) -> None:
    """On a deployment: a parent waiting on two slow children is cancelled with ``orga
    cancel``; both children end aborted, each keeping the milestone of its first step."""
    _register(cluster, tmp_path, _slow_agent("sleeper", 60))
    client = cluster.client()
    task_id = client.submit(_parent("sleeper", "sleeper"), task_id="deleg-cancel")
    children = [f"{task_id}.1", f"{task_id}.2"]

    def first_steps_done() -> bool:
        return all(_milestones(client, c) == ["step:one"] for c in children)

    wait_until(first_steps_done, 90, "both children's first milestones")
    _ok(cluster.orga("cancel", task_id))
    wait_until(lambda: all(status_of(client, c) == "aborted" for c in children), 60,
               "children aborted")  # fmt: skip
    assert status_of(client, task_id) == "aborted"
    for child in children:
        record = client.record(child)
        assert record.milestones == ["step:one"]
        assert f"its parent task {task_id} ended (aborted)" in (record.error or "")
    status = json.loads(_ok(cluster.orga("status", task_id)))
    assert [c["status"] for c in status["children"]] == ["aborted", "aborted"]


def _milestones(client: OrgaClient, task_id: str) -> list[str] | None:
    try:
        return client.record(task_id).milestones
    except Exception:  # not created yet
        return None


def test_an_unknown_agent_comes_back_as_an_error_result(cluster: Cluster) -> None:
    """A delegation to an agent the registry does not know is refused by the intake, and the
    parent's call gets the refusal as its result (the parent completes, nothing hangs)."""
    client = cluster.client()
    task_id = client.submit(_parent("nobody-here"), task_id="deleg-unknown")
    wait_until(lambda: status_of(client, task_id) == "completed", 60, "parent completed")
    record = client.record(task_id)
    result = next(m for m in record.conversation.messages if m.role.value == "tool")
    assert f"the sub-agent was not created: sub-agent task {task_id}.1: " in result.content
    assert "'nobody-here' is not a registered agent" in result.content
    assert record.children[0].status == "rejected"


def test_a_childs_review_shows_its_parents_goal_and_step(cluster: Cluster, tmp_path: Path) -> None:
    """A sub-agent that wanders escalates to a human; its review's context names its parent's
    goal and step; aborting it answers the parent's call with an error, and the parent goes on
    to complete."""
    wanderer = REPO / "examples" / "wanderer"
    _register(cluster, tmp_path, {
        "name": "wanderer", "delegated_workspace": "copy",
        "provider": {"kind": "scripted", "script": str(wanderer / "script.yaml")},
        "limits": {"max_iterations": 60},
    })  # fmt: skip
    parent = _parent(goal="find the latency bug with a helper")
    parent["workspace_template"] = str(wanderer / "workspace")
    parent["provider"]["replies"][0]["tool_calls"] = [{"name": "delegate", "arguments": {
        "agent": "wanderer", "goal": "Find out why the first request of each key is slow.",
        "steps": [{"id": "investigate", "instruction": "Investigate and write FINDINGS.md.",
                   "done_when": "test -s FINDINGS.md"}]}}]  # fmt: skip
    client = cluster.client()
    task_id = client.submit(parent, task_id="deleg-review")
    child = f"{task_id}.1"
    wait_until(lambda: status_of(client, child) == "awaiting_review", 120, "the child escalated")
    review = client.record(child).review
    assert review is not None
    assert review.snapshot["parent"]["task_id"] == task_id
    assert review.snapshot["parent"]["goal"] == "find the latency bug with a helper"
    assert review.snapshot["parent"]["step"] == {
        "id": "main", "instruction": "delegate, then answer"
    }  # fmt: skip
    assert status_of(client, task_id) == "running"  # the parent waits, durably
    _ok(cluster.orga("review", "decide", review.review_id, "--abort"))
    wait_until(lambda: status_of(client, task_id) == "completed", 60, "the parent completed")
    result = next(m for m in client.record(task_id).conversation.messages if m.role.value == "tool")
    assert result.content.startswith(f"[Error] sub-agent 'wanderer' (task {child}) aborted")


@on_16_partitions
def test_child_submissions_and_results_are_on_the_streams_once(cluster: Cluster) -> None:
    """Each child is submitted once on the intake, and its end is one child_finished
    observation (the completed parent applied it once)."""
    import redis

    plain = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    client = cluster.client()
    task_id = client.submit(_parent("nobody-either"), task_id="deleg-once")
    wait_until(lambda: status_of(client, task_id) == "completed", 60, "parent completed")
    p = client.partition(task_id)  # the tree's, its children's too
    submitted = [
        f for _i, f in plain.xrange(keys.intake_stream(p)) if f["task_id"] == f"{task_id}.1"
    ]
    assert len(submitted) == 1
    events = [f for _i, f in plain.xrange(keys.events_stream(p)) if f.get("task_id") == task_id]
    assert [e["event"] for e in events].count("child_finished") == 1


def test_a_submitted_task_cannot_claim_a_parent(cluster: Cluster) -> None:
    """A task submitted with a forged ``delegation`` naming a live parent is rejected, and the
    parent gets nothing from it."""
    client = cluster.client()
    parent = client.submit(_parent("nobody-at-all"), task_id="deleg-victim")
    wait_until(lambda: status_of(client, parent) == "completed", 60, "parent completed")
    forged = {
        "goal": "pretend", "steps": [{"id": "x", "instruction": "x"}],
        "delegation": {"task_id": parent, "step_id": "main", "iteration": 1, "call_id": "call_1"},
    }  # fmt: skip
    client.submit(forged, task_id="deleg-forged")
    wait_until(lambda: client.rejection("deleg-forged") is not None, 30, "the forged task refused")
    assert "which did not create it" in str(client.rejection("deleg-forged"))
    assert [c.task_id for c in client.record(parent).children] == [f"{parent}.1"]


def _planting_parent(command: str) -> dict[str, Any]:
    parent = _parent("reader")
    parent["provider"]["replies"] = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        {"tool_calls": [{"name": "delegate", "arguments": {
            "agent": "reader", "goal": "read the secret",
            "steps": [{"id": "read", "instruction": "read secret.txt"}]}}]},
        "parent done",
    ]  # fmt: skip
    return parent


def test_a_childs_workspace_never_escapes_through_a_link(cluster: Cluster, tmp_path: Path) -> None:
    """On a deployment: a parent that links ``subagents/<parent>.1`` to an outside folder and
    then delegates has its ``delegate`` call refused; a parent that makes that folder itself
    (a link to the secret inside) has its child stopped at the child's first tool call, in the
    tool worker. Neither reads nor writes anything outside, and the parent's call says why."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the outside secret")
    _register(cluster, tmp_path, {
        "name": "reader",
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "file_read", "arguments": {"path": "secret.txt"}},
                            {"name": "file_write", "arguments": {"path": "planted.txt",
                                                                 "content": "child"}}]},
            "read it"]},
        "limits": {"max_iterations": 5},
    })  # fmt: skip
    client = cluster.client()
    linked = client.submit(_planting_parent(
        "python3 -c \"import os; os.makedirs('subagents', exist_ok=True); "
        f"os.symlink('{outside}', 'subagents/deleg-link.1')\""
    ), task_id="deleg-link")  # fmt: skip
    made = client.submit(_planting_parent(
        f"mkdir -p subagents/deleg-made.1 && ln -s {outside}/secret.txt "
        "subagents/deleg-made.1/secret.txt"
    ), task_id="deleg-made")  # fmt: skip
    for task_id in (linked, made):
        wait_until(lambda t=task_id: status_of(client, t) == "completed", 90, f"{task_id} done")
    results = {}
    for task_id in (linked, made):
        tool = [m for m in client.record(task_id).conversation.messages if m.role.value == "tool"]
        results[task_id] = tool[1].content
    assert (
        "delegation refused: subagents/deleg-link.1 in this task's workspace is a symbolic"
        in (results[linked])
    )
    assert client.record(linked).children == []
    assert "was not created by the runtime" in results[made], results[made]
    assert status_of(client, f"{made}.1") == "failed"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    child = client.record(f"{made}.1")
    assert all("the outside secret" not in (m.content or "") for m in child.conversation.messages)
