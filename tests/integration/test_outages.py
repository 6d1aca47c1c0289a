"""An outage of the model's provider, through the real `orga` entry point (the embedded
runtime: a private Redis, real Celery workers) and a deployment of worker and coordinator
processes, against the fake OpenAI server: an outage that ends is waited out with the step's
attempts intact; one that lasts past ORGA_OUTAGE_DEADLINE_S fails the task naming it, in
`orga run`, `orga status`, `orga result` and the journal; a call held in a retry wait shows in
`orga status` and stops when `orga cancel` ends its task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from orga.embedded_redis import EmbeddedRedis
from shared import keys
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import (
    Cluster,
    cli_env,
    run_orga,
    status_of,
    task_id_printed,
    wait_until,
)

pytestmark = pytest.mark.integration


def _task_file(tmp_path: Path) -> Path:
    task = {
        "goal": "answer the question",
        "provider": {"kind": "openai", "model": "gpt-test"},
        "steps": [{"id": "answer", "instruction": "answer it"}],
        "step_iteration": {"max_reattempts_per_step": 1},
    }
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


def _journal(task_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    lines = run_orga("journal", task_id, env=env).stdout.splitlines()
    return [json.loads(line)["event"] for line in lines]


def _provider_env(tmp_path: Path, model: FakeOpenAIServer, **extra: str) -> dict[str, str]:
    """Each dispatch makes one model request (no retries in the worker), so every 5xx or 429
    is an outage report to the coordinator."""
    return cli_env(
        tmp_path,
        ORGA_BASE_URL=model.base_url,
        ORGA_PROVIDER="openai",
        ORGA_API_KEY="sk-right",
        ORGA_MAX_RETRIES="0",
        ORGA_PROVIDER_RETRY_DEADLINE_S="0",
        **extra,
    )


def test_a_provider_outage_that_ends_is_waited_out_with_the_attempts_intact(
    tmp_path: Path,
) -> None:
    """The model answers 503 three times and 429 once, then the answer: each failed dispatch
    is an outage report, held and sent again; the task completes with no attempt used (one
    allowed), the journal has four ServiceUnavailable entries and no AttemptFailed."""
    with FakeOpenAIServer(api_key="sk-right") as model:
        for _ in range(3):
            model.respond_error(503, "The server is overloaded")
        model.respond_rate_limited(retry_after="0")
        model.respond_text("the answer is 42")
        env = _provider_env(
            tmp_path, model, ORGA_OUTAGE_BACKOFF_S="0.2", ORGA_OUTAGE_DEADLINE_S="60"
        )
        run = run_orga("run", str(_task_file(tmp_path)), env=env)
        requests = len(model.requests)
    assert run.returncode == 0, run.stdout + run.stderr
    assert requests == 5
    task_id = task_id_printed(run.stdout)
    result = json.loads(run_orga("result", task_id, env=env).stdout)
    assert result["status"] == "completed" and result["output"] == "the answer is 42"
    assert result["steps"][0]["attempts"] == 0
    events = _journal(task_id, env)
    unavailable = [e for e in events if e["type"] == "ServiceUnavailable"]
    assert [(e["service"], e["reports"]) for e in unavailable] == [
        ("openai", 1),
        ("openai", 2),
        ("openai", 3),
        ("openai", 4),
    ]
    assert all(e["retry_at"] is not None for e in unavailable)
    assert [e for e in events if e["type"] == "AttemptFailed"] == []


def test_a_provider_outage_past_its_deadline_fails_the_task_naming_it(tmp_path: Path) -> None:
    """The model answers 500 to every call: past ORGA_OUTAGE_DEADLINE_S (3 s) the task fails
    with "provider openai unavailable since ..." and the provider's error, in `orga run`,
    `orga status`, `orga result` and the journal; no attempt used, nothing says "stuck" or
    "% similar" or "all steps were skipped"."""
    with FakeOpenAIServer(api_key="sk-right") as model:
        env = _provider_env(
            tmp_path, model, ORGA_OUTAGE_BACKOFF_S="0.5", ORGA_OUTAGE_DEADLINE_S="3"
        )
        run = run_orga("run", str(_task_file(tmp_path)), env=env)
        requests = len(model.requests)
    assert run.returncode == 1, run.stdout + run.stderr
    assert requests >= 2
    flat = " ".join(run.stdout.split())
    assert "provider openai unavailable since" in flat and "HTTP 500" in flat, run.stdout
    task_id = task_id_printed(run.stdout)
    status = json.loads(run_orga("status", task_id, env=env).stdout)
    assert status["status"] == "failed"
    assert status["error"].startswith("provider openai unavailable since ")
    result = json.loads(run_orga("result", task_id, env=env).stdout)
    assert result["error"] == status["error"] and "HTTP 500" in result["error"]
    assert result["steps"][0]["attempts"] == 0
    events = _journal(task_id, env)
    unavailable = [e for e in events if e["type"] == "ServiceUnavailable"]
    assert len(unavailable) >= 2 and unavailable[-1]["retry_at"] is None
    assert [e for e in events if e["type"] == "AttemptFailed"] == []
    for text in (run.stdout, json.dumps(status), json.dumps(events)):
        assert "% similar" not in text and "stuck" not in text
        assert "all steps were skipped" not in text


def test_a_call_held_in_a_retry_wait_shows_in_status_and_stops_on_cancel(
    private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    """The model answers 429 with Retry-After: 30: `orga status` shows the task waiting on
    the provider (HTTP 429, retry at ...); `orga cancel` aborts it and the worker's call stops
    within a few seconds (its dispatch answered), long before the 30 s, with no second
    request."""
    with redis.Redis.from_url(private_redis.url) as raw:
        raw.flushdb()
    with FakeOpenAIServer(api_key="sk-right") as model:
        model.respond_rate_limited(retry_after="30")
        cluster = Cluster(private_redis.url, tmp_path)
        try:
            cluster.worker(
                concurrency=1,
                ORGA_PROVIDER="openai",
                ORGA_BASE_URL=model.base_url,
                ORGA_API_KEY="sk-right",
                ORGA_PROVIDER_RETRY_DEADLINE_S="120",
            )
            cluster.coordinator()
            client = cluster.client()
            task_id = client.submit(yaml.safe_load(_task_file(tmp_path).read_text()))
            wait_until(lambda: len(model.requests) >= 1, timeout_s=60, what="the model call")

            def waiting() -> str:
                return str((client.status(task_id).get("dispatch") or {}).get("waiting", ""))

            wait_until(lambda: "retry at" in waiting(), timeout_s=30, what="the wait shown")
            shown = waiting()
            listed = cluster.orga("status")
            assert cluster.orga("cancel", task_id).returncode == 0
            wait_until(lambda: status_of(client, task_id) == "aborted", what="the abort")
            with redis.Redis.from_url(private_redis.url) as raw:

                def answered() -> bool:
                    scores = [
                        s for _m, s in raw.zrange(keys.heartbeats_key, 0, -1, withscores=True)
                    ]
                    return bool(scores) and all(s < 0 for s in scores)

                wait_until(answered, timeout_s=10, what="the held call to stop")
            requests = len(model.requests)
        finally:
            cluster.stop()
    assert shown.startswith("waiting on the provider openai (HTTP 429; retry at "), shown
    assert "reason: waiting on the provider" in listed.stdout, listed.stdout  # a table cell
    assert requests == 1
