"""``python -m orga.supervisor`` as ``orga worker`` runs it, with small Python children in
place of Celery workers: how it stops them and what its exit code says."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orga import supervisor

REPO = Path(__file__).resolve().parents[2]

WARM_THEN_COLD = """
import signal, sys, time, pathlib
mark = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: mark.write_text("warm"))
signal.signal(signal.SIGQUIT, lambda *_: sys.exit(0))
mark.write_text("up")
while True:
    time.sleep(0.05)
"""
"""A child that ignores SIGTERM (a warm shutdown still finishing its calls) and leaves at
SIGQUIT (the cold shutdown)."""


KILLED_WHEN_UP = """
import os, pathlib, signal, sys, time
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""
"""A child killed once its sibling is up (its handlers set)."""


def _start(log: Path, *argvs: list[str]) -> subprocess.Popen[bytes]:
    """The supervisor of ``argvs``, its stderr in ``log``."""
    env = {k: v for k, v in os.environ.items() if k != supervisor.COMMANDS_VARIABLE}
    children = [supervisor.Child(argv, env) for argv in argvs]
    env[supervisor.COMMANDS_VARIABLE] = supervisor.encode(children, env)
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "orga.supervisor"], env=env, cwd=REPO, stderr=stderr
        )


def _wait_for(path: Path, text: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text() == text):
        assert time.monotonic() < deadline, f"{path} never said {text!r}"
        time.sleep(0.05)


def _stopping_warm(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A supervisor of two children that stop warm on SIGTERM (cold on SIGQUIT), sent one
    SIGTERM once both are up: returned once both began their warm stop."""
    marks = [tmp_path / "a", tmp_path / "b"]
    process = _start(
        tmp_path / "log", *[[sys.executable, "-c", WARM_THEN_COLD, str(m)] for m in marks]
    )
    for mark in marks:
        _wait_for(mark, "up")
    process.send_signal(signal.SIGTERM)
    for mark in marks:
        _wait_for(mark, "warm")
    return process


def test_a_stop_waits_for_the_warm_shutdown_and_a_second_one_is_cold(tmp_path: Path) -> None:
    process = _stopping_warm(tmp_path)
    time.sleep(1.0)
    assert process.poll() is None  # no deadline of its own: the children are still finishing
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0


def test_a_sighup_after_a_stop_began_does_not_make_it_cold(tmp_path: Path) -> None:
    """systemd's ``SendSIGHUP=yes`` sends SIGHUP right after SIGTERM: the workers' warm
    shutdown goes on (no SIGQUIT); a second SIGTERM still makes it cold."""
    process = _stopping_warm(tmp_path)
    process.send_signal(signal.SIGHUP)
    time.sleep(1.5)
    assert process.poll() is None  # still warm: the children left only at SIGQUIT
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0


def test_a_child_killed_by_a_signal_stops_the_others_with_128_plus_the_signal(
    tmp_path: Path,
) -> None:
    mark = tmp_path / "a"
    process = _start(
        tmp_path / "log",
        [sys.executable, "-c", KILLED_WHEN_UP, str(mark)],
        [sys.executable, "-c", WARM_THEN_COLD, str(mark)],
    )
    _wait_for(mark, "warm")  # the survivor got its SIGTERM
    process.send_signal(signal.SIGTERM)  # the operator's second stop: cold
    assert process.wait(20) == 128 + signal.SIGKILL
    assert "stopping the others" in (tmp_path / "log").read_text()


def test_a_child_that_ends_on_its_own_is_an_error(tmp_path: Path) -> None:
    process = _start(
        tmp_path / "log",
        [sys.executable, "-c", "pass"],
        [sys.executable, "-c", "import time; time.sleep(60)"],
    )
    assert process.wait(20) == 1


def test_without_its_commands_it_says_who_starts_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != supervisor.COMMANDS_VARIABLE}
    outcome = subprocess.run(
        [sys.executable, "-m", "orga.supervisor"], env=env, cwd=REPO, capture_output=True,
        text=True, check=False, timeout=30,
    )  # fmt: skip
    assert outcome.returncode == 2
    assert "orga worker" in outcome.stderr


def test_forking_anything_but_a_worker_command_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != supervisor.COMMANDS_VARIABLE}
    children = [supervisor.Child([sys.executable, "-c", "pass"], env)]
    env[supervisor.COMMANDS_VARIABLE] = supervisor.encode(children, env)
    env[supervisor.FORK_VARIABLE] = "1"
    outcome = subprocess.run(
        [sys.executable, "-m", "orga.supervisor"], env=env, cwd=REPO, capture_output=True,
        text=True, check=False, timeout=30,
    )  # fmt: skip
    assert outcome.returncode == 2
    assert "orga worker" in outcome.stderr and supervisor.FORK_VARIABLE in outcome.stderr


STOPS_AT_SIGTERM = """
import signal, sys, time, pathlib
mark = pathlib.Path(sys.argv[1])
def stop(*_):
    mark.write_text("warm")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
mark.write_text("up")
while True:
    time.sleep(0.05)
"""
"""A child whose warm shutdown (SIGTERM) ends at once."""


def _gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def _kill(pids: list[int]) -> None:
    """What a failed test leaves: the children it saw, if still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_sigquit_is_passed_on_at_once_and_no_worker_is_orphaned(tmp_path: Path) -> None:
    """SIGQUIT (Celery's cold shutdown) to the supervisor reaches every child at once (no
    SIGTERM first), the supervisor waits for them and exits 0: it does not die of the signal's
    default action, leaving its workers to init."""
    marks = [tmp_path / "a", tmp_path / "b"]
    process = _start(
        tmp_path / "log", *[[sys.executable, "-c", WARM_THEN_COLD, str(m)] for m in marks]
    )
    for mark in marks:
        _wait_for(mark, "up")
    children = _children(process.pid)
    assert len(children) == 2
    try:
        process.send_signal(signal.SIGQUIT)
        assert process.wait(20) == 0
        assert all(mark.read_text() == "up" for mark in marks)  # no SIGTERM came first
        assert all(_gone(child) for child in children)
    finally:
        _kill(children)


def test_sighup_is_a_warm_shutdown_said_with_exit_code_1(tmp_path: Path) -> None:
    """SIGHUP to the supervisor: a warm shutdown of every child (SIGTERM), a line on stderr
    saying why nothing restarts in place, and exit code 1, so that a service manager
    restarting on failure starts `orga worker` again; no child is left."""
    marks = [tmp_path / "a", tmp_path / "b"]
    process = _start(
        tmp_path / "log", *[[sys.executable, "-c", STOPS_AT_SIGTERM, str(m)] for m in marks]
    )
    for mark in marks:
        _wait_for(mark, "up")
    children = _children(process.pid)
    try:
        process.send_signal(signal.SIGHUP)
        assert process.wait(20) == supervisor.SIGHUP_EXIT_CODE == 1
        assert all(mark.read_text() == "warm" for mark in marks)
        assert all(_gone(child) for child in children)
    finally:
        _kill(children)
    said = (tmp_path / "log").read_text()
    assert "SIGHUP: warm shutdown" in said and "service manager" in said


def test_a_custom_pool_of_the_environment_is_refused_when_forking_naming_the_fix(
    tmp_path: Path,
) -> None:
    """CELERY_CUSTOM_WORKER_POOL in `orga worker`'s environment (inherited by the tool worker,
    while the reasoning workers set their own pool): forked workers would share one, so the
    supervisor refuses with an error naming the variable and both ways out, not a traceback."""
    env = {k: v for k, v in os.environ.items() if k != supervisor.COMMANDS_VARIABLE}
    worker = [sys.executable, "-m", supervisor.WORKER_MODULE]
    children = [
        supervisor.Child([*worker, "-Q", "orga.reasoning", "-P", "custom"],
                         {**env, supervisor.CUSTOM_POOL_VARIABLE: "workers.pool:LoopPool"}),
        supervisor.Child([*worker, "-Q", "orga.tools", "-P", "prefork"],
                         {**env, supervisor.CUSTOM_POOL_VARIABLE: "my.pool:Pool"}),
    ]  # fmt: skip
    env[supervisor.COMMANDS_VARIABLE] = supervisor.encode(children, env)
    env[supervisor.FORK_VARIABLE] = "1"
    outcome = subprocess.run(
        [sys.executable, "-m", "orga.supervisor"], env=env, cwd=REPO, capture_output=True,
        text=True, check=False, timeout=60,
    )  # fmt: skip
    assert outcome.returncode == 2, outcome.stderr
    assert "Traceback" not in outcome.stderr
    assert outcome.stderr.startswith("error: CELERY_CUSTOM_WORKER_POOL is set")
    assert "my.pool:Pool" in outcome.stderr
    assert "unset CELERY_CUSTOM_WORKER_POOL" in outcome.stderr
    assert "ORGA_WORKER_FORK=false" in outcome.stderr


def test_a_forked_process_reports_its_exit_code_and_its_signal_as_popen_does() -> None:
    exited = os.fork()
    if exited == 0:
        os._exit(3)
    killed = os.fork()
    if killed == 0:
        time.sleep(60)
        os._exit(0)
    first, second = supervisor.Forked(exited), supervisor.Forked(killed)
    deadline = time.monotonic() + 20
    while first.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert first.returncode == 3
    assert second.poll() is None
    second.send_signal(signal.SIGKILL)
    while second.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert second.returncode == -signal.SIGKILL
    second.send_signal(signal.SIGTERM)  # gone: nothing is sent


def test_the_supervisor_imports_neither_typing_nor_dataclasses_nor_subprocess() -> None:
    """The supervisor's own image (``python -m orga.supervisor`` once it has forked its
    workers) waits on its children: it holds none of the modules only annotations or a start
    of a worker need (about 2.5 MB of PSS, issue 27). ``subprocess`` comes with :func:`start`."""
    probe = (
        "import sys; before = set(sys.modules); import orga.supervisor; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert "orga.supervisor" in out
    assert not {"typing", "dataclasses", "inspect", "subprocess"} & set(out), out


def test_children_compare_by_value_and_keep_their_defaults() -> None:
    child = supervisor.Child(["python", "-c", "pass"], {"PATH": "/usr/bin"})
    assert child.pass_fds == ()
    assert child == supervisor.Child(["python", "-c", "pass"], {"PATH": "/usr/bin"}, ())
    assert child != supervisor.Child(["python", "-c", "pass"], {"PATH": "/usr/bin"}, (3,))
    assert child != ("python",)
    assert "PATH" not in repr(child) and "1 variables" in repr(child)
    env = {"PATH": "/usr/bin", "HOME": "/root"}
    (back,) = supervisor.decode(supervisor.encode([supervisor.Child(["a"], env, (5,))], env), env)
    assert back == supervisor.Child(["a"], env, (5,))
