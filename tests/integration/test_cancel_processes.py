"""Cancelling a task kills the commands it runs: real Redis, a real Celery worker and
coordinator, real ``sleep`` processes found in ``/proc``, and ``orga cancel`` in a subprocess.
The worker beats every second (``ORGA_HEARTBEAT_INTERVAL_S=1``): its beat is when it learns that
a task ended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.embedded_redis import EmbeddedRedis
from tests.integration.harness import Cluster, running_cluster, status_of, wait_until

pytestmark = pytest.mark.integration

GONE_WITHIN_S = 10.0
"""A beat (1 s here), the launcher's kill and the worker's poll of /proc: far less than this."""


@pytest.fixture(scope="module")
def beating_cluster(
    private_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A worker that beats every second, and a coordinator."""
    root = tmp_path_factory.mktemp("cancel")
    with running_cluster(
        private_redis.url, root, worker_env={"ORGA_HEARTBEAT_INTERVAL_S": "1"}
    ) as running:
        yield running


def _sleeping(seconds: str) -> list[int]:
    """Pids of the live ``sleep SECONDS`` processes."""
    wanted = f"sleep\0{seconds}\0".encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes() == wanted:
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _ok(done: Any) -> str:
    assert done.returncode == 0, (done.args, done.stdout, done.stderr)
    return str(done.stdout)


def test_orga_cancel_kills_the_commands_the_task_runs(beating_cluster: Cluster) -> None:
    """Two `sleep 40.11` commands of one turn run on the tool worker; `orga cancel` aborts the
    task, and within seconds no such process is left (they would run 40 s on otherwise)."""
    calls = [
        {"name": "run_command", "arguments": {"command": "sleep 40.11", "timeout_s": 60}},
        {"name": "run_command", "arguments": {"command": "sleep 40.11; echo b", "timeout_s": 60}},
    ]
    task = {
        "goal": "sleep twice",
        "steps": [{"id": "s", "instruction": "sleep"}],
        "provider": {"kind": "scripted", "replies": [{"tool_calls": calls}, "slept"]},
        "limits": {"tool_timeout": "60s"},
    }
    client = beating_cluster.client()
    task_id = client.submit(task, task_id="cancel-sleeps")
    wait_until(lambda: len(_sleeping("40.11")) == 2, 60, "both commands running")
    _ok(beating_cluster.orga("cancel", task_id))
    wait_until(lambda: status_of(client, task_id) == "aborted", 30, "the task aborted")
    wait_until(lambda: not _sleeping("40.11"), GONE_WITHIN_S, "the commands killed")


def _sleeper(seconds: str) -> dict[str, Any]:
    return {
        "name": "long-sleeper",
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": f"sleep {seconds}"}}]},
            "slept",
        ]},
        "tools": ["run_command"],
        "limits": {"tool_timeout": "90s", "max_iterations": 3},
    }  # fmt: skip


def test_cancelling_a_parent_kills_the_commands_of_its_children(
    beating_cluster: Cluster, tmp_path: Path
) -> None:
    """A parent waits on two sub-agents, each running `sleep 40.22`; cancelling the parent
    aborts the children, and their commands are killed within seconds."""
    profile = tmp_path / "long-sleeper.json"
    profile.write_text(json.dumps(_sleeper("40.22")))
    _ok(beating_cluster.orga("agents", "add", str(profile), "--replace"))
    delegate = {"agent": "long-sleeper", "goal": "sleep",
                "steps": [{"id": "sleep", "instruction": "sleep"}]}  # fmt: skip
    parent = {
        "goal": "wait on two sleepers",
        "steps": [{"id": "main", "instruction": "delegate"}],
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "delegate", "arguments": delegate}] * 2}, "done"]},
    }  # fmt: skip
    client = beating_cluster.client()
    task_id = client.submit(parent, task_id="cancel-parent")
    wait_until(lambda: len(_sleeping("40.22")) == 2, 90, "both children's commands running")
    _ok(beating_cluster.orga("cancel", task_id))
    children = [f"{task_id}.1", f"{task_id}.2"]
    wait_until(lambda: all(status_of(client, c) == "aborted" for c in children), 30,
               "the children aborted")  # fmt: skip
    wait_until(lambda: not _sleeping("40.22"), GONE_WITHIN_S, "the children's commands killed")
