"""Crashes: a coordinator and a worker killed with SIGKILL mid-task; the task still completes,
its journal has no gap and no iteration is applied twice."""

from __future__ import annotations

import contextlib
import json
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


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, frontier = [pid], [pid]
    while frontier:
        below = [child for child, parent in parents.items() if parent in frontier]
        tree += below
        frontier = below
    return tree


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_killed_with_its_messages_is_recovered_by_the_coordinators_re_send(
    fresh_cluster: Cluster, tmp_path: Path, pool: str
) -> None:
    """SIGKILL to a whole worker (its consumer and pool) while it runs a tool call: without
    kombu's ack emulation nothing of that message is left in Redis (no unacked hash, the queue
    empty); the coordinator judges the dispatch lost once its heartbeats stop and re-sends it,
    and a new worker completes the task, within the observation deadline plus the heartbeat
    timeout (6 s + 3 s here) and a margin, not after any visibility timeout. The same for the
    thread pool (the default tool worker's, issue 27): its one process is the whole worker."""
    marker = tmp_path / "ran-once"
    command = f"if [ -e {marker} ]; then echo again; else touch {marker}; sleep 120; fi"
    task = {
        "goal": "survive a killed worker",
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            "finished"]},
        "steps": [{"id": "work", "instruction": "run the command"}],
        "limits": {"tool_timeout": "150s"},
        "stagnation": {"enabled": False},
    }  # fmt: skip
    beats = {"ORGA_HEARTBEAT_INTERVAL_S": "0.5"}
    worker = fresh_cluster.worker(name="wk5", concurrency=1, pool=pool, **beats)
    fresh_cluster.coordinator(name="c5", ORGA_HEARTBEAT_TIMEOUT_S="3")
    client = fresh_cluster.client()
    task_id = client.submit(task)
    wait_until(marker.exists, 60, "the tool call to start")
    for pid in _process_tree(worker.pid):
        # a child may already be gone: killed with its parent (its parent-death signal)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert worker.popen is not None
    worker.popen.wait(10)
    raw = redis.Redis.from_url(fresh_cluster.redis_url)
    assert raw.llen(keys.tools_queue) == 0
    assert not raw.keys("unacked*"), raw.keys("unacked*")
    raw.close()
    fresh_cluster.worker(name="wk6", concurrency=1, pool=pool, **beats)
    result = client.wait(task_id, timeout_s=60)
    recovered_s = time.monotonic() - killed_at
    assert result["status"] == "completed", fresh_cluster.logs()
    assert recovered_s < 6 + 3 + 15, recovered_s
    assert_journal_is_clean(client.journal(task_id))


def test_a_warm_stop_pushes_back_a_message_fetched_and_not_started(
    fresh_cluster: Cluster,
) -> None:
    """SIGTERM (Celery's warm shutdown) to a worker holding a message it fetched and has not
    started (one sent with a countdown: the worker holds it until its ETA): without kombu's
    ack emulation the worker's channel still pushes it back to its queue as it closes, at once,
    not after the coordinator's re-send."""
    from celery import Celery

    worker = fresh_cluster.worker(name="wk7", concurrency=1)
    sender = Celery("sender", broker=fresh_cluster.redis_url)
    sent = sender.send_task(keys.tool_task_name, args=[{}], queue=keys.tools_queue, countdown=300)
    raw = redis.Redis.from_url(fresh_cluster.redis_url)
    wait_until(lambda: raw.llen(keys.tools_queue) == 0, 30, "the worker to fetch the message")
    time.sleep(0.5)  # received and held for its ETA
    assert worker.popen is not None
    worker.popen.send_signal(signal.SIGTERM)
    worker.popen.wait(30)
    queued = raw.lrange(keys.tools_queue, 0, -1)
    raw.close()
    assert len(queued) == 1, worker.tail()
    assert json.loads(queued[0])["headers"]["id"] == sent.id


@pytest.mark.parametrize(
    ("pool", "sent"),
    [
        ("prefork", ["SIGQUIT"]),
        ("threads", ["SIGQUIT"]),
        ("threads", ["SIGTERM", "SIGQUIT"]),
        ("threads", ["SIGINT", "SIGINT"]),
    ],
    ids=["prefork-SIGQUIT", "threads-SIGQUIT", "threads-SIGTERM-SIGQUIT", "threads-SIGINT-SIGINT"],
)
def test_a_cold_shutdown_stops_a_worker_running_a_long_call(
    fresh_cluster: Cluster, tmp_path: Path, pool: str, sent: list[str]
) -> None:
    """SIGQUIT (Celery's cold shutdown: what the supervisor sends on a second SIGTERM or
    SIGINT, docs/deploy.md), also during a warm shutdown, and a second SIGINT (Ctrl-C twice)
    stop a worker at once, its running call abandoned and its command killed, whatever its
    pool: not after the call's 150 s. The call's message goes back to its queue (a prefork
    pool process killed; a thread-pool call cancelled and rejected)."""
    raw = redis.Redis.from_url(fresh_cluster.redis_url)
    raw.flushall()  # the other variant's task is still pending there
    marker = tmp_path / "started"
    task = {
        "goal": "a long command",
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command",
                             "arguments": {"command": f"touch {marker}; exec sleep 121"}}]},
            "finished"]},
        "steps": [{"id": "work", "instruction": "run the command"}],
        "limits": {"tool_timeout": "150s"},
        "stagnation": {"enabled": False},
    }  # fmt: skip
    worker = fresh_cluster.worker(name="cold", concurrency=1, pool=pool)
    fresh_cluster.coordinator(name="c1")
    fresh_cluster.client().submit(task)
    wait_until(marker.exists, 60, "the tool call to start")
    assert worker.popen is not None
    for name in sent:
        worker.popen.send_signal(signal.Signals[name])
        time.sleep(0.5)  # one signal handled before the next
    try:
        worker.popen.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {pool} worker still runs 20 s after {sent}:\n{worker.tail()}")
    wait_until(lambda: not _sleeping(121), 10, "the call's command to be killed")
    queued = raw.lrange(keys.tools_queue, 0, -1)
    raw.close()
    assert len(queued) == 1, worker.tail()


def _sleeping(seconds: int) -> bool:
    """Whether a ``sleep {seconds}`` process runs on this machine."""
    found = subprocess.run(
        ["pgrep", "-x", "-f", f"sleep {seconds}"], check=False, capture_output=True
    )
    return found.returncode == 0
