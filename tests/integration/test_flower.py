"""Flower as an operator runs it (`celery -A orga flower`, basic auth) against a real worker
and a private Redis: its task list, read over its HTTP API, names each dispatch by task, step,
iteration and purpose, and a reasoning call that failed on configuration is FAILURE; with the
compose deployment's commands (no `-E`, Flower turning no events on) it lists the tasks, and a
model call's runtime is the call's."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from orga.embedded_redis import EmbeddedRedis
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import Cluster, Process, wait_until

pytestmark = pytest.mark.integration

AUTH = ("operator", "flower-test-secret")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def flower(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    """A worker sending task events (-E), a coordinator and Flower with basic auth."""
    cluster = _cluster(private_redis, tmp_path)
    try:
        _events_worker(cluster)
        cluster.coordinator()
        yield cluster, _start_flower(cluster, {})
    finally:
        cluster.stop()


@pytest.fixture
def model() -> Iterator[FakeOpenAIServer]:
    """A local OpenAI-compatible server the reasoning worker calls (127.0.0.1, no key)."""
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def compose_flower(
    private_redis: EmbeddedRedis, tmp_path: Path, model: FakeOpenAIServer
) -> Iterator[tuple[Cluster, str]]:
    """The compose deployment's way: `orga worker --role reasoning` with no option about events
    (its event loop pool), and Flower with FLOWER_ENABLE_EVENTS=false (it turns no events on)."""
    cluster = _cluster(private_redis, tmp_path)
    command = [
        sys.executable, "-m", "orga.cli", "worker", "--role", "reasoning",
        "-n", f"reasoning-{os.getpid()}@%h",
    ]  # fmt: skip
    env = cluster._env({"ORGA_ALLOW_TASK_BASE_URL": "true", "ORGA_REASONING_PROCESSES": "1"})
    try:
        worker = Process("reasoning", command, env, tmp_path / "reasoning.log").start()
        cluster.processes.append(worker)
        worker.wait_for_log("ready.", timeout_s=60)
        cluster.coordinator()
        yield cluster, _start_flower(cluster, {"FLOWER_ENABLE_EVENTS": "false"})
    finally:
        cluster.stop()


def _cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Cluster:
    with redis.Redis.from_url(private_redis.url) as raw:
        raw.flushdb()
    return Cluster(private_redis.url, tmp_path)


def _start_flower(cluster: Cluster, env: dict[str, str]) -> str:
    """Flower with basic auth on a free port; its URL once it answers."""
    port = _free_port()
    command = [
        sys.executable, "-m", "celery", "-A", "orga", "flower", "--address=127.0.0.1",
        f"--port={port}", f"--basic-auth={AUTH[0]}:{AUTH[1]}",
    ]  # fmt: skip
    log = cluster.root / "flower.log"
    process = Process("flower", command, cluster._env(env), log).start()
    cluster.processes.append(process)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(url), timeout_s=60, what="Flower to answer")
    return url


def _events_worker(cluster: Cluster) -> None:
    """`celery -A orga worker -E`: both queues, task events on from the start."""
    command = [
        sys.executable, "-m", "celery", "-A", "orga", "worker", "-E", "-c", "2",
        "--loglevel", "INFO", "--without-mingle", "-n", f"events-{os.getpid()}@%h",
    ]  # fmt: skip
    log = cluster.root / "events-worker.log"
    process = Process("events-worker", command, cluster._env({}), log).start()
    process.wait_for_log("ready.")
    cluster.processes.append(process)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/workers", auth=AUTH, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _tasks(url: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{url}/api/tasks", auth=AUTH, timeout=10)
    response.raise_for_status()
    tasks: dict[str, dict[str, Any]] = response.json()
    return tasks


def _good_task() -> dict[str, Any]:
    calls = [
        {"name": "run_command", "arguments": {"command": "echo one"}},
        {"name": "run_command", "arguments": {"command": "echo two"}},
    ]
    return {
        "goal": "be seen in Flower",
        "provider": {"kind": "scripted", "replies": [{"tool_calls": calls}, "done"]},
        "steps": [{"id": "look", "instruction": "run them"}],
        "stagnation": {"enabled": False},
    }


def test_flower_lists_dispatches_by_name_and_failed_calls_as_failed(
    flower: tuple[Cluster, str], tmp_path: Path
) -> None:
    """Flower's /api/tasks (basic auth) shows `reason <task> <step> #0 act` and
    `act <task> <step> #1 run_command` for a task that completes, and the reasoning call of a
    task whose script file is missing in state FAILURE with the worker's error."""
    cluster, url = flower
    assert httpx.get(f"{url}/api/tasks", timeout=5).status_code == 401
    client = cluster.client()
    good = client.submit(_good_task())
    missing = str(tmp_path / "no-such-script.yaml")
    bad = client.submit(
        {
            "goal": "fail on configuration",
            "provider": {"kind": "scripted", "script": missing},
            "steps": [{"id": "never", "instruction": "x"}],
        }
    )
    assert client.wait(good, timeout_s=120)["status"] == "completed", cluster.logs()
    assert client.wait(bad, timeout_s=120)["status"] == "failed", cluster.logs()

    def names_and_states() -> dict[str, str]:
        return {str(t.get("name")): str(t.get("state")) for t in _tasks(url).values()}

    wanted = {f"reason {good} look #0 act", f"act {good} look #1 run_command"}
    failed_name = f"reason {bad} never #0 act"
    # A call's result reaches the coordinator before its worker's task-succeeded event reaches
    # Flower (events are flushed once per window), so wait for the final states, not the names.
    final = {**dict.fromkeys(wanted, "SUCCESS"), failed_name: "FAILURE"}
    deadline = time.monotonic() + 60
    seen = names_and_states()
    while time.monotonic() < deadline and any(seen.get(n) != s for n, s in final.items()):
        time.sleep(0.5)
        seen = names_and_states()
    assert wanted <= set(seen), seen
    assert all(seen[name] == "SUCCESS" for name in wanted), seen
    assert seen[failed_name] == "FAILURE", seen
    failure = next(t for t in _tasks(url).values() if t.get("name") == failed_name)
    assert "no-such-script.yaml" in str(failure.get("exception")), failure


MODEL_DELAY_S = 1.0


def test_default_workers_show_tasks_with_the_model_calls_runtime(
    compose_flower: tuple[Cluster, str], model: FakeOpenAIServer
) -> None:
    """`orga worker --role reasoning` sends task events without `-E` (Flower turning none on),
    so Flower lists its reasoning call as SUCCESS, with a runtime that covers the model's
    answer time (MODEL_DELAY_S), not only Celery's tracer."""
    cluster, url = compose_flower
    message = {"role": "assistant", "content": "done", "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    body = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test"}
    model.respond_json({**body, "choices": [choice], "usage": usage}, delay_s=MODEL_DELAY_S)
    task = {
        "goal": "be timed in Flower",
        "provider": {"kind": "openai", "base_url": model.base_url, "model": "gpt-test"},
        "steps": [{"id": "say", "instruction": "say done"}],
        "stagnation": {"enabled": False},
    }
    task_id = cluster.client().submit(task)
    name = f"reason {task_id} say #0 act"

    deadline = time.monotonic() + 90
    listed = _tasks(url)
    while time.monotonic() < deadline and not _done(listed, name):
        time.sleep(0.2)
        listed = _tasks(url)
    shown = _done(listed, name)
    assert shown is not None, (listed, cluster.logs())
    assert MODEL_DELAY_S <= float(shown["runtime"]) < 60, shown


def _done(listed: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The task Flower lists under ``name``, once SUCCESS."""
    found = [t for t in listed.values() if t.get("name") == name]
    return found[0] if found and found[0].get("state") == "SUCCESS" else None
