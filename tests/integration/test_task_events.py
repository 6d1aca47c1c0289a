"""Task events from real, otherwise idle workers (no worker heartbeat, no gossip: nothing else
wakes their event loop) reach a receiver (Flower's kind) about one flush window after they
happen, the last one of a call included: a prefork worker (`celery -A orga worker`, the
harness's) and the reasoning worker's own pool (`orga worker --role reasoning`).

A Redis worker's hub also wakes once a second for its broker's ``BRPOP``, so these bound the
end-to-end lag; that the flush does not wait for anything to wake the hub is shown on a hub
idle in a 10 s poll by ``tests/workers/test_events.py``."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from orga.embedded_redis import EmbeddedRedis
from tests.integration.harness import Cluster, Process, wait_until
from workers.events import FLUSH_INTERVAL_S

pytestmark = pytest.mark.integration

LAG_BOUND_S = FLUSH_INTERVAL_S + 1.4
"""The longest an event may take from its creation in the worker to the receiver: the window,
the publish and the receiver's read, on a loaded machine (the bug this guards against kept
the last events of a burst for tens of seconds)."""

QUIET = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


class _Receiver:
    """An event receiver on the workers' broker, in a thread of its own: each task event with
    the wall time it arrived (the events carry the wall time they were made, ``timestamp``)."""

    def __init__(self, redis_url: str) -> None:
        self.events: list[tuple[dict[str, Any], float]] = []
        self._app = Celery("tests-task-events", broker=redis_url, set_as_current=False)
        self._receivers: list[Any] = []
        ready = threading.Event()

        def receive() -> None:
            with self._app.connection() as connection:
                receiver = self._app.events.Receiver(connection, handlers={"*": self._on_event})
                self._receivers.append(receiver)
                ready.set()
                receiver.capture(limit=None, timeout=None, wakeup=False)

        self._thread = threading.Thread(target=receive, daemon=True)
        self._thread.start()
        assert ready.wait(10)
        time.sleep(0.5)  # the receiver subscribes after it built its consumer

    def _on_event(self, event: dict[str, Any]) -> None:
        if event["type"].startswith("task-"):
            self.events.append((event, time.time()))

    def of(self, name_part: str) -> dict[str, tuple[dict[str, Any], float]]:
        """The events (by type) of the task whose ``task-received`` names ``name_part``."""
        ids = {
            e["uuid"]
            for e, _ in self.events
            if e["type"] == "task-received" and name_part in str(e.get("name"))
        }
        return {e["type"]: (e, at) for e, at in self.events if e["uuid"] in ids}

    def stop(self) -> None:
        for receiver in self._receivers:
            receiver.should_stop = True
        self._thread.join(5)
        self._app.close()


@pytest.fixture
def quiet_cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    with redis.Redis.from_url(private_redis.url) as raw:
        raw.flushdb()
    cluster = Cluster(private_redis.url, tmp_path)
    try:
        yield cluster
    finally:
        cluster.stop()


def _start_worker(cluster: Cluster, kind: str) -> None:
    if kind == "prefork":
        cluster.worker(concurrency=2)  # celery -A orga worker, both queues, quiet options
        return
    command = [
        sys.executable, "-m", "orga.cli", "worker", "--role", "reasoning",
        "-n", f"reasoning-{os.getpid()}@%h", *QUIET,
    ]  # fmt: skip
    env = cluster._env({"ORGA_REASONING_PROCESSES": "1"})
    worker = Process("reasoning", command, env, cluster.root / "reasoning.log").start()
    cluster.processes.append(worker)
    worker.wait_for_log("ready.", timeout_s=60)


@pytest.mark.parametrize("kind", ["prefork", "reasoning-pool"])
def test_an_idle_workers_last_task_events_arrive_within_about_a_window(
    quiet_cluster: Cluster, private_redis: EmbeddedRedis, kind: str
) -> None:
    cluster = quiet_cluster
    _start_worker(cluster, kind)
    cluster.coordinator()
    receiver = _Receiver(private_redis.url)
    try:
        client = cluster.client()
        task_id = client.submit(
            {
                "goal": "be seen at once",
                "provider": {"kind": "scripted", "replies": ["done"]},
                "steps": [{"id": "say", "instruction": "say done"}],
                "stagnation": {"enabled": False},
            }
        )
        assert client.wait(task_id, timeout_s=120)["status"] == "completed", cluster.logs()
        wanted = {"task-received", "task-started", "task-succeeded"}
        wait_until(
            lambda: wanted <= set(receiver.of(f"reason {task_id}")),
            timeout_s=30,
            what="the reasoning call's three task events",
        )
        seen = receiver.of(f"reason {task_id}")
    finally:
        receiver.stop()
    lags = {kind: round(at - event["timestamp"], 3) for kind, (event, at) in seen.items()}
    assert all(lag < LAG_BOUND_S for lag in lags.values()), lags
