"""Flower as an operator runs it (`celery -A orga flower`, basic auth) against a real worker
and a private Redis: its task list, read over its HTTP API, names each dispatch by task, step,
iteration and purpose, and a reasoning call that failed on configuration is FAILURE."""

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
    with redis.Redis.from_url(private_redis.url) as raw:
        raw.flushdb()
    cluster = Cluster(private_redis.url, tmp_path)
    port = _free_port()
    command = [
        sys.executable, "-m", "celery", "-A", "orga", "flower", "--address=127.0.0.1",
        f"--port={port}", f"--basic-auth={AUTH[0]}:{AUTH[1]}",
    ]  # fmt: skip
    try:
        _events_worker(cluster)
        cluster.coordinator()
        process = Process("flower", command, cluster._env({}), tmp_path / "flower.log").start()
        cluster.processes.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url), timeout_s=60, what="Flower to answer")
        yield cluster, url
    finally:
        cluster.stop()


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
    deadline = time.monotonic() + 60
    seen = names_and_states()
    while time.monotonic() < deadline and not (wanted <= set(seen) and failed_name in seen):
        time.sleep(0.5)
        seen = names_and_states()
    assert wanted <= set(seen), seen
    assert all(seen[name] == "SUCCESS" for name in wanted), seen
    assert seen[failed_name] == "FAILURE", seen
    failure = next(t for t in _tasks(url).values() if t.get("name") == failed_name)
    assert "no-such-script.yaml" in str(failure.get("exception")), failure
