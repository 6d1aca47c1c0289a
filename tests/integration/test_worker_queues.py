"""Which queues a worker serves: `celery -A orga worker` without -Q serves both, as the README
says, and a coordinator says so when a queue it dispatches to has no consumer. Real processes
against a private Redis."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orga.embedded_redis import EmbeddedRedis
from orga.topology import POOL_PATH
from shared import keys
from shared.outbox import OutboxEntry
from tests.integration.harness import Cluster, Process, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(private_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[Cluster]:
    """A coordinator and no worker yet; the Redis is emptied first (one per module)."""
    with redis.Redis.from_url(private_redis.url) as raw:
        raw.flushdb()
    running = Cluster(private_redis.url, tmp_path)
    try:
        running.coordinator()
        yield running
    finally:
        running.stop()


def _worker_command(name: str, *queue_options: str) -> list[str]:
    """`celery -A orga worker` with only the given queue options, at INFO."""
    return [
        sys.executable, "-m", "celery", "-A", "orga", "worker", *queue_options,
        "-c", "2", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-n", f"{name}-{os.getpid()}@%h",
    ]  # fmt: skip


def _worker(cluster: Cluster, *queue_options: str, name: str = "any") -> Process:
    """`celery -A orga worker` with only the given queue options."""
    command = _worker_command(name, *queue_options)
    log = cluster.root / f"worker-{name}.log"
    process = Process(name, command, cluster._env({}), log).start()
    process.wait_for_log("ready.")
    cluster.processes.append(process)
    return process


def _tool_task() -> dict[str, Any]:
    """Two tool calls (so they go to orga.tools on their own), then an answer."""
    calls = [
        {"name": "run_command", "arguments": {"command": "echo one"}},
        {"name": "run_command", "arguments": {"command": "echo two"}},
    ]
    return {
        "goal": "use the tools",
        "provider": {"kind": "scripted", "replies": [{"tool_calls": calls}, "done"]},
        "steps": [{"id": "s", "instruction": "run them"}],
        "stagnation": {"enabled": False},
    }


def test_a_worker_without_queue_options_serves_both_queues(cluster: Cluster) -> None:
    """`celery -A orga worker` (no -Q) lists and consumes orga.reasoning and orga.tools: a
    task with tool calls completes."""
    worker = _worker(cluster)
    banner = worker.log.read_text()
    assert keys.reasoning_queue in banner and keys.tools_queue in banner, worker.tail()
    client = cluster.client()
    task_id = client.submit(_tool_task())
    result = client.wait(task_id, timeout_s=120)
    assert result["status"] == "completed", cluster.logs()
    assert result["output"] == "done"


def test_a_queue_without_consumer_is_reported(cluster: Cluster) -> None:
    """With only a reasoning worker, the tool calls wait in orga.tools: the coordinator puts a
    `no_consumer` event on orga:events naming the queue and the worker to start; a tool worker
    started then lets the task complete."""
    _worker(cluster, "-Q", keys.reasoning_queue, name="reasoning")
    client = cluster.client()
    task_id = client.submit(_tool_task())

    def reports() -> list[dict[str, str]]:
        return [
            fields
            for _id, fields in client.events()
            if fields.get("event") == "no_consumer" and fields.get("task_id") == task_id
        ]

    wait_until(reports, timeout_s=90, what="a no_consumer event")
    reason = reports()[0]["reason"]
    assert keys.tools_queue in reason and "orga worker --role tools" in reason, reason
    _worker(cluster, "-Q", keys.tools_queue, name="tools")
    assert client.wait(task_id, timeout_s=120)["status"] == "completed", cluster.logs()


def test_a_worker_logs_each_task_only_when_told(cluster: Cluster) -> None:
    """By default a worker logs no line per task (Celery's `received` and `succeeded`), only
    its start; with ORGA_LOG_EACH_TASK=true it logs both for every task it runs."""
    quiet = _worker(cluster, name="quiet")
    client = cluster.client()
    result = client.wait(client.submit(_tool_task()), timeout_s=120)
    assert result["status"] == "completed", cluster.logs()
    text = quiet.log.read_text()
    assert "ready." in text
    assert " received" not in text and " succeeded in " not in text, quiet.tail()
    quiet.stop()
    cluster.processes.remove(quiet)

    command = _worker_command("chatty")
    env = cluster._env({"ORGA_LOG_EACH_TASK": "true"})
    chatty = Process("chatty", command, env, cluster.root / "worker-chatty.log").start()
    chatty.wait_for_log("ready.")
    cluster.processes.append(chatty)
    result = client.wait(client.submit(_tool_task()), timeout_s=120)
    assert result["status"] == "completed", cluster.logs()
    text = chatty.log.read_text()
    assert text.count(" received") >= 3 and text.count(" succeeded in ") >= 3, chatty.tail()


def test_read_only_calls_need_no_tool_worker(cluster: Cluster) -> None:
    """`tool_dispatch: auto` (the default): an iteration whose calls only read runs them in the
    reasoning worker, so a task that only reads completes with no tool worker at all; the same
    task with `tool_dispatch: queue` waits in orga.tools for one."""
    workspace = cluster.root / "reads"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the answer is 42\n")
    calls = [
        {"name": "file_read", "arguments": {"path": "notes.txt"}},
        {"name": "file_list", "arguments": {"path": "."}},
    ]
    task: dict[str, Any] = {
        "goal": "read the notes",
        "provider": {"kind": "scripted", "replies": [{"tool_calls": calls}, "42"]},
        "steps": [{"id": "s", "instruction": "read them"}],
        "tools": ["file_read", "file_list"],
        "workspace": str(workspace),
    }
    _worker(cluster, "-Q", keys.reasoning_queue, name="reasoning")
    client = cluster.client()
    task_id = client.submit(task)
    assert client.wait(task_id, timeout_s=120)["output"] == "42", cluster.logs()
    tools = [m for m in client.record(task_id).conversation.messages if m.role.value == "tool"]
    assert "the answer is 42" in tools[0].content and "notes.txt" in tools[1].content

    queued = client.submit({**task, "tool_dispatch": "queue"})

    def waiting() -> bool:
        return any(
            fields.get("event") == "no_consumer" and fields.get("task_id") == queued
            for _id, fields in client.events()
        )

    wait_until(waiting, timeout_s=90, what="a no_consumer event for the queue-mode task")
    assert client.status(queued)["status"] == "running", cluster.logs()


def test_the_loop_pool_runs_tasks_and_reports_failures_as_celery_does(cluster: Cluster) -> None:
    """The reasoning worker's pool (`-P custom`, workers.pool:LoopPool, what `orga worker`
    starts): a task with tool calls completes; an undecodable payload is dead-lettered and
    its Celery task ends FAILURE (logged by Celery's tracer) and acknowledged, and the worker
    runs on."""
    command = [*_worker_command("loop", "-Q", keys.reasoning_queue), "-P", "custom"]
    env = cluster._env({"CELERY_CUSTOM_WORKER_POOL": POOL_PATH})
    loop = Process("loop", command, env, cluster.root / "worker-loop.log").start()
    loop.wait_for_log("ready.")
    cluster.processes.append(loop)
    assert "(custom)" in loop.log.read_text() or "(pool)" in loop.log.read_text(), loop.tail()
    _worker(cluster, "-Q", keys.tools_queue, name="tools")
    client = cluster.client()
    result = client.wait(client.submit(_tool_task()), timeout_s=120)
    assert result["status"] == "completed", cluster.logs()

    queued = OutboxEntry(
        id="undecodable",
        task=keys.reason_task_name,
        queue=keys.reasoning_queue,
        argsrepr="(x)",
        shadow="x",
        payload="{not json",
    )
    with redis.Redis.from_url(cluster.redis_url) as raw:
        raw.xadd(keys.outbox_stream(0), queued.fields())  # type: ignore[arg-type]

        def dead_lettered() -> bool:
            return any(
                f.get(b"kind") == b"undecodable_payload"
                for _id, f in raw.xrange(keys.dead_letter_stream(0))
            )

        wait_until(dead_lettered, timeout_s=60, what="the undecodable payload dead-lettered")
        wait_until(
            lambda: "DispatchFailedError" in loop.log.read_text(), 30, "Celery's FAILURE line"
        )
        wait_until(lambda: raw.zcard("unacked_index") == 0, 30, "the message acknowledged")
    result = client.wait(client.submit(_tool_task()), timeout_s=120)
    assert result["status"] == "completed", cluster.logs()
