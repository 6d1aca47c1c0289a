"""What an operator meets, through the real `orga` entry point in a subprocess on the embedded
runtime (a private Redis, real Celery workers): configuration errors that say what they are,
rate limits that wait instead of burning attempts, and reviews that resume in the task's own
workspace. The shared rate limit is checked on a deployment of two worker processes and a
coordinator (tests/integration/harness.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orga.embedded_redis import EmbeddedRedis
from shared.events import ProviderWaited
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import (
    Cluster,
    cli_env,
    run_orga,
    task_id_printed,
    wait_until,
)

pytestmark = pytest.mark.integration


def _task_file(tmp_path: Path, task: dict[str, Any], name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(task))
    return path


def _llm_task(**provider: str) -> dict[str, Any]:
    return {
        "goal": "answer the question",
        "provider": {"kind": "openai", "model": "gpt-test", **provider},
        "steps": [{"id": "answer", "instruction": "answer it"}],
        "step_iteration": {"max_reattempts_per_step": 3},
    }


# -- item 2: every failure says what it is ---------------------------------------------------


def test_missing_template_and_script_are_refused_at_intake(tmp_path: Path) -> None:
    """A task file naming a template and a script that do not exist is refused by `orga run`
    before anything is submitted: exit 2, both paths named."""
    task = {
        "goal": "g",
        "workspace_template": "./no-such-template",
        "provider": {"kind": "scripted", "script": "./no-such-script.yaml"},
        "steps": [{"id": "s", "instruction": "i"}],
    }
    outcome = run_orga("run", str(_task_file(tmp_path, task)), env=cli_env(tmp_path))
    assert outcome.returncode == 2, outcome.stdout + outcome.stderr
    assert "no-such-template" in outcome.stderr and "is not a folder" in outcome.stderr
    assert "no-such-script.yaml" in outcome.stderr and "is not a file" in outcome.stderr
    assert "task " not in outcome.stdout


CONFIG_CASES = {
    "rejected key": ({"ORGA_API_KEY": "sk-wrong"}, {}, "rejected the API key (HTTP 401)"),
    "unknown model": ({"ORGA_API_KEY": "sk-right"}, {"model": "no-such-model"}, "HTTP 404"),
    "missing key": ({}, {}, "OPENAI_API_KEY"),
    "refused base_url": (
        {"ORGA_API_KEY": "sk-right"},
        {"base_url": "http://127.0.0.1:9/v1"},
        "ORGA_ALLOW_TASK_BASE_URL",
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_a_configuration_error_fails_the_task_at_once_with_its_message(
    case: str, tmp_path: Path
) -> None:
    """A rejected or missing API key, an unknown model or a refused base_url fails the task at
    the first call, with the provider's own message in `orga run`, `orga status`, `orga result`
    and the journal, and exit code 1; no attempt is retried and nothing says "% similar"."""
    env_extra, provider, expected = CONFIG_CASES[case]
    with FakeOpenAIServer(api_key="sk-right") as model:
        if case == "unknown model":
            model.respond_error(404, "The model `no-such-model` does not exist")
        model.respond_text("42")
        env = cli_env(tmp_path, ORGA_BASE_URL=model.base_url, ORGA_PROVIDER="openai", **env_extra)
        run = run_orga("run", str(_task_file(tmp_path, _llm_task(**provider))), env=env)
        requests = len(model.requests)
    assert run.returncode == 1, run.stdout + run.stderr
    assert expected in run.stdout, run.stdout
    assert requests <= 1, f"{requests} model calls for a configuration error"
    task_id = task_id_printed(run.stdout)
    status = run_orga("status", task_id, env=env)
    assert "failed" in status.stdout and expected in " ".join(status.stdout.split()), status.stdout
    result = json.loads(run_orga("result", task_id, env=env).stdout)
    assert result["status"] == "failed"
    assert result["error"].startswith("configuration error: ") and expected in result["error"]
    assert result["steps"][0]["attempts"] == 0
    journal = run_orga("journal", task_id, env=env).stdout
    assert expected in journal
    for text in (run.stdout, status.stdout, journal, json.dumps(result)):
        assert "% similar" not in text


# -- item 3: rate limits do not burn attempts ------------------------------------------------


def test_a_rate_limited_model_is_waited_out_without_using_an_attempt(tmp_path: Path) -> None:
    """The model answers 429 with Retry-After: 1 four times, more than ORGA_MAX_RETRIES: the
    worker waits each out within ORGA_PROVIDER_RETRY_DEADLINE_S, the task completes with no
    attempt used, and the journal records the four waits (ProviderWaited)."""
    with FakeOpenAIServer(api_key="sk-right") as model:
        for _ in range(4):
            model.respond_rate_limited(retry_after="1")
        model.respond_text("the answer is 42")
        env = cli_env(
            tmp_path,
            ORGA_BASE_URL=model.base_url,
            ORGA_PROVIDER="openai",
            ORGA_API_KEY="sk-right",
            ORGA_MAX_RETRIES="1",
            ORGA_PROVIDER_RETRY_DEADLINE_S="60",
        )
        task = _llm_task()
        task["step_iteration"] = {"max_reattempts_per_step": 1}
        run = run_orga("run", str(_task_file(tmp_path, task)), env=env)
        requests = len(model.requests)
    assert run.returncode == 0, run.stdout + run.stderr
    assert requests == 5
    task_id = task_id_printed(run.stdout)
    result = json.loads(run_orga("result", task_id, env=env).stdout)
    assert result["status"] == "completed" and result["output"] == "the answer is 42"
    assert result["steps"][0]["attempts"] == 0
    entries = [
        json.loads(line) for line in run_orga("journal", task_id, env=env).stdout.splitlines()
    ]
    waited = [e["event"] for e in entries if e["event"]["type"] == "ProviderWaited"]
    assert len(waited) == 1, entries
    assert [(w["status"], w["wait_s"], w["retry_after"]) for w in waited[0]["waits"]] == [
        (429, 1.0, True)
    ] * 4
    assert waited[0]["total_wait_s"] == 4.0
    assert "sk-right" not in json.dumps(entries)


# -- items 1 and 9: a review resumes in the task's own workspace, and is journaled ----------


def _write(path: str, content: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "file_write", "arguments": {"path": path, "content": content}}]}


def test_a_retry_from_another_workspace_root_resumes_in_the_tasks_workspace(
    tmp_path: Path,
) -> None:
    """A task writes notes.txt, fails its check and escalates; `orga review decide --retry`
    run with another ORGA_WORKSPACE_ROOT resumes in the workspace the task was
    created with (not a fresh copy under the other root): notes.txt is still there and the
    task completes. The journal holds the escalation and the decision (who, what, the hint)."""
    task = {
        "goal": "keep notes",
        "provider": {
            "kind": "scripted",
            "replies": [
                _write("notes.txt", "first finding"),
                "done",
                _write("second.txt", "x"),
                "done",
            ],
        },
        "steps": [
            {
                "id": "notes",
                "instruction": "write notes.txt and second.txt",
                "done_when": "test -f notes.txt && test -f second.txt",
            }
        ],
        "step_iteration": {"max_reattempts_per_step": 1, "on_limit_reached": "escalate"},
        "stagnation": {"enabled": False},
    }
    env = cli_env(tmp_path)
    run = run_orga("run", str(_task_file(tmp_path, task)), env=env)
    assert run.returncode == 3, run.stdout + run.stderr
    task_id = task_id_printed(run.stdout)
    workspace = tmp_path / "workspaces" / task_id
    assert (workspace / "notes.txt").read_text() == "first finding"
    status = json.loads(run_orga("status", task_id, "--json", env=env).stdout)
    assert status["workspace"] == str(workspace)
    review_id = status["review_id"]
    other = cli_env(tmp_path, ORGA_WORKSPACE_ROOT=str(tmp_path / "other-root"))
    decided = run_orga("review", "decide", review_id, "--retry", "--hint", "keep going", env=other)
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert (workspace / "notes.txt").read_text() == "first finding"
    assert (workspace / "second.txt").exists()
    assert not (tmp_path / "other-root").exists()
    result = json.loads(run_orga("result", task_id, env=env).stdout)
    assert result["status"] == "completed"
    assert result["milestones"] == ["step:notes"]
    entries = [
        json.loads(line) for line in run_orga("journal", task_id, env=env).stdout.splitlines()
    ]
    events = [e["event"] for e in entries]
    escalated = [e for e in events if e["type"] == "Escalated"]
    decided_entries = [e for e in events if e["type"] == "ReviewDecided"]
    assert [(e["review_id"], e["source"]) for e in escalated] == [(review_id, "tracker")]
    assert [(e["review_id"], e["decision"], e["hint"]) for e in decided_entries] == [
        (review_id, "retry", "keep going")
    ]
    assert decided_entries[0]["decided_by"]


def test_a_429_holds_off_every_worker_calling_the_same_key(
    private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """Two workers, one key: task A's call gets a 429 with Retry-After: 8; task B, submitted
    then and served by the other worker, does not call the model before the hold ends (no
    second request within 7 s of the 429) and journals a shared wait; both complete without a
    failed attempt."""
    with FakeOpenAIServer(api_key="sk-right") as model:
        model.respond_rate_limited(retry_after="8")
        model.respond_text("done")
        model.respond_text("done")
        cluster = Cluster(private_redis.url, tmp_path)
        provider_env = {
            "ORGA_PROVIDER": "openai",
            "ORGA_BASE_URL": model.base_url,
            "ORGA_API_KEY": "sk-right",
            "ORGA_PROVIDER_RETRY_DEADLINE_S": "120",
        }
        try:
            cluster.worker(concurrency=1, name="wa", **provider_env)
            cluster.worker(concurrency=1, name="wb", **provider_env)
            cluster.coordinator()
            client = cluster.client()
            first = client.submit(_llm_task())
            wait_until(lambda: len(model.requests) >= 1, timeout_s=60, what="the first call")
            limited_at = time.monotonic()
            second = client.submit(_llm_task())
            wait_until(lambda: len(model.requests) >= 2, timeout_s=60, what="a second call")
            held_s = time.monotonic() - limited_at
            results = [client.wait(t, timeout_s=120) for t in (first, second)]
            journals = [client.journal(t) for t in (first, second)]
        finally:
            cluster.stop()
    assert held_s >= 7.0, f"a call reached the model {held_s:.1f} s after the 429"
    assert [r["status"] for r in results] == ["completed", "completed"], cluster.logs()
    assert [r["steps"][0]["attempts"] for r in results] == [0, 0]
    waits = [
        [w for e in journal if isinstance(e.event, ProviderWaited) for w in e.event.waits]
        for journal in journals
    ]
    assert [(w.status, w.wait_s, w.shared) for w in waits[0]] == [(429, 8.0, False)]
    assert [w.shared for w in waits[1]] == [True] and waits[1][0].wait_s > 1.0
