"""Money budgets end to end: ``orga run`` (the installed entry point, embedded runtime) stops a
task whose next call would pass its ``max_cost_usd``, keeping its milestones and reporting the
cost; on a deployment (a real Redis, Celery worker processes, a coordinator), a parent and its
sub-agent share one budget, and the coordinator's metrics count the cost by model."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orga.embedded_redis import EmbeddedRedis
from shared.delegation import ParentLink
from tests.integration.harness import (
    Cluster,
    cli_env,
    run_orga,
    running_cluster,
    status_of,
    task_id_printed,
    wait_until,
)

pytestmark = pytest.mark.integration

PRICING = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}
"""$0.001 a token, in and out: a scripted reply's usage makes round sums."""


def _reply(text_or_calls: str | list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}
    if isinstance(text_or_calls, str):
        return {"text": text_or_calls, "usage": usage}
    return {"tool_calls": text_or_calls, "usage": usage}


def test_orga_run_stops_at_the_budget_keeping_milestones_and_reporting_the_cost(
    tmp_path: Path,
) -> None:
    """Each call costs $1.40 and $2.90 is the limit: step one's two calls are sent and its
    milestone verified; step two's call (worst case over the $0.10 left) is not sent. The
    task fails ``budget exhausted``; run, result, status and the journal show the cost."""
    write = {"name": "file_write", "arguments": {"path": "a.txt", "content": "hi"}}
    task = tmp_path / "task.yaml"
    task.write_text(
        yaml.safe_dump(
            {
                "goal": "two steps on a budget",
                "provider": {
                    "kind": "scripted",
                    "pricing": PRICING,
                    "replies": [
                        _reply([write], 1400),
                        _reply("a.txt written", 1400),
                        _reply("never sent", 1400),
                    ],
                },
                "steps": [
                    {"id": "one", "instruction": "write a.txt", "done_when": "test -f a.txt"},
                    {"id": "two", "instruction": "then this"},
                ],
                "limits": {"max_cost_usd": 2.9, "max_output_tokens": 100},
            }
        )
    )
    env = cli_env(tmp_path)
    outcome = run_orga("run", str(task), env=env)
    output = outcome.stdout + outcome.stderr
    task_id = task_id_printed(outcome.stdout)
    assert "budget exhausted: the next model call could cost up to" in output, output
    assert "milestones: step:one" in output, output
    assert "cost $2.8000 of $2.9000" in output, output
    result = json.loads(run_orga("result", task_id, "--json", env=env).stdout)
    assert result["status"] == "failed", result
    assert result["error"].startswith("budget exhausted"), result
    assert result["milestones"] == ["step:one"]
    assert result["usage"]["cost_usd"] == pytest.approx(2.8)
    assert result["max_cost_usd"] == 2.9
    status = json.loads(run_orga("status", task_id, env=env).stdout)
    assert status["usage"]["cost_usd"] == pytest.approx(2.8)
    journal = [
        json.loads(line) for line in run_orga("journal", task_id, env=env).stdout.splitlines()
    ]
    costs = [
        e["event"]["usage"]["cost_usd"]
        for e in journal
        if e["event"]["type"] == "ReasoningComplete"
    ]
    assert costs == pytest.approx([1.4, 1.4])
    ended = [e["event"] for e in journal if e["event"]["type"] == "Terminated"]
    assert ended[-1]["reason"]["kind"] == "budget_exhausted"


def test_orga_run_refuses_a_cost_limit_it_cannot_price(tmp_path: Path) -> None:
    """A model the price table does not know and no ``provider.pricing``: refused before it
    runs, naming the model and the fix."""
    task = tmp_path / "task.yaml"
    task.write_text(
        yaml.safe_dump(
            {
                "goal": "g",
                "provider": {"kind": "openai", "model": "house-llama-7b"},
                "limits": {"max_cost_usd": 1},
            }
        )
    )
    outcome = run_orga("run", str(task), env=cli_env(tmp_path))
    assert outcome.returncode != 0
    text = " ".join((outcome.stdout + outcome.stderr).split())
    assert "'house-llama-7b' is not in the price table" in text, text
    assert "provider.pricing" in text, text


# -- a deployment --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def metrics_port() -> int:
    """A free loopback port for the coordinator's metrics."""
    return _free_port()


@pytest.fixture
def cluster(private_redis: EmbeddedRedis, tmp_path: Path, metrics_port: int) -> Iterator[Cluster]:
    """A worker and a coordinator serving its metrics."""
    coordinator = {"ORGA_METRICS_PORT": str(metrics_port)}
    with running_cluster(private_redis.url, tmp_path, coordinator_env=coordinator) as running:
        yield running


def _spender() -> dict[str, Any]:
    """A sub-agent whose first step costs $0.40 (and is verified); its second step's call
    cannot fit in the $0.10 left of the $0.50 its parent gave it."""
    return {
        "name": "spender",
        "provider": {
            "kind": "scripted",
            "pricing": PRICING,
            "replies": [_reply("first step done", 400), _reply("never sent", 400)],
        },
        "limits": {"max_output_tokens": 50},
    }


def test_a_parent_and_its_sub_agent_share_one_money_budget(
    cluster: Cluster, tmp_path: Path, metrics_port: int
) -> None:
    """$1 for the tree: the parent's delegating call costs $0.20, the child reserves the
    $0.50 it asks for, spends $0.40 and ends ``budget exhausted`` with its first milestone;
    the parent, charged the child's $0.40, answers with the $0.40 left ($0.10): $0.70 in all.
    The coordinator's metrics count $0.70 for the model."""
    profile = tmp_path / "spender.json"
    profile.write_text(json.dumps(_spender()))
    done = cluster.orga("agents", "add", str(profile), "--replace")
    assert done.returncode == 0, done.stderr
    delegate = {
        "name": "delegate",
        "arguments": {
            "agent": "spender",
            "goal": "spend",
            "steps": [
                {"id": "one", "instruction": "first", "done_when": "true"},
                {"id": "two", "instruction": "second"},
            ],
            "budget": {"cost_usd": 0.5},
        },
    }
    client = cluster.client()
    task_id = client.submit(
        {
            "goal": "delegate on a budget",
            "provider": {
                "kind": "scripted",
                "pricing": PRICING,
                "model": "house-model",
                "replies": [_reply([delegate], 200), _reply("the child reported", 100)],
            },
            "steps": [{"id": "main", "instruction": "delegate, then answer"}],
            "limits": {"max_cost_usd": 1.0, "max_output_tokens": 50},
        },
        task_id="budget-tree",
    )
    wait_until(lambda: status_of(client, task_id) == "completed", timeout_s=90, what="parent")
    child_id = f"{task_id}.1"
    child = client.status(child_id)
    assert child["status"] == "failed", child
    assert child["error"].startswith("budget exhausted"), child
    assert child["milestones"] == ["step:one"]
    assert child["usage"]["cost_usd"] == pytest.approx(0.4)
    link = ParentLink.model_validate(client.record(child_id).spec.delegation.model_dump())
    assert link.max_cost_usd == pytest.approx(0.5)
    parent = client.status(task_id)
    assert parent["usage"]["cost_usd"] == pytest.approx(0.7)
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    cost = re.findall(r'^orga_cost_usd_total\{model="house-model",provider="scripted"\} (\S+)$',
                      text, re.M)  # fmt: skip
    assert cost and float(cost[0]) == pytest.approx(0.3), text  # the parent's own two calls
    child_cost = re.findall(r'^orga_cost_usd_total\{model="scripted",provider="scripted"\} (\S+)$',
                            text, re.M)  # fmt: skip
    assert child_cost and float(child_cost[0]) == pytest.approx(0.4)
    assert 'gen_ai_client_token_usage_bucket{gen_ai_operation_name="chat"' in text
