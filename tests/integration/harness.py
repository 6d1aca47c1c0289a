"""Real processes for integration tests: a private Redis, Celery workers and coordinators.

Nothing here is mocked: the worker is ``celery -A orga worker`` and the coordinator is
``orga coordinator``, each its own process, talking through a real ``redis-server``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from coordinator.client import OrgaClient, TaskNotFoundError
from orga.embedded_redis import EmbeddedRedis, EmbeddedRedisError
from shared.events import JournalEntry
from tests.ci import require

REPO = Path(__file__).resolve().parents[2]

ORGA = Path(sys.executable).with_name("orga")
"""The console script pip installed for the project: what a user runs."""


def run_orga(
    *args: str, env: dict[str, str], cwd: Path = REPO, timeout_s: float = 180.0
) -> subprocess.CompletedProcess[str]:
    """The installed ``orga`` entry point in a subprocess, as a user runs it."""
    assert ORGA.exists(), f"the orga entry point is not installed at {ORGA}"
    return subprocess.run(
        [str(ORGA), *args], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip


FAST_COORDINATOR = {
    "ORGA_OBSERVATION_DEADLINE_S": "6",
    "ORGA_TICK_INTERVAL_S": "0.2",
    "ORGA_LEASE_TTL_S": "3",
    "ORGA_PARTITION_LEASE_TTL_S": "3",
    "ORGA_CLAIM_IDLE_MS": "1500",
    "ORGA_MAX_REDELIVERIES": "3",
}


PARTITIONS_VAR = "ORGA_PARTITIONS"
"""The setting every process started by the harness gets the partition count in."""
TEST_PARTITIONS_VAR = "ORGA_TEST_PARTITIONS"
PARTITIONS = int(os.environ.get(TEST_PARTITIONS_VAR) or "1")
"""The partition count the integration suite runs with, from one place:
``ORGA_TEST_PARTITIONS=16 pytest tests/integration`` runs every process the harness starts
(coordinators, workers, ``orga`` commands, the embedded runtime) and its clients on 16
partitions (``make test-partitions``)."""


def clean_env(drop: tuple[str, ...] = ("ORGA_",)) -> dict[str, str]:
    """This process's environment without the variables starting with ``drop`` (its ``ORGA_``
    settings), on the suite's partitions (``ORGA_PARTITIONS`` set when it is not 1): what a
    test gives the processes it starts before adding its own settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if PARTITIONS != 1:
        env[PARTITIONS_VAR] = str(PARTITIONS)
    return env


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of an ``orga`` command on the embedded runtime in ``tmp_path``: this
    process's, without its ``ORGA_`` settings or an OpenAI key, on the suite's partitions."""
    env = clean_env()
    env.pop("OPENAI_API_KEY", None)
    env.update(
        COLUMNS="200",
        ORGA_HOME=str(tmp_path / "home"),
        ORGA_WORKSPACE_ROOT=str(tmp_path / "workspaces"),
    )
    env.update(extra)
    return env


def task_id_printed(run_output: str) -> str:
    """The task id ``orga run`` prints on its first line (``task ID: ...``)."""
    first = run_output.splitlines()[0]
    assert first.startswith("task "), run_output
    return first.split()[1].rstrip(":")


def started_redis(directory: Path, *, appendonly: bool = False) -> EmbeddedRedis:
    """A private redis-server in ``directory``, started: a failure in CI (integration tests
    must run there), a skip elsewhere."""
    server = EmbeddedRedis(appendonly=appendonly, directory=directory)
    try:
        server.start()
    except EmbeddedRedisError as exc:
        require("a redis-server for the integration tests", f"install redis-server ({exc})")
    return server


CROSS_PARTITIONS = 16
"""The count the tests marked :data:`on_16_partitions` also run on in ``make test``."""

on_16_partitions = pytest.mark.parametrize(
    "partitions", [None] + ([CROSS_PARTITIONS] if PARTITIONS != CROSS_PARTITIONS else []),
    indirect=True, scope="module", ids=lambda count: f"{count or PARTITIONS}p",
)  # fmt: skip
"""A test that exercises a path across partitions (delegation, idempotency, reviews, schedules,
the views merging partitions) runs on the suite's partitions and on 16, so ``make test`` proves
the 16-partition path each run: the module's ``partitions`` fixture takes the value, and the
``private_redis`` and ``cluster`` fixtures (a fresh Redis: its partition count is fixed at
creation) are the ones of that count. ``None`` is the suite's count, so that variant shares the
module's Redis and cluster with its unmarked tests (one more cluster per module, not two).
Under ``ORGA_TEST_PARTITIONS=16`` it runs once."""


def _environment(
    redis_url: str, workspaces: Path, extra: dict[str, str], partitions: int = PARTITIONS
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORGA_")}
    env.update({"ORGA_REDIS_URL": redis_url, "ORGA_WORKSPACE_ROOT": str(workspaces)})
    env["ORGA_PARTITIONS"] = str(partitions)
    env.update(FAST_COORDINATOR)
    env.update(extra)
    return env


@dataclass
class Process:
    """A child process with its output in a log file."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("ab") as handle:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                self.command, env=self.env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def wait_for_log(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log.read_text(errors="replace"):
                return
            if self.popen is not None and self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name} never logged {text!r}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def children(self) -> list[int]:
        """Pids of direct children (Celery's pool processes)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.pid:
                found.append(int(stat.parent.name))
        return sorted(found)


@dataclass
class Cluster:
    """Workers and coordinators against one Redis."""

    redis_url: str
    root: Path
    processes: list[Process] = field(default_factory=list)
    partitions: int = PARTITIONS
    """``ORGA_PARTITIONS`` of its processes and of :meth:`client` (an ``ORGA_PARTITIONS`` in a
    process's extra environment wins for that process)."""

    @property
    def workspaces(self) -> Path:
        return self.root / "workspaces"

    def worker(
        self, concurrency: int = 3, name: str = "w1", pool: str = "prefork", **env: str
    ) -> Process:
        command = [
            sys.executable, "-m", "celery", "-A", "orga", "worker",
            "-Q", "orga.reasoning,orga.tools", "-c", str(concurrency), "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"{name}-{os.getpid()}@%h", "-P", pool,
        ]  # fmt: skip
        process = Process(name, command, self._env(env), self.root / f"{name}.log").start()
        process.wait_for_log("ready.")
        self.processes.append(process)
        return process

    def coordinator(self, name: str = "c1", **env: str) -> Process:
        command = [sys.executable, "-m", "orga.cli", "coordinator"]
        process = Process(name, command, self._env(env), self.root / f"{name}.log").start()
        process.wait_for_log("coordinator ")
        self.processes.append(process)
        return process

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        return _environment(self.redis_url, self.workspaces, extra, self.partitions)

    def client(self) -> OrgaClient:
        return OrgaClient(self.redis_url, partitions=self.partitions)

    def orga(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run the ``orga`` CLI against this cluster."""
        return subprocess.run(
            [sys.executable, "-m", "orga.cli", *args],
            env=self._env({}), cwd=REPO, capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def logs(self) -> str:
        return "\n\n".join(f"== {p.name}\n{p.tail()}" for p in self.processes)


def assert_journal_is_clean(entries: list[JournalEntry]) -> None:
    """No gap in the sequence, and no iteration applied twice within a step."""
    sequences = [e.sequence for e in entries]
    assert sequences == list(range(len(sequences))), f"journal has a gap: {sequences}"
    seen: set[tuple[str | None, int, str]] = set()
    for entry in entries:
        if entry.event.type in ("ReasoningComplete", "ToolsDispatched", "ObservationsCollected"):
            key = (entry.step_id, entry.iteration, entry.event.type)
            assert key not in seen, f"iteration applied twice: {key}"
            seen.add(key)


def wait_until(predicate: object, timeout_s: float = 60.0, what: str = "condition") -> None:
    """Poll ``predicate()`` until true."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(client: OrgaClient, task_id: str) -> str | None:
    """The task's status, or None while it is still on the intake stream."""
    try:
        return str(client.status(task_id)["status"])
    except TaskNotFoundError:
        return None


def iter_lines(path: Path) -> Iterator[str]:
    """The lines of a file, if it exists."""
    if path.exists():
        yield from path.read_text().splitlines()


@contextmanager
def running_cluster(
    redis_url: str,
    root: Path,
    worker_env: dict[str, str] | None = None,
    coordinator_env: dict[str, str] | None = None,
    partitions: int = PARTITIONS,
) -> Iterator[Cluster]:
    """One worker and one coordinator (each with its extra environment) on ``partitions``,
    stopped afterwards."""
    running = Cluster(redis_url, root, partitions=partitions)
    try:
        running.worker(**(worker_env or {}))
        running.coordinator(**(coordinator_env or {}))
        yield running
    finally:
        running.stop()
