"""Critics end to end: the real ``orga`` entry point in a subprocess (the embedded runtime of
``orga run``, and a deployment: a real Redis, a real Celery worker process and a coordinator
process), a critic agent's model behind a local server that speaks the OpenAI wire format."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.agents import AgentRegistry
from orga.embedded_redis import EmbeddedRedis
from shared.agent_profile import AgentProfile
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import (
    REPO,
    Cluster,
    clean_env,
    run_orga,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration

ORGA = Path(sys.executable).with_name("orga")
REVIEWER = REPO / "examples" / "critic" / "reviewer.yaml"
CRITIC_TASK = REPO / "examples" / "critic" / "task.yaml"
RUBRIC = "The answer names the file it wrote."


@pytest.fixture(scope="module")
def cluster(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One worker and one coordinator; the worker lets a task's critic name its model's base
    URL (the fake model of this module listens on 127.0.0.1)."""
    running = Cluster(private_redis.url, tmp_path_factory.mktemp("cluster"))
    try:
        running.worker(ORGA_ALLOW_TASK_BASE_URL="true")
        running.coordinator()
        yield running
    finally:
        running.stop()


def _deployed(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.update(ORGA_REDIS_URL=cluster.redis_url, ORGA_WORKSPACE_ROOT=str(cluster.workspaces))
    env.update(COLUMNS="200", USER="rene")
    return run_orga(*args, env=env, timeout_s=120)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.args, done.stdout, done.stderr)
    return done.stdout


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _journal(lines: str) -> list[dict[str, Any]]:
    return [json.loads(line)["event"] for line in lines.splitlines() if line.strip()]


def test_the_critic_example_runs_with_orga_run(tmp_path: Path) -> None:
    """examples/critic on the embedded runtime: the registered critic agent asks for one
    revision, the worker answers again, the critic approves; journal and status show it."""
    env = clean_env()
    env.update(ORGA_HOME=str(tmp_path / ".orga"), ORGA_WORKSPACE_ROOT=str(tmp_path / "ws"))
    assert "agent code-reviewer registered" in _ok(
        run_orga("agents", "add", str(REVIEWER), env=env)
    )
    result = json.loads(
        _ok(run_orga("run", str(CRITIC_TASK), "--json", "--timeout", "120", env=env))
    )
    assert result["status"] == "completed", result
    assert result["milestones"] == ["step:fix"]
    assert result["output"].startswith("Fixed add in calc.py: it returned a - b")
    events = _journal(_ok(run_orga("journal", result["task_id"], env=env)))
    critic = [e for e in events if e["type"].startswith("Critic")]
    assert [(e["type"], e["round"], e.get("verdict")) for e in critic] == [
        ("CriticRequested", 1, None),
        ("CriticVerdict", 1, "revise"),
        ("CriticRequested", 2, None),
        ("CriticVerdict", 2, "approve"),
    ]
    assert all(e["critic"] == "agent:code-reviewer" for e in critic)
    status = json.loads(_ok(run_orga("status", result["task_id"], env=env)))
    assert status["critic"]["revisions"] == 1
    assert [v["verdict"] for v in status["critic"]["verdicts"]] == ["revise", "approve"]


def test_a_critic_naming_an_unknown_agent_is_refused_at_intake(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The coordinator refuses the task, naming the step's critic and the known agents."""
    task = tmp_path / "task.yaml"
    task.write_text(
        "goal: g\nsteps:\n  - id: s\n    instruction: do it\n"
        "    critic: {agent: nobody-here, rubric: be good}\n",
        encoding="utf-8",
    )
    done = _deployed(cluster, "run", str(task), "--timeout", "30")
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = _one_line(done.stderr)
    assert "steps.0.critic: agent: 'nobody-here' is not a registered agent" in message, message
    assert "orga agents add FILE" in message


def test_a_critic_model_on_the_openai_wire_is_retried_once_after_a_malformed_reply(
    cluster: Cluster,
) -> None:
    """A critic agent whose model (OpenAI wire, local server) first answers prose: the reply is
    rejected with what is wrong, journaled, the critic asked again with the rejection, and its
    approval completes the step; its tokens count in the task's usage."""
    with FakeOpenAIServer() as model:
        model.respond_text("Looks good to me!", usage=(40, 5, 45))
        model.respond_text(
            json.dumps({"verdict": "approve", "reason": "names notes.txt"}), usage=(60, 9, 69)
        )
        AgentRegistry(cluster.client().redis).add(
            AgentProfile(
                name="wire-critic",
                provider={"kind": "openai", "base_url": model.base_url, "model": "gpt-critic"},  # type: ignore[arg-type]
                system_prompt="You review notes.",
            ),
            replace=True,
        )
        client = cluster.client()
        task_id = client.submit(
            {
                "goal": "write notes",
                "provider": {"kind": "scripted", "replies": ["I wrote notes.txt"]},
                "steps": [
                    {
                        "id": "notes",
                        "instruction": "write notes",
                        "critic": {"agent": "wire-critic", "rubric": RUBRIC},
                    }
                ],
            }
        )
        final = client.wait(task_id, timeout_s=60)
        requests = model.requests
    assert final["status"] == "completed", final
    assert len(requests) == 2
    assert requests[0].body["model"] == "gpt-critic"
    first = requests[0].body["messages"]
    assert first[0] == {"role": "system", "content": "You review notes."}
    assert RUBRIC in first[1]["content"] and "I wrote notes.txt" in first[1]["content"]
    assert "tools" not in requests[0].body or not requests[0].body["tools"]
    retried = requests[1].body["messages"][-1]["content"]
    assert retried.startswith("[Coordinator] Your last reply was rejected: the critic's reply")
    events = [e.event for e in client.journal(task_id)]
    rejected = [e for e in events if e.type == "CriticReplyRejected"]
    assert len(rejected) == 1 and rejected[0].retried  # type: ignore[union-attr]
    assert "not a JSON object" in rejected[0].error  # type: ignore[union-attr]
    assert client.record(task_id).usage.total_tokens >= 45 + 69


def test_a_human_critic_is_decided_from_the_cli(cluster: Cluster) -> None:
    """`orga review decide --revise REASON` sends the result back to the worker, `--approve`
    completes the step; a revision without a reason exits 2, `--approve` on the closed review
    is refused."""
    client = cluster.client()
    task_id = client.submit(
        {
            "goal": "write notes",
            "provider": {"kind": "scripted", "replies": ["done", "I wrote notes.txt"]},
            "steps": [
                {
                    "id": "notes",
                    "instruction": "write notes",
                    "critic": {"human": True, "rubric": RUBRIC, "max_rounds": 1},
                }
            ],
        }
    )
    wait_until(lambda: status_of(client, task_id) == "awaiting_review", 60, "critic review")
    first = str(client.status(task_id)["review_id"])
    shown = json.loads(_ok(_deployed(cluster, "review", "show", first)))
    assert shown["source"] == "critic"
    assert shown["snapshot"]["critic"]["result"] == "done"
    assert shown["snapshot"]["critic"]["rubric"] == RUBRIC

    empty = _deployed(cluster, "review", "decide", first, "--revise", " ")
    assert empty.returncode == 2 and "--revise needs a reason" in empty.stderr
    revised = _deployed(cluster, "review", "decide", first, "--revise", "name the file")
    assert revised.returncode in (0, 3), (revised.stdout, revised.stderr)
    wait_until(
        lambda: client.status(task_id)["review_id"] not in (None, first), 60, "second review"
    )
    second = str(client.status(task_id)["review_id"])
    assert client.review(second).snapshot["critic"]["result"] == "I wrote notes.txt"
    _ok(_deployed(cluster, "review", "decide", second, "--approve"))
    assert client.wait(task_id, timeout_s=60)["status"] == "completed"
    again = _deployed(cluster, "review", "decide", second, "--approve")
    assert again.returncode == 1, (again.stdout, again.stderr)
    verdicts = [
        (e.event.verdict, e.event.decided_by)  # type: ignore[union-attr]
        for e in client.journal(task_id)
        if e.event.type == "CriticVerdict"
    ]
    assert verdicts == [("revise", "human:rene"), ("approve", "human:rene")]
