"""Review of branch ``mem``: a cold shutdown of a thread-pool tool worker."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import Cluster, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    raw = redis.Redis.from_url(private_redis.url)
    raw.flushall()  # the previous variant's task is still pending there
    raw.close()
    running = Cluster(private_redis.url, tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_cold_shutdown_stops_a_worker_running_a_long_call(
    fresh_cluster: Cluster, tmp_path: Path, pool: str
) -> None:
    """SIGQUIT (Celery's cold shutdown: what the supervisor sends on a second SIGTERM or
    SIGINT, docs/deploy.md) stops a worker at once, its running call abandoned (the
    coordinator re-sends it), whatever its pool: not after the call's 150 s."""
    marker = tmp_path / "started"
    task = {
        "goal": "a long command",
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command",
                             "arguments": {"command": f"touch {marker}; sleep 120"}}]},
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
    worker.popen.send_signal(signal.SIGQUIT)
    try:
        worker.popen.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {pool} worker still runs 20 s after SIGQUIT:\n{worker.tail()}")
