"""An `orga run` on the embedded runtime that stops before its task ends leaves nothing behind:
at its --timeout it cancels the task and says so, SIGTERM stops its redis-server and workers,
and `orga cancel` works on a task of the embedded runtime. Real subprocesses throughout."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.client import OrgaClient
from orga.embedded import EmbeddedRuntime
from orga.embedded_redis import EmbeddedRedis
from shared.settings import OrgaSettings
from tests.integration.harness import (
    ORGA,
    PARTITIONS,
    REPO,
    Cluster,
    clean_env,
    run_orga,
    status_of,
    wait_until,
)

pytestmark = pytest.mark.integration


def _env(tmp_path: Path) -> dict[str, str]:
    env = clean_env()
    env.update(
        COLUMNS="200",
        ORGA_HOME=str(tmp_path / "home"),
        ORGA_WORKSPACE_ROOT=str(tmp_path / "workspaces"),
        ORGA_HEARTBEAT_INTERVAL_S="1",
    )
    return env


def _sleeper(seconds: str) -> dict[str, Any]:
    command = {"command": f"sleep {seconds}", "timeout_s": 90}
    return {
        "goal": "sleep a long time",
        "steps": [{"id": "s", "instruction": "sleep"}],
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command", "arguments": command}]}, "slept"]},
        "limits": {"tool_timeout": "90s"},
    }  # fmt: skip


def _task_file(tmp_path: Path, task: dict[str, Any]) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


def _task_id(output: str) -> str:
    first = output.splitlines()[0]
    assert first.startswith("task "), output
    return first.split()[1].rstrip(":")


def _pids_running(name: str, seconds: str | None = None) -> list[int]:
    """Live processes named ``name`` (``/proc/PID/comm``), with ``seconds`` as their first
    argument when given."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() != name:
                continue
            words = (comm.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if seconds is None or words[1:2] == [seconds.encode()]:
            found.append(int(comm.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(pid: int) -> list[int]:
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        children = []
        for path in Path(f"/proc/{parent}/task").glob("*/children"):  # any thread's children
            try:
                children += [int(p) for p in path.read_text().split()]
            except OSError:
                continue
        found += children
        pending += children
    return found


def test_run_timeout_cancels_the_task_and_says_so(tmp_path: Path) -> None:
    """`orga run --timeout 6` of a task that sleeps 30 s: exit 4, a message naming the task,
    the timeout and that it was cancelled; the task is aborted, so no later `orga` command on
    this ORGA_HOME runs it; its command is gone."""
    env = _env(tmp_path)
    run = run_orga("run", "--timeout", "6", str(_task_file(tmp_path, _sleeper("30.33"))), env=env)
    assert run.returncode == 4, run.stdout + run.stderr
    task_id = _task_id(run.stdout)
    message = " ".join(run.stderr.split())
    assert f"task {task_id} did not finish within 6s: cancelled it (aborted" in message
    status = run_orga("status", task_id, env=env)
    assert '"status": "aborted"' in status.stdout, status.stdout
    wait_until(lambda: not _pids_running("sleep", "30.33"), 10, "the command gone")


def test_sigterm_stops_the_embedded_redis_and_workers_and_cancels_the_task(
    tmp_path: Path,
) -> None:
    """`orga run` told to stop with SIGTERM (as `timeout 25 orga run` does) runs its normal
    shutdown: its redis-server and its workers are gone, it exits 143, and the task was
    cancelled (aborted) rather than left to resume in a later command."""
    env = _env(tmp_path)
    task = _task_file(tmp_path, _sleeper("30.44"))
    run = subprocess.Popen(
        [str(ORGA), "run", str(task)], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    started: list[int] = []
    try:
        wait_until(lambda: bool(_pids_running("sleep", "30.44")), 90, "the command running")
        started = _descendants(run.pid)
        servers = [p for p in started if p in _pids_running("redis-server")]
        assert len(servers) == 1, started
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=60)
        assert run.returncode == 128 + signal.SIGTERM, stdout + stderr
        wait_until(lambda: not any(_alive(p) for p in started), 15, "the runtime's processes gone")
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate()
        for pid in started:  # what this test started, left behind by a failure
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    task_id = _task_id(stdout)
    assert f"task {task_id} was interrupted (SIGTERM): cancelled it (aborted" in " ".join(
        stderr.split()
    )
    status = run_orga("status", task_id, env=env)
    assert '"status": "aborted"' in status.stdout, status.stdout


def _leave_running(env: dict[str, str]) -> str:
    """A task left running in ORGA_HOME: accepted by an embedded coordinator that then stopped
    (no worker ran it); its id."""
    settings = OrgaSettings(workspace_root=env["ORGA_WORKSPACE_ROOT"], partitions=PARTITIONS)

    async def leave_running() -> str:
        async with EmbeddedRuntime(settings, Path(env["ORGA_HOME"]), start_worker=False) as rt:
            client = OrgaClient(rt.url, partitions=PARTITIONS)
            task_id = client.submit(_sleeper("30.55"))
            await asyncio.to_thread(
                wait_until, lambda: status_of(client, task_id) == "running", 30, "accepted"
            )
            return task_id

    return asyncio.run(leave_running())


def test_sigterm_stops_a_reading_command_and_its_redis(tmp_path: Path) -> None:
    """`orga journal ID --follow` on the embedded runtime, told to stop with SIGTERM: it exits
    143 and its redis-server is gone."""
    env = _env(tmp_path)
    task_id = _leave_running(env)
    follow = subprocess.Popen(
        [str(ORGA), "journal", task_id, "--follow"], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    started: list[int] = []
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline().startswith("{")  # an entry: the runtime is up
        started = _descendants(follow.pid)
        assert [p for p in started if p in _pids_running("redis-server")], started
        follow.send_signal(signal.SIGTERM)
        follow.wait(60)
        assert follow.returncode == 128 + signal.SIGTERM
        wait_until(lambda: not any(_alive(p) for p in started), 15, "its redis-server gone")
    finally:
        if follow.poll() is None:
            follow.kill()
        follow.communicate()
        for pid in started:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_orga_cancel_cancels_a_task_of_the_embedded_runtime(tmp_path: Path) -> None:
    """A task left running in ORGA_HOME (accepted by an embedded coordinator that then
    stopped) is cancelled by `orga cancel ID` with that ORGA_HOME and no ORGA_REDIS_URL."""
    env = _env(tmp_path)
    task_id = _leave_running(env)
    cancelled = run_orga("cancel", task_id, env=env)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"task {task_id} aborted" in cancelled.stdout
    status = run_orga("status", task_id, env=env)
    assert '"status": "aborted"' in status.stdout, status.stdout


def test_run_timeout_on_a_deployment_prints_how_to_stop_the_task(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """With ORGA_REDIS_URL the task runs on after `orga run --timeout 3` (exit 4): the message
    names it and prints the `orga cancel` command, which, run as printed, cancels it."""
    cluster = Cluster(private_redis.url, tmp_path / "cluster")
    cluster.root.mkdir()
    env = {**_env(tmp_path), "ORGA_REDIS_URL": private_redis.url}
    try:
        cluster.coordinator()  # and no worker: the task waits for its model call
        run = run_orga(
            "run", "--timeout", "3", str(_task_file(tmp_path, _sleeper("30.66"))), env=env
        )
        assert run.returncode == 4, run.stdout + run.stderr
        task_id = _task_id(run.stdout)
        lines = run.stderr.splitlines()
        assert f"task {task_id} did not finish within 3s; it is still running" in lines[0]
        assert lines[1] == "stop it with:"
        command = shlex.split(lines[2])
        assert command[-2:] == ["cancel", task_id] and Path(command[0]).is_absolute()
        sent = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert sent.returncode == 0, sent.stderr
        client = cluster.client()
        wait_until(lambda: status_of(client, task_id) == "aborted", 30, "the task aborted")
    finally:
        cluster.stop()
