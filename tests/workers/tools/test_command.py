"""run_command: exit codes, timeouts that kill the process tree, output cap, scrubbed env, cwd."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shared.errors import ConfigError
from workers.tools import CommandEnvironment, RunCommandTool, ToolContext, ToolOutput
from workers.tools.command import DEFAULT_PATH, CommandLimits


def _run(
    workspace: Path,
    command: str,
    *,
    tool: RunCommandTool | None = None,
    **limits: Any,
) -> ToolOutput:
    arguments: dict[str, Any] = {"command": command}
    if "arg_timeout_s" in limits:
        arguments["timeout_s"] = limits.pop("arg_timeout_s")
    context = ToolContext(workspace=workspace, **limits)
    return asyncio.run((tool or RunCommandTool()).run(arguments, context))


def _is_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie waiting for a reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in {"Z", "X"}


def _wait_gone(pid: int, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _is_gone(pid):
            return True
        time.sleep(0.02)
    return _is_gone(pid)


def test_success_output_format(tmp_path: Path) -> None:
    """The content is 'exit code: N' then the output."""
    output = _run(tmp_path, "echo hello")
    assert output.content == "exit code: 0\nhello\n"
    assert not output.is_error
    assert output.metadata["kind"] == "command"
    assert output.metadata["exit_code"] == "0"
    assert output.metadata["output_hash"] == hashlib.sha256(b"hello\n").hexdigest()


def test_non_zero_exit_is_an_ordinary_result(tmp_path: Path) -> None:
    """A failing command is reported, not an error, and stderr is merged in order."""
    output = _run(tmp_path, "echo out; echo err >&2; exit 3")
    assert not output.is_error
    assert output.metadata["exit_code"] == "3"
    assert output.content == "exit code: 3\nout\nerr\n"


def test_death_by_signal_reports_128_plus_n(tmp_path: Path) -> None:
    """A shell killed by SIGTERM reports 143, as a shell would."""
    output = _run(tmp_path, "kill -TERM $$")
    assert output.metadata["exit_code"] == "143"


def test_cwd_and_home_are_the_workspace(tmp_path: Path) -> None:
    """The command runs in the workspace, which is also HOME."""
    output = _run(tmp_path, 'pwd; echo "$HOME"; touch made_here')
    real = os.path.realpath(tmp_path)
    assert output.content == f"exit code: 0\n{real}\n{real}\n"
    assert (tmp_path / "made_here").exists()


def test_parent_secrets_never_reach_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secrets in the worker's environment are absent from the child's environment."""
    secrets = {
        "ORGA_TEST_API_KEY": "sk-orga-secret-1",
        "OPENAI_API_KEY": "sk-openai-secret-2",
        "GITHUB_TOKEN": "ghp-secret-3",
        "DB_SECRET": "secret-4",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    output = _run(tmp_path, "env")
    for value in secrets.values():
        assert value not in output.content
    names = {line.split("=", 1)[0] for line in output.content.splitlines()[1:] if "=" in line}
    assert names <= {"PATH", "LANG", "HOME", "TERM", "PWD", "SHLVL", "_", "OLDPWD"}
    assert "TERM=dumb" in output.content


def test_from_parent_copies_only_the_allow_list(tmp_path: Path) -> None:
    """from_parent keeps PATH, LANG and the allowed names, nothing else."""
    parent = {"PATH": "/bin:/usr/bin", "LANG": "en_US.UTF-8", "PIP_INDEX": "x", "OTHER": "no"}
    environment = CommandEnvironment.from_parent(parent, allow=["PIP_INDEX", "ABSENT"])
    assert environment.variables(tmp_path) == {
        "PIP_INDEX": "x",
        "PATH": "/bin:/usr/bin",
        "LANG": "en_US.UTF-8",
        "HOME": str(tmp_path),
        "TERM": "dumb",
    }


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "GITHUB_TOKEN", "ORGA_REDIS_URL", "MY_SECRET"])
def test_from_parent_refuses_secret_names(name: str) -> None:
    """Allow-listing a name that looks like a secret is a configuration error."""
    with pytest.raises(ConfigError, match=name):
        CommandEnvironment.from_parent({name: "v"}, allow=[name])


def test_extra_variables_reach_the_child_but_cannot_override_home(tmp_path: Path) -> None:
    """Explicit extras are passed; HOME stays the workspace."""
    tool = RunCommandTool(CommandEnvironment(extra={"FEATURE": "on", "HOME": "/root"}))
    output = _run(tmp_path, 'echo "$FEATURE $HOME"', tool=tool)
    assert output.content == f"exit code: 0\non {os.path.realpath(tmp_path)}\n"


def test_timeout_kills_the_whole_process_tree(tmp_path: Path) -> None:
    """At the timeout the shell and its background children are killed; 124 is reported."""
    started = time.monotonic()
    output = _run(
        tmp_path, "sleep 30 & echo $! > bg.pid; sleep 30", arg_timeout_s=0.5, timeout_s=10
    )
    elapsed = time.monotonic() - started
    assert elapsed < 3
    assert output.is_error
    assert output.metadata["exit_code"] == "124"
    assert output.metadata["error_type"] == "timeout"
    assert output.content.startswith("exit code: 124\n[timed out after 0.5s")
    assert _wait_gone(int((tmp_path / "bg.pid").read_text()))


def test_cancelled_call_kills_the_process_tree(tmp_path: Path) -> None:
    """When the caller cancels the call (an executor timeout), no process survives."""

    async def cancel_early() -> None:
        command = "sleep 30 & echo $! > bg.pid; sleep 30"
        context = ToolContext(workspace=tmp_path, timeout_s=10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(RunCommandTool().run({"command": command}, context), 0.5)

    asyncio.run(cancel_early())
    assert _wait_gone(int((tmp_path / "bg.pid").read_text()))


def test_timeout_is_capped_by_the_context(tmp_path: Path) -> None:
    """A timeout_s argument above the operator's limit is lowered to it."""
    started = time.monotonic()
    output = _run(tmp_path, "sleep 30", arg_timeout_s=100, timeout_s=0.3)
    assert time.monotonic() - started < 3
    assert "timed out after 0.3s" in output.content


def test_background_processes_do_not_outlive_the_command(tmp_path: Path) -> None:
    """A command that leaves a child behind returns at once, the child is killed, and the
    output says so."""
    started = time.monotonic()
    output = _run(tmp_path, "sleep 30 & echo $!", timeout_s=10)
    assert time.monotonic() - started < 3
    assert output.metadata["exit_code"] == "0"
    assert output.metadata["killed_processes"] == "1"
    assert "[the command left 1 process running when it ended; it was killed]" in output.content
    assert _wait_gone(int(output.content.splitlines()[-1]))


def test_detached_process_holding_the_output_is_killed(tmp_path: Path) -> None:
    """A process that left the group with setsid and keeps stdout open is killed at once:
    the call neither waits for it nor leaves it running (it was abandoned, still running)."""
    started = time.monotonic()
    command = (
        "setsid sh -c 'echo $$ > detached.pid; sleep 30' & "
        "while [ ! -s detached.pid ]; do sleep 0.01; done; echo started"
    )
    output = _run(tmp_path, command, timeout_s=10)
    assert time.monotonic() - started < 2.5
    assert "stopped reading it" not in output.content
    assert "started" in output.content
    assert _is_gone(int((tmp_path / "detached.pid").read_text()))


def _marker() -> str:
    """A sleep duration no other test uses, to find the processes of one command."""
    return f"{random.randint(100, 999)}.{random.randint(10**5, 10**6 - 1)}"


def _running(marker: str) -> list[int]:
    """Live ``sleep <marker>`` processes, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        is_sleep = argv[0].rsplit("/", 1)[-1] == "sleep" and argv[1:2] == [marker]
        if is_sleep and not _is_gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_setsid_process_does_not_outlive_the_command(tmp_path: Path) -> None:
    """``setsid sleep &`` left its own session running after the call while the output claimed
    everything was killed; now it is killed when the command returns."""
    marker = _marker()
    output = _run(tmp_path, f"setsid sleep {marker} & sleep 0.2; echo done", timeout_s=10)
    assert output.metadata["exit_code"] == "0"
    assert "it was killed" in output.content
    assert _running(marker) == []


def test_double_forked_and_setsid_processes_die_at_the_timeout(tmp_path: Path) -> None:
    """At the timeout, a double-forked orphan and a setsid'd grandchild are killed too, and
    the output counts them."""
    marker = _marker()
    command = (
        f"(sleep {marker} &) ; (setsid sh -c 'sleep {marker} & wait' &) ; "
        f"while [ $(ps -e -o args | grep -c '^sleep {marker}') -lt 2 ]; do sleep 0.01; done; "
        "sleep 30"
    )
    output = _run(tmp_path, command, arg_timeout_s=1.5, timeout_s=10)
    assert output.metadata["exit_code"] == "124"
    assert "[timed out after 1.5s: killed the command and the" in output.content
    assert int(output.metadata["killed_processes"]) >= 3
    assert _running(marker) == []


def test_a_fork_bomb_is_bounded_by_the_process_limit(tmp_path: Path) -> None:
    """A command that starts processes without end hits RLIMIT_NPROC long before its 5000th:
    the fork fails, the output names the limit, and every process it started is killed.

    RLIMIT_NPROC does not bind root, so as root the loop runs as ``nobody`` under the limit
    the launcher set (the worker's tasks plus max_processes)."""
    marker = _marker()
    loop = f"i=0; while [ $i -lt 5000 ]; do sleep {marker} & i=$((i+1)); done; echo all started"
    command = f"sh -c '{loop}'"
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: RLIMIT_NPROC would not apply")
        os.chmod(tmp_path, 0o777)
        command = f"setpriv --reuid=65534 --regid=65534 --clear-groups {command}"
    tool = RunCommandTool(limits=CommandLimits(max_processes=20))
    output = _run(tmp_path, command, tool=tool, timeout_s=30)
    assert "all started" not in output.content
    assert "Cannot fork" in output.content or "Resource temporarily unavailable" in output.content
    assert output.metadata["limit_hit"] == "processes"
    assert "[limit: starting a process failed; a command may start at most 20" in output.content
    assert 1 <= int(output.metadata.get("killed_processes", "0")) < 5000
    assert _running(marker) == []


def test_a_file_above_the_size_limit_is_refused(tmp_path: Path) -> None:
    """Writing past max_file_bytes stops the writer (SIGXFSZ); the file stays at the limit and
    the output names the limit."""
    tool = RunCommandTool(limits=CommandLimits(max_file_bytes=100_000))
    output = _run(tmp_path, "head -c 300000 /dev/zero > big.bin", tool=tool)
    assert output.metadata["exit_code"] == str(128 + signal.SIGXFSZ)
    assert output.metadata["limit_hit"] == "file_size"
    assert "larger than 100000 bytes and was refused (RLIMIT_FSIZE)" in output.content
    assert (tmp_path / "big.bin").stat().st_size <= 100_000


def test_cpu_seconds_are_limited(tmp_path: Path) -> None:
    """A busy loop is stopped by SIGXCPU after max_cpu_s of CPU time, before the timeout."""
    tool = RunCommandTool(limits=CommandLimits(max_cpu_s=1))
    started = time.monotonic()
    output = _run(tmp_path, "while :; do :; done", tool=tool, timeout_s=20)
    assert time.monotonic() - started < 15
    assert output.metadata["exit_code"] == str(128 + signal.SIGXCPU)
    assert output.metadata["limit_hit"] == "cpu"
    assert "used its 1 s of CPU time" in output.content


@pytest.mark.skipif(shutil.which("python3", path=DEFAULT_PATH) is None, reason="no python3")
def test_memory_is_limited(tmp_path: Path) -> None:
    """An allocation above max_memory_bytes fails inside the command; the output says why."""
    tool = RunCommandTool(limits=CommandLimits(max_memory_bytes=256 * 2**20))
    output = _run(tmp_path, "python3 -c 'bytearray(1024 * 1024 * 1024)'", tool=tool)
    assert output.metadata["exit_code"] == "1"
    assert "MemoryError" in output.content
    assert output.metadata["limit_hit"] == "memory"


def test_the_limits_are_set_in_the_command(tmp_path: Path) -> None:
    """The command sees the configured rlimits, and None leaves a limit unlimited."""
    tool = RunCommandTool(
        limits=CommandLimits(max_file_bytes=123_456, max_cpu_s=77, max_memory_bytes=None)
    )
    output = _run(tmp_path, "cat /proc/self/limits", tool=tool)
    rows = {line[:26].strip(): line[26:].split() for line in output.content.splitlines()[2:]}
    assert rows["Max file size"][:2] == ["123456", "123456"]
    assert rows["Max cpu time"][:2] == ["77", "78"]
    assert rows["Max core file size"][:2] == ["0", "0"]
    assert rows["Max address space"][0] == "unlimited"
    assert rows["Max processes"][0] != "unlimited"


def test_limits_are_validated() -> None:
    """A limit below its minimum is refused with the field's name."""
    with pytest.raises(ValueError, match="max_processes"):
        CommandLimits(max_processes=0)
    with pytest.raises(ValueError, match="max_memory_bytes"):
        CommandLimits(max_memory_bytes=1000)


def test_the_command_dies_with_the_worker(tmp_path: Path) -> None:
    """When the worker process is killed mid-command, the launcher kills the command."""
    marker = _marker()
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from workers.tools import RunCommandTool, ToolContext\n"
        f"command = 'setsid sleep {marker} & echo $! > bg.pid; sleep {marker}'\n"
        "context = ToolContext(workspace=Path(sys.argv[1]), timeout_s=60)\n"
        "asyncio.run(RunCommandTool().run({'command': command}, context))\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    try:
        deadline = time.monotonic() + 10
        while len(_running(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_running(marker)) == 2
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 5
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _running(marker) == []


def test_huge_output_is_capped_with_head_and_tail(tmp_path: Path) -> None:
    """Ten megabytes of output keep a bounded head and tail; the hash covers all of it."""
    output = _run(tmp_path, "yes | head -c 10000000", max_output_bytes=1000)
    assert output.metadata["exit_code"] == "0"
    assert output.metadata["output_bytes"] == "10000000"
    assert output.metadata["output_hash"] == hashlib.sha256(b"y\n" * 5_000_000).hexdigest()
    assert "bytes of output omitted (10000000 in total)" in output.content
    assert len(output.content.encode()) < 1200


def test_cap_never_splits_a_character(tmp_path: Path) -> None:
    """The head and tail cuts fall between characters."""
    (tmp_path / "accents.txt").write_text("é" * 5000)
    output = _run(tmp_path, "cat accents.txt", max_output_bytes=101)
    assert "\ufffd" not in output.content
    head, tail = output.content.removeprefix("exit code: 0\n").split("\n[...")
    assert head == "é" * 25
    assert tail.endswith("\n" + "é" * 25)


def test_invalid_arguments_and_missing_shell(tmp_path: Path) -> None:
    """A missing command and an unusable shell are is_error outputs."""
    missing = asyncio.run(RunCommandTool().run({}, ToolContext(workspace=tmp_path)))
    assert missing.is_error
    assert "'command' is a required property" in missing.content
    output = _run(tmp_path, "true", tool=RunCommandTool(shell=str(tmp_path / "no-shell")))
    assert output.is_error
    assert output.metadata["error_type"] == "os_error"
