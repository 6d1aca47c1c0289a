"""No ancestor of an agent's command holds the model key, nor a secret of the serving side (the
API's tokens, the webhooks' secrets, the inbox's credentials), in its environment, and the key
never reaches the conversation or Redis's files: checked from a real command, which reads
``/proc/PID/environ`` of itself and of every ancestor, under a real `orga run` and a real
`orga api` (the embedded runtime) and under a real `orga worker` (a deployment), with a model
that needs an API key. Nor does any ancestor hold the Redis password (`orga worker`'s, in its
ORGA_REDIS_URL; the embedded runtime's, made up by `orga run`), and a command's PING without
it is refused."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orga.embedded_redis import EmbeddedRedis, find_redis_server
from shared.task_spec import TaskSpec
from tests.fakes.llm_server import FakeOpenAIServer
from tests.integration.harness import ORGA, REPO, Cluster, Process, clean_env, wait_until
from workers.key_handoff import (
    CONNECTION_URL_VARIABLES,
    MODEL_KEY_VARIABLES,
    PROCESS_SECRET_VARIABLES,
)

pytestmark = pytest.mark.integration

KEY = "sk-walk-every-ancestor-8d1f2c"
REDIS_PASSWORD = "redis-walk-every-ancestor-5b9e03"
"""`orga worker`'s Redis's ``requirepass``, in its ORGA_REDIS_URL."""
API_TOKEN = "api-walk-every-ancestor-0123456789"
WEBHOOK_SECRET = "whsec-walk-every-ancestor-4e7a91"
SECRETS = {
    "ORGA_API_TOKENS": f"api-walk-another-token-9876543210,{API_TOKEN}",
    "ORGA_WEBHOOKS": json.dumps(
        [{"url": "http://127.0.0.1:9/hook", "events": ["review_opened"], "secret": WEBHOOK_SECRET}]
    ),
    "ORGA_INBOX_TOKEN": "inbox-walk-every-ancestor-0123456789",
    "ORGA_INBOX_BASIC_AUTH": "ann:inbox-walk-password-0123456789",
    "ORGA_INBOX_SECRET": "inbox-walk-session-secret-0123456789",
}
"""The serving side's secrets, given to every command under test: none may reach a worker."""
SECRET_VALUES = [KEY, API_TOKEN, WEBHOOK_SECRET, *list(SECRETS.values())[2:]]

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
# The Redis serving sys.argv[2] (its working directory; its command line is its title,
# `redis-server 127.0.0.1:PORT`), asked for PING without a password.
for entry in os.listdir("/proc"):
    try:
        if os.readlink(f"/proc/{entry}/cwd") != sys.argv[2]:
            continue
        with open(f"/proc/{entry}/cmdline", "rb") as handle:
            title = handle.read().replace(b"\\0", b" ").decode().strip()
    except (OSError, ValueError):
        continue
    if "redis-server" in title:
        import socket
        port = int(title.rsplit(":", 1)[1].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"PING\\r\\n")
            reply = sock.recv(100)
        with open(out + ".redis", "wb") as handle:
            handle.write(title.encode() + b"\\n" + reply)
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    hidden = MODEL_KEY_VARIABLES | PROCESS_SECRET_VARIABLES
    env = {k: v for k, v in clean_env().items() if k.upper() not in hidden}
    env.update(COLUMNS="200", ORGA_WORKSPACE_ROOT=str(tmp_path / "workspaces"))
    env.update(SECRETS)
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
    command = f"python3 {probe} {tmp_path / 'seen'} {_redis_dir(tmp_path)}"
    with FakeOpenAIServer(api_key=KEY) as server:
        server.respond_tool_calls([("c1", "run_command", {"command": command})])
        server.respond_text("probed")
        yield server


def _redis_dir(tmp_path: Path) -> Path:
    """Where the Redis of a test keeps its files: the embedded runtime's under ORGA_HOME, and
    the deployment's Redis of `orga worker`'s test."""
    return tmp_path / "home" / "redis"


def _redis_reply(tmp_path: Path) -> tuple[bytes, bytes]:
    """The command line (its title, which Redis rewrites: not the argv it was given) of the
    Redis the probe found, and its answer to a PING without the password."""
    argv, _, reply = (tmp_path / "seen.redis").read_bytes().partition(b"\n")
    return argv, reply


def _recording_redis_server(tmp_path: Path) -> Path:
    """A folder holding a ``redis-server`` that appends its argv (one argument a line, then a
    line ``END-OF-ARGV``) to ``tmp_path/redis-argv`` and runs the real one: the argv handed
    to it."""
    folder = tmp_path / "recording-bin"
    folder.mkdir()
    script = folder / "redis-server"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$@\" >> '{tmp_path / 'redis-argv'}'\n"
        f"printf 'END-OF-ARGV\\n' >> '{tmp_path / 'redis-argv'}'\n"
        f'exec "{find_redis_server()}" "$@"\n'
    )
    script.chmod(0o755)
    return folder


def _seen(tmp_path: Path) -> dict[int, bytes]:
    """What the probe read: each process's pid and its initial environment."""
    return {int(p.name): p.read_bytes() for p in (tmp_path / "seen").iterdir()}


def _files_under(*folders: Path) -> Iterator[tuple[Path, bytes]]:
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                yield path, path.read_bytes()


def _assert_no_key(seen: dict[int, bytes], holder: int, *also: str) -> None:
    """The probe read ``holder`` (the process that was given the key), and no environment it
    read holds the key, a secret of the serving side, a connection URL (``ORGA_REDIS_URL``,
    ``ORGA_BROKER_URL``), ``also``, or a variable of any of them."""
    assert holder in seen, f"{holder} is not an ancestor of the command: {sorted(seen)}"
    assert not seen[holder].startswith(b"UNREADABLE"), seen[holder]
    assert b"ORGA_WORKSPACE_ROOT=" in seen[holder]  # it really is that process's environment
    for pid, environ in seen.items():
        for secret in [*SECRET_VALUES, *also]:
            assert secret.encode() not in environ, f"process {pid} holds {secret!r}"
        names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
        hidden = MODEL_KEY_VARIABLES | PROCESS_SECRET_VARIABLES | CONNECTION_URL_VARIABLES
        assert not {name.upper() for name in names} & hidden, (pid, names)


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
    env["PATH"] = f"{_recording_redis_server(tmp_path)}:{env.get('PATH', '')}"
    run = subprocess.Popen(
        [str(ORGA), "run", str(task)], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = run.communicate(timeout=180)
    assert run.returncode == 0, stdout + stderr
    assert "probed" in stdout
    assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in model.requests)
    _assert_no_key(_seen(tmp_path), run.pid)
    # The embedded Redis wants the password this run made up, which no command can read.
    _, reply = _redis_reply(tmp_path)
    assert reply.startswith(b"-NOAUTH"), reply
    # The argv `orga run` handed to redis-server (recorded by the wrapper first on the PATH;
    # not /proc/PID/cmdline, which Redis overwrites with its title): the configuration, and
    # its requirepass, come on stdin (`-`).
    recorded = (tmp_path / "redis-argv").read_text().split("END-OF-ARGV\n")
    started = [argv.split("\n")[:-1] for argv in recorded if argv not in ("", "--version\n")]
    assert started, "the embedded runtime started no redis-server through the wrapper"
    for argv in started:
        assert not any("requirepass" in a or "@" in a for a in argv), argv
        assert argv[0] == "-", argv
    assert KEY not in stdout + stderr
    for path, data in _files_under(home):
        assert KEY.encode() not in data, f"the key is in {path}"


def test_orga_api_keeps_its_tokens_from_every_ancestor_of_a_command(
    tmp_path: Path, model: FakeOpenAIServer
) -> None:
    """`ORGA_API_TOKENS=… orga api` on the embedded runtime (an ancestor of every command): no
    ancestor of a command, `orga api` among them, has a token, a webhook secret, an inbox
    credential or the model key in its environment; the API still accepts its tokens (each
    of them) and the model still gets its key."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = _env(
        tmp_path,
        ORGA_HOME=str(tmp_path / "home"),
        ORGA_PROVIDER="openai",
        ORGA_BASE_URL=model.base_url,
        ORGA_API_KEY=KEY,
    )
    orga = Path(sys.executable).with_name("orga")
    command = [str(orga), "api", "--port", str(port)]
    process = Process("embedded-api", command, env, tmp_path / "api.log").start()
    try:
        process.wait_for_log(f"API on http://127.0.0.1:{port}/v1/", timeout_s=120)
        base = f"http://127.0.0.1:{port}"
        other = SECRETS["ORGA_API_TOKENS"].split(",")[0]
        with httpx.Client(base_url=base, timeout=60) as api:
            headers = {"Authorization": f"Bearer {API_TOKEN}"}
            response = api.post("/v1/tasks", json=_task(tmp_path), headers=headers)
            assert response.status_code == 201, response.text
            task_id = response.json()["task_id"]
            wait_until(
                lambda: (
                    api.get(f"/v1/tasks/{task_id}", headers=headers).json().get("status")
                    == "completed"
                ),
                120,
                f"task {task_id} to complete",
            )
            listed = api.get("/v1/tasks", headers={"Authorization": f"Bearer {other}"})
            assert listed.status_code == 200, listed.text
            refused = api.get("/v1/tasks", headers={"Authorization": "Bearer not-a-token-at-all"})
            assert refused.status_code == 401
        _assert_no_key(_seen(tmp_path), process.pid)
        assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in model.requests)
    finally:
        process.stop()
    assert all(secret not in process.tail() for secret in SECRET_VALUES)


@pytest.fixture
def passworded_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A real ``redis-server`` with ``requirepass`` :data:`REDIS_PASSWORD`, its files under
    :func:`_redis_dir`."""
    _redis_dir(tmp_path).mkdir(parents=True)
    server = EmbeddedRedis(appendonly=True, directory=_redis_dir(tmp_path), password=REDIS_PASSWORD)
    with server:
        yield server


def test_orga_worker_keeps_the_key_from_every_ancestor_of_a_command(
    tmp_path: Path, model: FakeOpenAIServer, passworded_redis: EmbeddedRedis
) -> None:
    """`ORGA_API_KEY=… ORGA_REDIS_URL=redis://:password@… orga worker` with
    ORGA_REASONING_PROCESSES=2 (its supervisor, two reasoning workers, each with a key socket
    of its own, and a tool worker): no ancestor of a command, the supervisor among them,
    has the key or the Redis password in its environment, and the command cannot talk to Redis
    without it; the reasoning workers still call the model with the key; Redis's files do not
    hold it."""
    private_redis = passworded_redis
    assert REDIS_PASSWORD in private_redis.url
    cluster = Cluster(private_redis.url, tmp_path / "cluster")
    cluster.root.mkdir()
    env = _env(
        tmp_path,
        ORGA_REDIS_URL=private_redis.url,
        ORGA_PROVIDER="openai",
        ORGA_BASE_URL=model.base_url,
        ORGA_API_KEY=KEY,
        ORGA_REASONING_PROCESSES="2",
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
        _assert_no_key(_seen(tmp_path), worker.pid, REDIS_PASSWORD)
        _, reply = _redis_reply(tmp_path)
        assert reply.startswith(b"-NOAUTH"), reply
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
