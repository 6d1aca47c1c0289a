"""Crashes: a coordinator and a worker killed with SIGKILL mid-task; the task still completes,
its journal has no gap and no iteration is applied twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orga.embedded_redis import EmbeddedRedis
from shared import keys
from tests.integration.harness import (
    REPO,
    Cluster,
    assert_journal_is_clean,
    clean_env,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration


def _slow_task(iterations: int, sleep_s: float) -> dict[str, Any]:
    replies: list[Any] = [
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": f"sleep {sleep_s}; echo {i}"}}
            ]
        }
        for i in range(iterations)
    ]
    return {
        "goal": "survive crashes",
        "provider": {"kind": "scripted", "replies": [*replies, "finished"]},
        "steps": [{"id": "work", "instruction": "run the commands"}],
        "limits": {"max_iterations": iterations + 5},
        "stagnation": {"enabled": False},
    }


@pytest.fixture
def fresh_cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of its own for each crash test (the processes get killed)."""
    running = Cluster(private_redis.url, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _iterations(cluster: Cluster, task_id: str) -> int:
    try:
        return cluster.client().record(task_id).iteration
    except Exception:
        return -1


def test_coordinator_killed_mid_task_resumes_after_restart(fresh_cluster: Cluster) -> None:
    """SIGKILL the coordinator while a task runs; a new one takes the lease over and finishes it."""
    fresh_cluster.worker(name="wk1")
    first = fresh_cluster.coordinator(name="c1")
    client = fresh_cluster.client()
    task_id = client.submit(_slow_task(iterations=8, sleep_s=0.2))
    wait_until(lambda: _iterations(fresh_cluster, task_id) >= 3, 60, "three iterations")
    first.kill()
    fresh_cluster.coordinator(name="c2")
    result = client.wait(task_id, timeout_s=90)
    assert result["status"] == "completed", fresh_cluster.logs()
    assert result["output"] == "finished"
    entries = client.journal(task_id)
    assert_journal_is_clean(entries)
    assert [e.iteration for e in entries if e.event.type == "ReasoningComplete"] == list(
        range(1, 10)
    )


def test_worker_killed_mid_iteration_is_redelivered(fresh_cluster: Cluster) -> None:
    """SIGKILL the pool process running a tool call; the call runs again and the task completes."""
    worker = fresh_cluster.worker(name="wk2", concurrency=1)
    fresh_cluster.coordinator(name="c3")
    client = fresh_cluster.client()
    task_id = client.submit(_slow_task(iterations=3, sleep_s=1.5))
    wait_until(lambda: _iterations(fresh_cluster, task_id) >= 1, 60, "the first tool call")
    wait_until(lambda: bool(worker.children()), 10, "a pool process")
    for child in worker.children():
        os.kill(child, signal.SIGKILL)
    result = client.wait(task_id, timeout_s=120)
    assert result["status"] == "completed", fresh_cluster.logs()
    assert_journal_is_clean(client.journal(task_id))
    events = [f["event"] for _i, f in client.events() if f.get("task_id") == task_id]
    assert events[-1] == "completed"


def test_make_run_example_runs_on_the_embedded_runtime(tmp_path: Path) -> None:
    """What `make run` does: `orga run` with no ORGA_REDIS_URL starts its own Redis and worker."""
    env = clean_env()
    env.update({"ORGA_HOME": str(tmp_path / "home"), "ORGA_WORKSPACE_ROOT": str(tmp_path / "ws")})
    command = [sys.executable, "-m", "orga.cli", "run"]
    bugfix = subprocess.run(
        [*command, "examples/bugfix/task.yaml", "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bugfix.returncode == 0, bugfix.stderr
    assert '"step:verify"' in bugfix.stdout
    wanderer = subprocess.run(
        [*command, "examples/wanderer/task.yaml"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert wanderer.returncode == 3, wanderer.stdout + wanderer.stderr
    assert "orga review decide" in wanderer.stdout


def test_two_coordinators_share_the_work(fresh_cluster: Cluster) -> None:
    """Two coordinators run at once on the same streams; every task completes exactly once."""
    fresh_cluster.worker(name="wk3")
    fresh_cluster.coordinator(name="c4")
    fresh_cluster.coordinator(name="c5")
    client = fresh_cluster.client()
    ids = [client.submit(_slow_task(iterations=4, sleep_s=0.05)) for _ in range(12)]
    for task_id in ids:
        assert client.wait(task_id, timeout_s=120)["status"] == "completed", fresh_cluster.logs()
        assert_journal_is_clean(client.journal(task_id))


@pytest.mark.timeout(300)
def test_an_out_of_memory_redis_loses_no_submission_and_no_process(
    fresh_cluster: Cluster,
) -> None:
    """Redis refusing every write (maxmemory 1) for 12 s while tasks run and five fresh
    submissions wait to be read: afterwards every task completes, nothing is dead-lettered or
    rejected, and the coordinator and the worker are still the processes started. (Dispatches
    whose worker could not report during the episode are re-sent once their heartbeats say
    they are lost: a 3 s heartbeat timeout keeps that short.)"""
    worker = fresh_cluster.worker(name="wk1", ORGA_HEARTBEAT_INTERVAL_S="0.5")
    coordinator = fresh_cluster.coordinator(name="c1", ORGA_HEARTBEAT_TIMEOUT_S="3")
    client = fresh_cluster.client()
    running = [client.submit(_slow_task(iterations=6, sleep_s=0.3)) for _ in range(2)]
    wait_until(lambda: all(_iterations(fresh_cluster, t) >= 1 for t in running), 60, "started")
    fresh = [client.submit(_slow_task(iterations=2, sleep_s=0.1)) for _ in range(5)]
    raw = redis.Redis.from_url(fresh_cluster.redis_url)
    raw.config_set("maxmemory", 1)
    try:
        time.sleep(12)
    finally:
        raw.config_set("maxmemory", 0)
    for task_id in [*running, *fresh]:
        try:
            wait_until(
                lambda t=task_id: status_of(client, t) in ("completed", "failed", "aborted"),
                90,
                f"task {task_id} to end",
            )
        except AssertionError as exc:
            events = [f for _i, f in client.events(count=100_000) if f.get("task_id") == task_id]
            raise AssertionError(f"{exc}: {client.status(task_id)} {events}") from exc
        assert client.result(task_id)["status"] == "completed", fresh_cluster.logs()
    partitions = client.partition_count
    for stream in [
        *keys.partition_streams(partitions, keys.dead_letter_stream),
        *keys.partition_streams(partitions, keys.rejected_stream),
    ]:
        assert raw.xlen(stream) == 0, (stream, raw.xrange(stream, count=5))
    raw.close()
    assert worker.popen is not None and worker.popen.poll() is None, worker.tail()
    assert coordinator.popen is not None and coordinator.popen.poll() is None, coordinator.tail()
