"""The health checks of compose/docker-compose.yml, run as written against real processes: a
Celery worker named as compose names it, and Flower with basic auth (no Docker needed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _check(service: str) -> list[str]:
    """The service's healthcheck test as the container runs it (compose turns $$ into $)."""
    document: dict[str, Any] = yaml.safe_load((REPO / "compose" / "docker-compose.yml").read_text())
    test: list[str] = document["services"][service]["healthcheck"]["test"]
    return [word.replace("$$", "$") for word in test]


def _run_check(test: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    kind, *words = test
    command = ["/bin/sh", "-c", words[0]] if kind == "CMD-SHELL" else words
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, check=False, cwd=REPO
    )


def _env(broker_url: str, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{BIN}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "ORGA_REDIS_URL": broker_url,
        **extra,
    }


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:
        return subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait(ready: Callable[[], bool], process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if ready():
            return
        time.sleep(0.1)
    raise AssertionError(f"never ready:\n{log.read_text(errors='replace')[-3000:]}")


PASSWORD = "a-test-password"
SECRET = "/root/orga/redis_password"
"""Where compose's tool-worker finds the Redis password (a secret readable by root only)."""


@pytest.fixture
def broker_url(redis_server_factory: Callable[..., RedisServer]) -> str:
    """A private Redis for the broker with a password, as compose's (the session's shared one is
    left alone)."""
    url = redis_server_factory().url
    with redis.Redis.from_url(url) as client:
        client.config_set("requirepass", PASSWORD)
    return url.replace("redis://", f"redis://:{PASSWORD}@", 1)


@pytest.fixture
def tool_worker(broker_url: str, tmp_path: Path) -> Iterator[str]:
    """A worker named like compose's tool workers (``tools@%h``)."""
    log = tmp_path / "worker.log"
    command = [sys.executable, "-m", "celery", "-A", "orga", "worker", "-Q", "orga.tools",
               "-n", "tools@%h", "-P", "solo", "--loglevel", "INFO",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    process = _start(command, _env(broker_url), log)
    try:
        _wait(lambda: "ready." in log.read_text(errors="replace"), process, log)
        yield broker_url
    finally:
        _stop(process)


def test_worker_health_check_pings_its_own_node(tool_worker: str, tmp_path: Path) -> None:
    """`celery inspect ping -d tools@$HOSTNAME` passes on the tool worker's host, given no Redis
    URL: it builds one from the password's secret file (here a file of the test's, and this
    Redis's address for `redis:6379`); the reasoning check fails there, since no reasoning node
    answers (the check is not vacuous)."""
    secret = tmp_path / "redis_password"
    secret.write_text(PASSWORD)
    address = tool_worker.rsplit("@", 1)[1].rsplit("/", 1)[0]
    check = [
        word.replace(SECRET, str(secret)).replace("@redis:6379/", f"@{address}/")
        for word in _check("tool-worker")
    ]
    assert check != _check("tool-worker")  # both were there to replace
    env = _env(tool_worker, HOSTNAME=socket.gethostname())
    del env["ORGA_REDIS_URL"]  # not in the tool-worker container's environment
    passed = _run_check(check, env)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "pong" in passed.stdout
    secret.write_text("a-wrong-password")
    refused = _run_check(check, env)
    assert refused.returncode != 0
    failed = _run_check(
        _check("reasoning-worker"), _env(tool_worker, HOSTNAME=socket.gethostname())
    )
    assert failed.returncode != 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_flower_health_check_logs_in(broker_url: str, tmp_path: Path) -> None:
    """The Flower check passes with the credentials Flower runs with, fails with others."""
    port = _free_port()
    log = tmp_path / "flower.log"
    login = "admin:a-test-secret,second:another"
    env = _env(broker_url, FLOWER_BASIC_AUTH=login)
    command = [sys.executable, "-m", "celery", "-A", "orga", "flower", f"--port={port}"]
    process = _start(command, env, log)
    try:
        _wait(lambda: _listening(port), process, log)
        test = [word.replace("127.0.0.1:5555", f"127.0.0.1:{port}") for word in _check("flower")]
        test[1] = sys.executable  # `python` in the image
        passed = _run_check(test, env)
        refused = _run_check(test, {**env, "FLOWER_BASIC_AUTH": "admin:wrong"})
    finally:
        _stop(process)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert refused.returncode != 0
    assert "401" in refused.stderr
