"""The Prometheus endpoint of a real coordinator is fed by the work it applies: latency
histograms (model call, tool call, iteration, dispatch to applied) after a task ran."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import Cluster, running_cluster, status_of, wait_until

pytestmark = pytest.mark.integration


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


def _count(text: str, name: str) -> float:
    """The sum of ``{name}_count`` samples over all label sets."""
    pattern = re.compile(rf"^{name}_count(?:{{[^}}]*}})? ([0-9.e+]+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def test_the_latency_histograms_are_fed_by_a_real_run(cluster: Cluster, metrics_port: int) -> None:
    """Two iterations (a tool call, then an answer): every histogram has observations; the
    queue gauge reads the Redis broker's queues, empty once the work is done."""
    client = cluster.client()
    write = {"name": "file_write", "arguments": {"path": "a.txt", "content": "hi"}}
    other = {"name": "file_list", "arguments": {}}
    task_id = client.submit(
        {
            "goal": "write",
            "provider": {"kind": "scripted", "replies": [{"tool_calls": [write, other]}, "done"]},
            "steps": [{"id": "s", "instruction": "write"}],
        }
    )
    wait_until(lambda: status_of(client, task_id) == "completed", timeout_s=60, what="done")
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    for name in (
        "orga_model_call_duration_seconds",
        "orga_tool_call_duration_seconds",
        "orga_iteration_duration_seconds",
        "orga_dispatch_to_applied_seconds",
    ):
        assert _count(text, name) >= 1, (name, [n for n in text.splitlines() if name in n])
    # the queues' depths, asked of the broker (the Redis the worker consumes: drained by now)
    for queue in ("orga.reasoning", "orga.tools"):
        assert re.search(rf'^orga_queue_depth{{queue="{queue}"}} 0\.0$', text, re.M), text
    assert re.search(r"^orga_broker_up 1\.0$", text, re.M), text
