"""The process ``run_command`` starts for each command (and :mod:`workers.tools.mcp` for each
stdio MCP server, in serve mode below): it applies the limits, runs the shell, and when the
shell ends or the tool says stop, kills every process the command left.

:mod:`workers.tools.command` runs it as ``python -I -S launcher.py`` (standard library only: it
imports nothing of the project). It reads one JSON request on stdin (the shell, the command,
its environment, the limits, the worker's pid and the file descriptor of the report) and writes
one JSON report on that descriptor before it exits.

Why a process of its own:

- **Subreaper.** On Linux it marks itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``):
  a process the command double-forks or ``setsid``'s away from its group is re-parented to the
  launcher, not to init, so it stays in the launcher's tree and is found and killed. Killing is
  by the process tree read from ``/proc``, not by process group; the signals go to every live
  descendant in rounds until none is left (or until ``_KILL_DEADLINE_S``: a process stuck in
  the kernel, or one the worker's user may not signal, is reported as a survivor).
- **Limits without ``preexec_fn``.** The worker has threads, so it cannot safely run Python
  between ``fork`` and ``exec``; the launcher is single-threaded, so its child sets the rlimits
  (processes, address space, file size, CPU seconds, no core files) and restores the default
  dispositions of SIGPIPE, SIGXFSZ and SIGXCPU right before ``exec``.
- **The worker's death ends the command.** ``PR_SET_PDEATHSIG`` sends the launcher SIGTERM when
  the worker dies, which it handles like the tool's own stop: kill everything, then exit.

**Serve mode** (``launcher.py --serve``, for a stdio MCP server, :mod:`workers.tools.mcp`): the
request comes from the environment variable ``ORGA_LAUNCH_REQUEST`` (never argv, which ``ps``
shows; stdin and stdout are the server's protocol), which the launcher removes before it
starts anything. It holds the server's ``argv`` (the program looked up on the request
environment's ``PATH``), that environment, the limits and the worker's pid. The child keeps the
launcher's stdin, stdout and stderr; the launcher then lets go of its own copies of stdin and
stdout, applies the same limits and the same subreaper, death signal and kill of the whole
tree as for a command (when the server exits, when the client's SIGTERM comes, when the worker
dies), writes a line on stderr when it could not start the server, and exits with the server's
status (``128 + N`` after signal N, 127 when it could not start it).

``RLIMIT_NPROC`` counts every process (thread, on Linux) of the *user*, so ``max_processes`` is
how many more the command may start: the launcher counts the tasks its user runs and sets the
limit to that count plus ``max_processes``. The kernel does not apply it to root.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

SERVE_FLAG = "--serve"
"""The argument that selects serve mode (the request then comes from :data:`REQUEST_VARIABLE`)."""
REQUEST_VARIABLE = "ORGA_LAUNCH_REQUEST"
"""The environment variable holding a serve-mode request (JSON); removed before any exec."""
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
_WAITED = _STOP_SIGNALS | {signal.SIGCHLD}
_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU, signal.SIGHUP)
_LIMIT_SIGNALS = {signal.SIGXFSZ: "SIGXFSZ", signal.SIGXCPU: "SIGXCPU"}
_KILL_DEADLINE_S = 3.0
_KILL_ROUND_S = 0.01
_RLIMITS = {
    "max_memory_bytes": resource.RLIMIT_AS,
    "max_file_bytes": resource.RLIMIT_FSIZE,
    "max_cpu_s": resource.RLIMIT_CPU,
}


class _Reaper:
    """Reaps the launcher's children: the shell, and the orphans re-parented to it."""

    def __init__(self, shell_pid: int) -> None:
        self.shell_pid = shell_pid
        self.shell_status: int | None = None
        self.limit_signals: dict[str, int] = {}

    def reap(self) -> None:
        """Reap every child that has ended, keeping the shell's wait status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) in _LIMIT_SIGNALS:
                name = _LIMIT_SIGNALS[signal.Signals(os.WTERMSIG(status))]
                self.limit_signals[name] = self.limit_signals.get(name, 0) + 1
            if pid == self.shell_pid:
                self.shell_status = status


def _prctl(option: int, value: int) -> bool:
    """Call ``prctl``; False when the system has none or refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _user_tasks(uid: int) -> int:
    """How many tasks (threads) the user with real uid ``uid`` runs, as RLIMIT_NPROC counts."""
    total = 0
    for name in _pids():
        try:
            with open(f"/proc/{name}/status", "rb") as handle:
                fields = dict(_status_fields(handle.read()))
        except OSError:
            continue
        uids = fields.get(b"Uid", b"").split()
        if uids and int(uids[0]) == uid:
            total += int(fields.get(b"Threads", b"1") or b"1")
    return total


def _status_fields(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    for line in data.splitlines():
        key, _, value = line.partition(b":")
        yield key, value.strip()


def _pids() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _descendants(root: int) -> list[int]:
    """The live (not zombie) processes below ``root``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in _pids():
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        state, ppid = data[data.rfind(b")") + 2 :].split()[:2]
        if state not in (b"Z", b"X"):
            children.setdefault(int(ppid), []).append(int(name))
    found: list[int] = []
    pending = list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def _rlimits(limits: Mapping[str, Any]) -> dict[int, int]:
    """The rlimits the command gets: the configured ones, NPROC relative to the user's tasks,
    and no core files."""
    values = {_RLIMITS[name]: int(v) for name, v in limits.items() if name in _RLIMITS and v}
    if limits.get("max_processes"):
        values[resource.RLIMIT_NPROC] = _user_tasks(os.getuid()) + int(limits["max_processes"])
    values[resource.RLIMIT_CORE] = 0
    return values


def _lower(which: int, value: int) -> None:
    """Set the soft and hard limits to ``value`` (the hard CPU limit one second later, so that
    SIGXCPU comes before SIGKILL), never above a hard limit that is already lower."""
    _, current = resource.getrlimit(which)
    hard = value + 1 if which == resource.RLIMIT_CPU else value
    if current != resource.RLIM_INFINITY:
        hard = min(hard, current)
    resource.setrlimit(which, (min(value, hard), hard))


def _argv(request: Mapping[str, Any]) -> list[str]:
    """The child's argv: ``shell -c command``, or the serve request's own ``argv``."""
    if "argv" in request:
        return [str(part) for part in request["argv"]]
    return [str(request["shell"]), "-c", str(request["command"])]


def _exec_child(request: Mapping[str, Any], rlimits: Mapping[int, int], error_fd: int) -> None:
    """In the forked child: limits, default signals, then exec; never returns."""
    try:
        for which, value in rlimits.items():
            _lower(which, value)
        for number in _RESET_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        argv = _argv(request)
        # A program without a slash is looked up on the request environment's PATH.
        os.execvpe(argv[0], argv, dict(request["env"]))  # noqa: S606 - the approved program
    except OSError as exc:
        os.write(error_fd, f"{exc.errno or 0}:{exc.strerror or exc}".encode())
    except BaseException as exc:
        os.write(error_fd, f"0:{type(exc).__name__}: {exc}".encode())
    finally:
        os._exit(127)


def _spawn(request: Mapping[str, Any], rlimits: Mapping[int, int]) -> int:
    """Fork and exec the child; raises OSError when it cannot be started."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _exec_child(request, rlimits, write_fd)
    os.close(write_fd)
    try:
        failure = os.read(read_fd, 4096)
    finally:
        os.close(read_fd)
    if not failure:
        return pid
    os.waitpid(pid, 0)
    code, _, text = failure.decode(errors="replace").partition(":")
    raise OSError(int(code) or errno.EINVAL, text)


def _wait(reaper: _Reaper) -> bool:
    """Wait for the shell to end; False when told to stop first."""
    while True:
        reaper.reap()
        if reaper.shell_status is not None:
            return True
        if signal.sigwaitinfo(_WAITED).si_signo in _STOP_SIGNALS:
            return False


def _kill_all(reaper: _Reaper) -> dict[str, Any]:
    """SIGKILL every live descendant, in rounds, until none is left and the shell is reaped,
    or the deadline passes."""
    killed: set[int] = set()
    deadline = time.monotonic() + _KILL_DEADLINE_S
    while True:
        reaper.reap()
        alive = _descendants(os.getpid())
        done = not alive and reaper.shell_status is not None
        if done or time.monotonic() > deadline:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        signal.sigtimedwait({signal.SIGCHLD}, _KILL_ROUND_S)
    killed.discard(reaper.shell_pid)
    return {"killed": len(killed), "survivors": len(alive)}


def _fallback_kill(reaper: _Reaper) -> dict[str, Any]:
    """Without ``/proc`` and a subreaper: kill the shell; the tool kills its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(reaper.shell_pid, signal.SIGKILL)
    while reaper.shell_status is None:
        signal.sigtimedwait({signal.SIGCHLD}, _KILL_ROUND_S)
        reaper.reap()
    return {"killed": 0, "survivors": 0}


def _stop_requested(parent_pid: int) -> bool:
    """Ask for SIGTERM when the worker dies; True when it already has."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() != parent_pid


def _release_stdio() -> None:
    """Let go of stdin and stdout (the child has its own copies): the server's client then
    sees the end of its output when the server's processes have closed theirs."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)


def run(request: Mapping[str, Any], *, release_stdio: bool = False) -> dict[str, Any]:
    """Run the request's command (or server) to its end (or a stop signal); the report.
    ``release_stdio``: drop the launcher's stdin and stdout once the child runs."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1) and os.path.isdir("/proc/self")
    if _stop_requested(int(request["parent_pid"])):
        return {"error": "the worker ended before the command started", "subreaper": subreaper}
    expected = request.get("workspace_identity")
    if expected is not None:
        here = os.stat(".")
        if [here.st_dev, here.st_ino] != list(expected):
            return {
                "error": "the workspace folder was replaced after it was checked (by a link or "
                "another folder); the command was not run",
                "subreaper": subreaper,
            }
    rlimits = _rlimits(request["limits"])
    try:
        shell_pid = _spawn(request, rlimits)
    except OSError as exc:
        return {"error": exc.strerror or str(exc), "subreaper": subreaper}
    if release_stdio:
        _release_stdio()
    reaper = _Reaper(shell_pid)
    ended = _wait(reaper)
    kills = _kill_all(reaper) if subreaper else _fallback_kill(reaper)
    return {
        "status": reaper.shell_status,
        "stopped": not ended,
        "subreaper": subreaper,
        "limit_signals": reaper.limit_signals,
        "max_user_processes": rlimits.get(resource.RLIMIT_NPROC),
        **kills,
    }


def main() -> int:
    """Read the request on stdin, run it, write the report to the request's descriptor."""
    request = json.loads(sys.stdin.buffer.read())
    report_fd = int(request["report_fd"])
    os.set_inheritable(report_fd, False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    report = run(request)
    os.write(report_fd, json.dumps(report).encode())
    os.close(report_fd)
    return 0


def exit_status(report: Mapping[str, Any]) -> int:
    """The launcher's exit status in serve mode: the child's, as a shell reports it."""
    status = report.get("status")
    if report.get("error") or status is None:
        return 127
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 127


def serve() -> int:
    """Serve mode: the request from :data:`REQUEST_VARIABLE` (removed first), the child on the
    launcher's own stdin, stdout and stderr; its exit status."""
    request = json.loads(os.environ.pop(REQUEST_VARIABLE, "") or "null")
    if not isinstance(request, dict):
        sys.stderr.write(f"orga launcher: no request in {REQUEST_VARIABLE}\n")
        return 127
    report = run(request, release_stdio=True)
    if report.get("error"):
        program = _argv(request)[0] if request.get("argv") else "?"
        sys.stderr.write(f"orga launcher: could not start {program!r}: {report['error']}\n")
    if report.get("survivors"):
        sys.stderr.write(f"orga launcher: {report['survivors']} process(es) survived the kill\n")
    sys.stderr.flush()
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == [SERVE_FLAG] else main())
