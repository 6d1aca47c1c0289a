"""The ``orga`` command as a user meets it: the installed entry point, run in a subprocess.

Printed commands run as printed (pasted in a shell without the virtualenv), user and model text
prints literally, unknown ids fail with a message, help and options behave like the ecosystem's
(``-h``, ``--version``, Celery's own options through ``orga worker``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import psutil
import pytest
import redis
import yaml

from coordinator.state import TaskRecord, TaskStatus
from orga.embedded_redis import EmbeddedRedis
from shared import keys
from shared.settings import OrgaSettings
from shared.task_spec import parse_task
from tests.integration.harness import (
    ORGA,
    PARTITIONS,
    PARTITIONS_VAR,
    REPO,
    Cluster,
    clean_env,
    run_orga,
    wait_until,
)

pytestmark = pytest.mark.integration


WANDERER = REPO / "examples" / "wanderer" / "task.yaml"
DEFAULT_REASONING_PROCESSES = int(OrgaSettings.model_fields["reasoning_processes"].default)


def _env(**extra: str) -> dict[str, str]:
    env = clean_env()
    env["COLUMNS"] = "80"
    env.update(extra)
    return env


def _embedded(tmp_path: Path) -> dict[str, str]:
    """The environment of an embedded runtime whose paths need quoting in a shell."""
    return _env(
        ORGA_HOME=str(tmp_path / "orga home"), ORGA_WORKSPACE_ROOT=str(tmp_path / "work spaces")
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- help and version ----------------------------------------------------------------------


def test_version_and_short_help() -> None:
    """`orga --version` prints the package version; `-h` is help on every level."""
    shown = run_orga("--version", env=_env())
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"orga {version('orga-queue')}"
    for args in (["-h"], ["review", "-h"], ["review", "decide", "-h"], ["worker", "-h"]):
        helped = run_orga(*args, env=_env())
        assert helped.returncode == 0, (args, helped.stderr)
        assert helped.stdout.startswith("Usage: orga"), helped.stdout


def test_help_shows_flags_as_flags() -> None:
    """A flag takes no value, and the help does not show one (no `<bool>`)."""
    for args in (["-h"], ["run", "-h"], ["journal", "-h"], ["review", "decide", "-h"]):
        helped = run_orga(*args, env=_env())
        assert "<bool>" not in helped.stdout, helped.stdout
    decide = run_orga("review", "decide", "-h", env=_env()).stdout
    lines = {line.split()[0]: line for line in decide.splitlines() if line.startswith("  --")}
    assert lines["--retry"].split()[1:3] == ["Resume", "the"]
    assert lines["--hint"].split()[1] == "TEXT"


# -- unknown ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["status", "no-such-task"],
        ["result", "no-such-task"],
        ["journal", "no-such-task"],
        ["journal", "no-such-task", "--follow"],
        ["cancel", "no-such-task"],
        ["review", "show", "no-such-task"],
        ["review", "decide", "no-such-task", "--skip"],
    ],
)
def test_unknown_ids_exit_non_zero_with_a_message(
    args: list[str], private_redis: EmbeddedRedis
) -> None:
    """Every command given an unknown id says so on stderr and exits 1 (never hangs)."""
    outcome = run_orga(*args, env=_env(ORGA_REDIS_URL=private_redis.url), timeout_s=30)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    assert "no-such-task" in outcome.stderr
    assert outcome.stderr.startswith("error: no "), outcome.stderr
    assert "sent" not in outcome.stdout
    assert outcome.stdout == ""


def test_unknown_ids_on_the_embedded_runtime(tmp_path: Path) -> None:
    """The same on the embedded runtime (its private Redis, no deployment)."""
    env = _embedded(tmp_path)
    for args in (["status", "nope"], ["journal", "nope", "-f"], ["review", "show", "nope"]):
        outcome = run_orga(*args, env=env, timeout_s=60)
        assert outcome.returncode == 1, (args, outcome.stdout, outcome.stderr)
        assert "'nope'" in outcome.stderr


@pytest.mark.parametrize("command", ["run", "submit"])
def test_a_task_file_that_is_not_utf8_is_refused_naming_the_byte(
    tmp_path: Path, command: str
) -> None:
    """`orga run` / `orga submit` of a Latin-1 file exit 2 naming the byte offset and the fix,
    before reaching any runtime (ORGA_REDIS_URL points at nothing)."""
    task = tmp_path / "task.yaml"
    task.write_bytes(b"goal: caf\xe9\n")
    outcome = run_orga(command, str(task), env=_env(ORGA_REDIS_URL="redis://127.0.0.1:1/0"))
    assert outcome.returncode == 2, outcome.stdout + outcome.stderr
    message = _one_line(outcome.stderr)
    assert message.startswith(f"invalid task: {task}: not valid UTF-8 at byte offset 9 (line 1")
    assert "save it as UTF-8" in message


# -- orga worker and orga coordinator -------------------------------------------------------


def _wait_for(process: subprocess.Popen[str], log: Path, texts: list[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = log.read_text(errors="replace")
        if all(text in seen for text in texts):
            return seen
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"never saw {texts}:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_worker_takes_celerys_own_options(tmp_path: Path, private_redis: EmbeddedRedis) -> None:
    """`orga worker --role reasoning -E -n NAME --loglevel INFO -P solo` reaches celery worker
    as given."""
    name = f"probe-{os.getpid()}@cli-test"
    log = tmp_path / "worker.log"
    command = [str(ORGA), "worker", "--role", "reasoning", "-E", "-n", name,
               "--loglevel", "INFO", "-P", "solo",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, env=_env(ORGA_REDIS_URL=private_redis.url), cwd=REPO,
            stdout=handle, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        seen = _wait_for(process, log, [name, "ready."], 60)
    finally:
        _stop(process)
    banner = _one_line(seen)
    assert "task events: ON" in banner
    assert "(solo)" in banner  # the pool asked for


def test_worker_refuses_a_name_for_two_workers(private_redis: EmbeddedRedis) -> None:
    """`-n` names one worker: with the default --role all (two workers) it is refused."""
    outcome = run_orga("worker", "-n", "x@h", env=_env(ORGA_REDIS_URL=private_redis.url))
    assert outcome.returncode == 2
    assert "--role reasoning" in outcome.stderr


def test_worker_refuses_a_name_for_several_reasoning_processes(
    private_redis: EmbeddedRedis,
) -> None:
    """`-n` with --role reasoning names one worker: refused when ORGA_REASONING_PROCESSES
    explicitly asks for more (without it, -n starts one: see the test above)."""
    env = _env(ORGA_REDIS_URL=private_redis.url, ORGA_REASONING_PROCESSES="2")
    outcome = run_orga("worker", "--role", "reasoning", "-n", "x@h", env=env)
    assert outcome.returncode == 2
    assert "ORGA_REASONING_PROCESSES=2" in _one_line(outcome.stderr)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _unpaired_unix_sockets(pid: int) -> list[str]:
    """The Unix-domain sockets a process holds whose other end is closed (``ss``: peer 0):
    what a model key socket is (``key_handoff.send`` closes its writing end); a prefork
    pool's socket pairs have both ends open."""
    table = subprocess.run(["ss", "-xa"], capture_output=True, text=True, check=True).stdout
    peers = {}
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8:
            peers[fields[5]] = fields[7]
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:[") and peers.get(target[8:-1]) == "0":
                found.append(f"{fd.name} -> {target}")
    return found


def _terminate(process: subprocess.Popen[str]) -> int:
    """SIGTERM to ``process`` (a warm stop): its exit code, within 30 s."""
    process.send_signal(signal.SIGTERM)
    return process.wait(30)


def _assert_gone(pids: list[int], *, within_s: float) -> None:
    """Every process of ``pids`` has exited, or does within ``within_s``."""
    deadline = time.monotonic() + within_s
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(not Path(f"/proc/{p}").exists() for p in pids)


def _start_default_worker(
    tmp_path: Path, url: str, **extra: str
) -> tuple[subprocess.Popen[str], Path]:
    log = tmp_path / "worker.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [str(ORGA), "worker", "--without-gossip", "--without-mingle"],
            env=_env(ORGA_REDIS_URL=url, ORGA_API_KEY="sk-not-in-the-supervisor", **extra),
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    reasoning = extra.get("ORGA_REASONING_PROCESSES")
    workers = (int(reasoning) if reasoning else DEFAULT_REASONING_PROCESSES) + 1  # and the tools
    deadline = time.monotonic() + 90
    while log.read_text(errors="replace").count("ready.") < workers:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    return process, log


def test_worker_forks_two_reasoning_processes_and_a_tool_worker_from_its_supervisor(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """`orga worker` with ORGA_REASONING_PROCESSES=2: the process becomes a supervisor that
    imports the workers' modules and forks two reasoning workers and a tool worker from itself
    (they share those pages), with distinct names, named by queue in ``/proc/PID/comm``, then
    runs again without those modules (no pydantic: a few MB, not the CLI's 45); no model key is
    in its environment nor in any worker's, the model key sockets reached no tool process, the
    tool worker is one process (Celery's thread pool: no pool process), and SIGTERM stops them
    all."""
    process, log = _start_default_worker(tmp_path, private_redis.url, ORGA_REASONING_PROCESSES="2")
    try:
        assert _argv(process.pid)[1:] == ["-m", "orga.supervisor"]
        assert "pydantic_core" not in Path(f"/proc/{process.pid}/maps").read_text()
        children = _children(process.pid)
        assert sorted(_comm(c) for c in children) == [
            "orga-reasoning",
            "orga-reasoning",
            "orga-tools",
        ]
        ready = re.findall(r"\] (\S+@\S+) ready\.", log.read_text(errors="replace"))
        assert len(set(ready)) == 3, ready
        tools = next(c for c in children if _comm(c) == "orga-tools")
        assert _children(tools) == []  # the thread pool: no pool process
        assert "concurrency: 2 (thread)" in log.read_text(errors="replace")  # Celery's banner
        for pid in [process.pid, *children]:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert b"sk-not-in-the-supervisor" not in environ
        assert not _unpaired_unix_sockets(tools), (tools, _unpaired_unix_sockets(tools))
    finally:
        code = _terminate(process)
    assert code == 0
    _assert_gone(children, within_s=0)


def test_worker_started_apart_is_two_reasoning_processes_and_a_tool_worker_under_a_light_supervisor(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """`orga worker` with ORGA_WORKER_FORK=false and ORGA_REASONING_PROCESSES=2: the process
    becomes a supervisor that imports no pydantic (it costs a few MB, not the CLI's 45), runs
    two reasoning workers and a tool worker with distinct names, has no model key in its
    environment nor in any worker's (the reasoning workers get it through a socket), and stops
    them all on SIGTERM."""
    process, _ = _start_default_worker(
        tmp_path, private_redis.url, ORGA_WORKER_FORK="false", ORGA_REASONING_PROCESSES="2"
    )
    try:
        assert _argv(process.pid)[1:] == ["-m", "orga.supervisor"]
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert "pydantic_core" not in maps
        children = _children(process.pid)
        argvs = [_argv(child) for child in children]
        queues = sorted(a[a.index("-Q") + 1] for a in argvs)
        assert queues == ["orga.reasoning", "orga.reasoning", "orga.tools"]
        assert len({a[a.index("-n") + 1] for a in argvs}) == 3
        assert b"sk-not-in-the-supervisor" not in Path(f"/proc/{process.pid}/environ").read_bytes()
        for child, argv in zip(children, argvs, strict=True):
            environ = Path(f"/proc/{child}/environ").read_bytes()
            assert b"ORGA_SUPERVISE_COMMANDS" not in environ
            assert b"sk-not-in-the-supervisor" not in environ
            handed = b"ORGA_MODEL_KEYS_FD=" in environ
            assert handed == (argv[argv.index("-Q") + 1] == "orga.reasoning")
    finally:
        code = _terminate(process)
    assert code == 0
    _assert_gone(children, within_s=0)


def test_default_worker_stops_all_when_one_worker_dies(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """A worker that dies takes the others down with it and the exit code says so: a service
    manager restarts the whole set instead of running on without a reasoning process. With no
    option the set is one reasoning worker and one tool worker (ORGA_REASONING_PROCESSES, 1)."""
    process, log = _start_default_worker(tmp_path, private_redis.url)
    children = _children(process.pid)
    assert sorted(_comm(c) for c in children) == ["orga-reasoning", "orga-tools"]
    try:
        os.kill(children[0], signal.SIGKILL)
        code = process.wait(60)
    finally:
        _stop(process)
    assert code != 0
    assert "stopping the others" in log.read_text(errors="replace")
    _assert_gone(children, within_s=10)


def _sighup_when_ready(process: subprocess.Popen[str], log: Path) -> tuple[int, str]:
    """SIGHUP to ``process`` once it logged ``ready.``: its exit code and its log."""
    try:
        _wait_for(process, log, ["ready."], 60)
        process.send_signal(signal.SIGHUP)
        code = process.wait(60)
    finally:
        _stop(process)
    return code, log.read_text(errors="replace")


def test_sighup_to_a_worker_is_a_warm_shutdown_said_with_exit_code_1(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """Celery's SIGHUP handler (installed when the output is not a terminal: systemd, docker)
    re-executes ``sys.argv``, which an orga worker cannot do (its connection URLs were read
    once from a socket closed since, and ``orga.worker_main`` run as a script shadows the
    ``celery`` package). An orga worker stops instead, warm, says why, and exits 1: its
    service manager starts it again with fresh sockets."""
    log = tmp_path / "worker.log"
    command = [str(ORGA), "worker", "--role", "tools", "-c", "1",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, env=_env(ORGA_REDIS_URL=private_redis.url), cwd=REPO,
            stdout=handle, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    code, seen = _sighup_when_ready(process, log)
    assert code == 1, seen[-3000:]
    assert "worker: SIGHUP: warm shutdown, exit code 1" in seen, seen[-3000:]
    assert "Restarting celery worker" not in seen
    assert seen.count("ready.") == 1


def test_a_sighup_to_a_pool_process_leaves_it_and_its_call_alive(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """A SIGHUP to the process group (a terminal closed, ``kill -HUP -PGID``) reaches the
    prefork pool processes too, where Celery resets SIGHUP to its default action (death: the
    call would be delivered again): an orga pool process ignores it, and its main process
    decides. (A tool worker on its default thread pool has no pool process: prefork asked.)"""
    log = tmp_path / "worker.log"
    command = [str(ORGA), "worker", "--role", "tools", "-c", "2",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, env=_env(ORGA_REDIS_URL=private_redis.url, ORGA_TOOL_POOL="prefork"), cwd=REPO,
            stdout=handle, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        _wait_for(process, log, ["ready."], 60)
        pool = psutil.Process(process.pid).children()
        assert pool, log.read_text(errors="replace")[-3000:]
        os.kill(pool[0].pid, signal.SIGHUP)
        time.sleep(2.0)
        assert pool[0].is_running() and pool[0].status() != psutil.STATUS_ZOMBIE
        assert process.poll() is None
    finally:
        _stop(process)


def test_a_sighup_while_the_worker_starts_waits_for_it_and_stops_it_warm(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """A SIGHUP sent once Celery printed its banner (after ``celeryd_after_setup``, around
    when Celery installs its restart handler, before the worker is ready) is held until the
    worker is ready, then stops it as above: it never reaches Celery's restart."""
    log = tmp_path / "worker.log"
    command = [str(ORGA), "worker", "--role", "tools", "-c", "1",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    with log.open("w") as handle:
        process = subprocess.Popen(
            command, env=_env(ORGA_REDIS_URL=private_redis.url), cwd=REPO,
            stdout=handle, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        _wait_for(process, log, ["[queues]"], 60)
        process.send_signal(signal.SIGHUP)
        code = process.wait(60)
    finally:
        _stop(process)
    seen = log.read_text(errors="replace")
    assert code == 1, seen[-3000:]
    assert "worker: SIGHUP: warm shutdown, exit code 1" in seen, seen[-3000:]
    assert "Restarting celery worker" not in seen


def test_sighup_to_a_celery_worker_handed_its_url_through_a_socket_stops_it_warm(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """The same for ``celery -A orga worker`` (Celery's own script, whose re-exec would work
    but find no URL: ORGA_CONNECTION_FD was read and closed at the first start)."""
    import sys

    from workers import key_handoff

    env = _env()
    env.pop("ORGA_REDIS_URL", None)
    fd = key_handoff.send({"ORGA_REDIS_URL": private_redis.url})
    env[key_handoff.CONNECTION_FD_VARIABLE] = str(fd)
    log = tmp_path / "worker.log"
    celery = str(Path(sys.executable).with_name("celery"))
    command = [celery, "-A", "orga", "worker", "-Q", "orga.tools", "-P", "solo",
               "--loglevel", "INFO",
               "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    try:
        with log.open("w") as handle:
            process = subprocess.Popen(
                command, env=env, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, text=True,
                pass_fds=(fd,),
            )  # fmt: skip
    finally:
        os.close(fd)
    code, seen = _sighup_when_ready(process, log)
    assert code == 1, seen[-3000:]
    assert "worker: SIGHUP: warm shutdown, exit code 1" in seen, seen[-3000:]
    assert "Restarting celery worker" not in seen


def test_sighup_to_the_default_worker_stops_every_forked_worker_with_exit_code_1(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """SIGHUP to `orga worker` (the supervisor of forked workers): a warm shutdown of all of
    them, a line saying why, exit code 1; no worker is left."""
    process, log = _start_default_worker(tmp_path, private_redis.url)
    children = _children(process.pid)
    try:
        process.send_signal(signal.SIGHUP)
        code = process.wait(60)
    finally:
        _stop(process)
    seen = log.read_text(errors="replace")
    assert code == 1, seen[-3000:]
    assert "orga worker: SIGHUP: warm shutdown of every worker" in seen
    _assert_gone(children, within_s=10)


def test_sighup_to_a_forked_reasoning_worker_stops_it_warm_and_the_set_with_exit_code_1(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """SIGHUP to one reasoning worker of `orga worker` (its custom pool, its event loop): that
    worker stops warm and says why, and the supervisor stops the others and exits 1."""
    process, log = _start_default_worker(tmp_path, private_redis.url)
    children = _children(process.pid)
    reasoning = next(c for c in children if _comm(c) == "orga-reasoning")
    try:
        os.kill(reasoning, signal.SIGHUP)
        code = process.wait(60)
    finally:
        _stop(process)
    seen = log.read_text(errors="replace")
    assert code == 1, seen[-3000:]
    assert "worker: SIGHUP: warm shutdown, exit code 1" in seen, seen[-3000:]
    assert "Restarting celery worker" not in seen
    assert "stopping the others" in seen
    _assert_gone(children, within_s=10)


def test_worker_refuses_an_option_celery_does_not_know(private_redis: EmbeddedRedis) -> None:
    """An unknown option goes to celery, which names it: the pass-through hides nothing."""
    outcome = run_orga(
        "worker", "--no-such-celery-option", env=_env(ORGA_REDIS_URL=private_redis.url)
    )
    assert outcome.returncode == 2
    assert "--no-such-celery-option" in outcome.stderr
    assert "celery" in outcome.stderr.lower()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_coordinator_serves_metrics_on_the_configured_address(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """`orga coordinator` with ORGA_METRICS_PORT binds ORGA_METRICS_HOST and says where."""
    port = _free_port()
    log = tmp_path / "coordinator.log"
    env = _env(
        ORGA_REDIS_URL=private_redis.url,
        ORGA_METRICS_PORT=str(port),
        ORGA_METRICS_HOST="127.0.0.1",
        ORGA_WORKSPACE_ROOT=str(tmp_path / "ws"),
    )
    with log.open("w") as handle:
        process = subprocess.Popen(
            [str(ORGA), "coordinator"], env=env, cwd=REPO, stdout=handle,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        _wait_for(process, log, [f"metrics on http://127.0.0.1:{port}/metrics"], 30)
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    finally:
        _stop(process)
    assert scraped.status_code == 200
    assert "orga_redis_up 1.0" in scraped.text


# -- the embedded runtime: printed commands and literal text -------------------------------


def _printed_commands(stdout: str) -> dict[str, str]:
    """The commands `orga run` printed after an escalation: retry, skip, abort and show."""
    found: dict[str, str] = {}
    for line in (line.strip() for line in stdout.splitlines()):
        words = line.split()
        if " review decide " not in line and " review show " not in line:
            continue
        following = words[words.index("review") + 1 :]
        kind = following[0] if following[0] == "show" else following[2].removeprefix("--")
        found[kind] = line
    return found


def _paste(line: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """Run a printed line in /bin/sh with the system's PATH only (no virtualenv)."""
    shell_env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "COLUMNS": "80"}
    return subprocess.run(
        ["/bin/sh", "-c", line], env=shell_env, cwd=cwd, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def test_printed_decide_commands_run_as_printed_outside_the_venv(tmp_path: Path) -> None:
    """At 80 columns, each printed command is one line that shlex parses into one command
    starting with an executable, the orga by its absolute path; pasted into a shell without
    the venv, in another directory, `review show` works and `--skip` decides the review (the
    task then fails, all its steps skipped, and the command exits 1)."""
    env = _embedded(tmp_path)
    escalated = run_orga("run", str(WANDERER), env=env)
    assert escalated.returncode == 3, escalated.stdout + escalated.stderr
    commands = _printed_commands(escalated.stdout)
    assert set(commands) == {"retry", "skip", "abort", "show"}, escalated.stdout
    for line in commands.values():
        words = shlex.split(line)
        assert shutil.which(words[0]) is not None, line
        executable = next(w for w in words[1:] if "=" not in w)
        assert Path(executable).is_absolute(), line
        assert os.access(executable, os.X_OK), line
        assert f"ORGA_HOME={tmp_path / 'orga home'}" in words
        assert f"ORGA_WORKSPACE_ROOT={tmp_path / 'work spaces'}" in words
        if PARTITIONS != 1:  # the embedded state was created with it: the commands carry it
            assert f"{PARTITIONS_VAR}={PARTITIONS}" in words
    assert shlex.split(commands["retry"])[-3:] == ["--retry", "--hint", "what to try instead"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = _paste(commands["show"], elsewhere, tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert '"source": "detector"' in shown.stdout
    skipped = _paste(commands["skip"], elsewhere, tmp_path)
    assert "decision skip applied" in skipped.stdout, skipped.stdout + skipped.stderr
    assert "all 1 were skipped" in skipped.stdout
    assert skipped.returncode == 1


def test_goal_and_model_text_print_literally(tmp_path: Path) -> None:
    """Rich markup in a goal, a step id's neighbours and the model's answer prints as written,
    and `orga run` still prints the task id and exits 0."""
    goal = "Close the tag [/red] and keep items[i] literally"
    answer = "Done: [bold]items[i][/bold] and [/red] stay as written"
    task = tmp_path / "task.yaml"
    task.write_text(
        yaml.safe_dump(
            {
                "goal": goal,
                "provider": {"kind": "scripted", "replies": [answer]},
                "steps": [{"id": "say", "instruction": "Answer with items[i] and [/red]"}],
            }
        )
    )
    outcome = run_orga("run", str(task), env=_embedded(tmp_path))
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    first = outcome.stdout.splitlines()[0]
    assert first.startswith("task ") and first.endswith(f": {goal}"), first
    assert f"output: {answer}" in outcome.stdout
    task_id = first.split()[1].rstrip(":")
    shown = run_orga("status", task_id, env=_embedded(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert goal in shown.stdout


def _stored_task(redis_url: str, task_id: str, status: TaskStatus) -> None:
    spec = parse_task({"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]})
    record = TaskRecord(task_id=task_id, spec=spec, status=status, created_at=0, updated_at=0)
    with redis.Redis.from_url(redis_url) as client:
        client.hset(
            keys.task_key(task_id, keys.partition_of(task_id, PARTITIONS)),
            mapping={"state": record.model_dump_json(), "status": status.value},
        )


def _cancels(redis_url: str, task_id: str) -> int:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        rows = client.xrange(keys.control_stream(keys.partition_of(task_id, PARTITIONS)))
    return sum(1 for _id, fields in rows if fields.get("task_id") == task_id)


def test_cancel_sends_only_for_a_task_that_still_runs(private_redis: EmbeddedRedis) -> None:
    """`orga cancel` sends the cancellation of a running task; a finished one is refused (exit
    1, nothing sent), as the coordinator would ignore it."""
    url = private_redis.url
    _stored_task(url, "cli-running", TaskStatus.RUNNING)
    _stored_task(url, "cli-done", TaskStatus.COMPLETED)
    sent = run_orga("cancel", "cli-running", env=_env(ORGA_REDIS_URL=url))
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "cancellation of cli-running sent"
    assert _cancels(url, "cli-running") == 1
    refused = run_orga("cancel", "cli-done", env=_env(ORGA_REDIS_URL=url))
    assert refused.returncode == 1
    assert "already ended completed: nothing to cancel" in refused.stderr
    assert _cancels(url, "cli-done") == 0


def test_a_second_sigterm_to_the_default_worker_stops_it_at_once_during_a_long_tool_call(
    tmp_path: Path, private_redis: EmbeddedRedis
) -> None:
    """`orga worker` told twice to stop while its tool worker (the thread pool) runs a long
    command: the second SIGTERM is passed on as SIGQUIT, the cold shutdown, and every worker
    and the supervisor exit at once, the command killed: not after the call's 150 s."""
    raw = redis.Redis.from_url(private_redis.url)
    raw.flushall()  # no other test's task left for this coordinator
    raw.close()
    marker = tmp_path / "started"
    task = {
        "goal": "a long command",
        "provider": {"kind": "scripted", "replies": [
            {"tool_calls": [{"name": "run_command",
                             "arguments": {"command": f"touch {marker}; exec sleep 122"}}]},
            "finished"]},
        "steps": [{"id": "work", "instruction": "run the command"}],
        "limits": {"tool_timeout": "150s"},
        "stagnation": {"enabled": False},
    }  # fmt: skip
    process, log = _start_default_worker(tmp_path, private_redis.url)
    children = _children(process.pid)
    cluster = Cluster(private_redis.url, tmp_path)
    try:
        cluster.coordinator(name="c-cold")
        cluster.client().submit(task)
        wait_until(marker.exists, 60, "the tool call to start")
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the warm shutdown begun
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"orga worker still runs 30 s after a second SIGTERM:\n{log.read_text()}")
    finally:
        _stop(process)
        cluster.stop()
    _assert_gone(children, within_s=10)

    def killed() -> bool:
        found = subprocess.run(["pgrep", "-x", "-f", "sleep 122"], check=False, capture_output=True)
        return found.returncode != 0

    wait_until(killed, 10, "the call's command to be killed")
