"""No ancestor of an agent's command holds the model key in its environment, and the key never
reaches the conversation or Redis's files: checked from a real command, which reads
``/proc/PID/environ`` of itself and of every ancestor, under a real `orga run` (the embedded
runtime) and under a real `orga worker` (a deployment), with a model that needs an API key."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orga.embedded_redis import EmbeddedRedis
from shared.task_spec import TaskSpec
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import ORGA, REPO, Cluster, clean_env, wait_until
from workers.key_handoff import MODEL_KEY_VARIABLES

pytestmark = pytest.mark.integration

KEY = "sk-walk-every-ancestor-8d1f2c"

PROBE = """
import os, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
pid = os.getpid()
while pid > 1:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError as exc:
        data = f"UNREADABLE {exc}".encode()
    with open(os.path.join(out, str(pid)), "wb") as handle:
        handle.write(data)
    with open(f"/proc/{pid}/stat") as handle:
        pid = int(handle.read().rsplit(")", 1)[1].split()[1])
print("read the environment of", len(os.listdir(out)), "processes")
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if k not in MODEL_KEY_VARIABLES}
    env.update(COLUMNS="200", ORGA_WORKSPACE_ROOT=str(tmp_path / "workspaces"))
    env.update(extra)
    return env


def _task(tmp_path: Path) -> dict[str, Any]:
    return {
        "goal": "show the environment of every ancestor",
        "provider": {"kind": "openai", "model": "gpt-test"},
        "policy": {"kind": "permissive"},
        "steps": [{"id": "probe", "instruction": "run the probe"}],
    }


@pytest.fixture
def model(tmp_path: Path) -> Iterator[FakeOpenAIServer]:
    """A model that needs KEY: it asks for the probe command once, then answers."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    command = f"python3 {probe} {tmp_path / 'seen'}"
    with FakeOpenAIServer(api_key=KEY) as server:
        server.respond_tool_calls([("c1", "run_command", {"command": command})])
        server.respond_text("probed")
        yield server


def _seen(tmp_path: Path) -> dict[int, bytes]:
    """What the probe read: each process's pid and its initial environment."""
    return {int(p.name): p.read_bytes() for p in (tmp_path / "seen").iterdir()}


def _files_under(*folders: Path) -> Iterator[tuple[Path, bytes]]:
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                yield path, path.read_bytes()


def _assert_no_key(seen: dict[int, bytes], holder: int) -> None:
    """The probe read ``holder`` (the process that was given the key), and no environment it
    read holds the key or a key variable."""
    assert holder in seen, f"{holder} is not an ancestor of the command: {sorted(seen)}"
    assert not seen[holder].startswith(b"UNREADABLE"), seen[holder]
    assert b"ORGA_WORKSPACE_ROOT=" in seen[holder]  # it really is that process's environment
    for pid, environ in seen.items():
        assert KEY.encode() not in environ, f"process {pid} holds the key in its environment"
        names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
        assert not names & MODEL_KEY_VARIABLES, (pid, names & MODEL_KEY_VARIABLES)


def test_orga_run_keeps_the_key_from_every_ancestor_of_a_command(
    tmp_path: Path, model: FakeOpenAIServer
) -> None:
    """`ORGA_API_KEY=… orga run`: the command's ancestors (the CLI among them) have no key in
    their /proc/PID/environ, the model still gets it, and neither the output nor the embedded
    Redis's files (AOF) nor the worker log hold it."""
    home = tmp_path / "home"
    task = tmp_path / "task.yaml"
    task.write_text(yaml.safe_dump(_task(tmp_path)))
    env = _env(
        tmp_path,
        ORGA_HOME=str(home),
        ORGA_PROVIDER="openai",
        ORGA_BASE_URL=model.base_url,
        ORGA_API_KEY=KEY,
    )
    run = subprocess.Popen(
        [str(ORGA), "run", str(task)], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = run.communicate(timeout=180)
    assert run.returncode == 0, stdout + stderr
    assert "probed" in stdout
    assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in model.requests)
    _assert_no_key(_seen(tmp_path), run.pid)
    assert KEY not in stdout + stderr
    for path, data in _files_under(home):
        assert KEY.encode() not in data, f"the key is in {path}"


def test_orga_worker_keeps_the_key_from_every_ancestor_of_a_command(
    tmp_path: Path, model: FakeOpenAIServer, private_redis: EmbeddedRedis
) -> None:
    """`ORGA_API_KEY=… orga worker` (its supervisor, two reasoning workers and a tool worker):
    no ancestor of a command, the supervisor among them, has the key in its environment; the
    reasoning workers still call the model with it; Redis's files do not hold it."""
    cluster = Cluster(private_redis.url, tmp_path / "cluster")
    cluster.root.mkdir()
    env = _env(
        tmp_path,
        ORGA_REDIS_URL=private_redis.url,
        ORGA_PROVIDER="openai",
        ORGA_BASE_URL=model.base_url,
        ORGA_API_KEY=KEY,
    )
    log = tmp_path / "worker.log"
    with log.open("w") as handle:
        worker = subprocess.Popen(
            [str(ORGA), "worker", "--without-gossip", "--without-mingle"],
            env=env, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        cluster.coordinator()
        client = cluster.client()
        task_id = client.submit(TaskSpec.model_validate(_task(tmp_path)))
        result = client.wait(task_id, timeout_s=120)
        assert result["status"] == "completed", (result, log.read_text()[-3000:])
        _assert_no_key(_seen(tmp_path), worker.pid)
        assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in model.requests)
    finally:
        worker.terminate()
        worker.wait(30)
        cluster.stop()
    client.redis.bgrewriteaof()
    wait_until(
        lambda: client.redis.info("persistence")["aof_rewrite_in_progress"] == 0,
        what="the AOF rewrite",
    )
    assert private_redis.directory is not None
    for path, data in _files_under(private_redis.directory):
        assert KEY.encode() not in data, f"the key is in {path}"
