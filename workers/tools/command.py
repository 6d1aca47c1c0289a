"""``run_command``: a shell command in the workspace, with a timeout, a scrubbed environment and
an output cap.

Decisions:

- **Shell.** The command runs as ``/bin/sh -c <command>``: agents write pipes, redirections and
  ``&&``. There is no shell-injection concern to defend against, since the whole string *is* the
  command the gate approved.
- **Environment.** Only ``PATH``, ``LANG``, ``HOME`` (the workspace), ``TERM=dumb`` and the
  operator's explicit extras (:class:`CommandEnvironment`). Nothing is inherited from the worker
  process: its API keys, tokens and ``ORGA_*`` settings never reach the child.
- **Every process it started dies with it.** The shell runs under a small launcher
  (:mod:`workers.tools.launcher`), a child subreaper: a process the command double-forks or
  detaches with ``setsid`` is re-parented to the launcher instead of init. When the shell
  exits, or when the timeout fires (the tool sends the launcher SIGTERM), the launcher SIGKILLs
  every live process of its tree, read from ``/proc``, until none is left. Background
  processes therefore never outlive the call (a server started with ``&`` is gone when the
  command returns), and the output says how many were killed, and how many could not be (a
  process the worker's user may not signal, or one stuck in the kernel). Where there is no
  subreaper (not Linux), the launcher's process group is killed instead, and the output says
  that detached processes may survive.
- **Limits** (:class:`CommandLimits`, set with ``setrlimit`` in the launcher's child right
  before ``exec``, inherited by every process the command starts): processes (``RLIMIT_NPROC``,
  counted per *user* by the kernel, so ``max_processes`` is how many more the command may start
  than the worker's user already runs; root is exempt), address space per process
  (``RLIMIT_AS``), size of a written file (``RLIMIT_FSIZE``), CPU seconds per process
  (``RLIMIT_CPU``), and no core files. A limit that was hit is named in the output: a process
  killed by SIGXFSZ or SIGXCPU, or a fork or allocation failure the command printed.
- **Exit codes.** The child's status is reported as a shell would: ``128 + N`` for death by
  signal N. A timeout reports ``124``, as GNU ``timeout`` does, and says ``timed out after Ns``.
- **Errors.** A non-zero exit is an ordinary result (``is_error=False``, ``exit_code`` in the
  metadata): failing tests or a ``grep`` without match are information the model needs, and must
  not trip the tool's circuit breaker. ``is_error`` is True only when the tool itself failed: a
  timeout, a shell that cannot start, or invalid arguments.
- **Output.** stderr is merged into stdout in arrival order. It is read incrementally; only the
  first and the last ``max_output_bytes / 2`` bytes are kept, with a marker for what was left out,
  so a command printing gigabytes uses bounded memory. The content is ``exit code: N`` followed
  by the output.

Metadata: ``kind=command``, ``exit_code``, ``output_hash`` (SHA-256 of the *full* output, before
the cap), ``output_bytes``; ``killed_processes`` (besides the shell) when the launcher killed
any; ``error_type=timeout`` after a timeout; ``limit_hit`` (comma-separated ``file_size``,
``cpu``, ``processes``, ``memory``) when a limit was hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import ConfigError
from shared.inference import ToolDefinition
from workers.tools.arguments import ArgumentCheck
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.errors import WorkspacePathError
from workers.tools.files import path_failure
from workers.tools.output import error_output, utf8_prefix, utf8_suffix
from workers.tools.workspace import expected_identity, workspace_root

__all__ = [
    "DEFAULT_PATH",
    "RUN_COMMAND_DEFINITION",
    "SECRET_NAME_PATTERN",
    "TIMEOUT_EXIT_CODE",
    "CommandEnvironment",
    "CommandLimits",
    "RunCommandTool",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT_EXIT_CODE = 124
SECRET_NAME_PATTERN = re.compile(
    r"(^ORGA_)|(^AWS_)|(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)$", re.IGNORECASE
)
"""Names that look like secrets; :meth:`CommandEnvironment.from_parent` refuses to copy them."""

_DRAIN_GRACE_S = 1.0
_STOP_GRACE_S = 5.0
"""How long the launcher has to kill the command's processes after SIGTERM before the tool
kills its process group itself."""
_LAUNCHER = Path(__file__).with_name("launcher.py")
_FIXED_NAMES = frozenset({"PATH", "LANG", "HOME", "TERM"})

RUN_COMMAND_DEFINITION = ToolDefinition(
    name="run_command",
    description=(
        "Run a shell command (/bin/sh -c) with the workspace as the current directory. Returns "
        "'exit code: N' and the combined stdout and stderr; long output keeps its beginning and "
        "end. A non-zero exit code is reported, not treated as a failure. The command and every "
        "process it starts are killed at the timeout or when it exits: do not start servers in "
        "the background. The environment is minimal (PATH, LANG, HOME=workspace, TERM=dumb). "
        "Processes, memory, file size and CPU time are limited; a limit that was hit is named "
        "in the output."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "description": "The shell command line, e.g. 'pytest -q tests/test_app.py'.",
            },
            "timeout_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "Seconds before the command is killed; capped by the operator's "
                "limit, which is also the default.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    },
)


class CommandEnvironment(BaseModel):
    """The environment of a command: fixed variables plus the operator's explicit extras.

    ``HOME`` is always the workspace and ``TERM`` is ``dumb``; ``PATH`` and ``LANG`` come from
    here, and ``extra`` may not override any of the four.
    """

    model_config = ConfigDict(frozen=True)

    path: str = DEFAULT_PATH
    lang: str = "C.UTF-8"
    extra: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_parent(
        cls, parent: Mapping[str, str], allow: Iterable[str] = ()
    ) -> CommandEnvironment:
        """``PATH``, ``LANG`` and the ``allow``-listed names copied from ``parent``.

        Call it at the process edge with ``os.environ``. Raises ConfigError when an allowed
        name looks like a secret (``*_KEY``, ``*_TOKEN``, ``*_SECRET``, ``ORGA_*``, ...): pass
        such a value explicitly in ``extra`` if a command truly needs it.
        """
        names = list(allow)
        secret = [name for name in names if SECRET_NAME_PATTERN.search(name)]
        if secret:
            raise ConfigError(
                f"run_command environment allow-list {secret} names secrets; remove them, or "
                "pass the value explicitly with CommandEnvironment(extra=...)"
            )
        return cls(
            path=parent.get("PATH", DEFAULT_PATH),
            lang=parent.get("LANG", "C.UTF-8"),
            extra={name: parent[name] for name in names if name in parent},
        )

    def variables(self, workspace: Path) -> dict[str, str]:
        """The complete environment of a command run in ``workspace``."""
        extras = {k: v for k, v in self.extra.items() if k not in _FIXED_NAMES}
        return {
            **extras,
            "PATH": self.path,
            "LANG": self.lang,
            "HOME": str(workspace),
            "TERM": "dumb",
        }


class CommandLimits(BaseModel):
    """The rlimits of every process a command starts; ``None`` leaves one as the worker has it.

    ``max_processes`` is how many processes (threads, on Linux) the command may start beyond
    those the worker's user already runs: ``RLIMIT_NPROC`` counts per user, so an absolute
    value would either break a busy worker or bound nothing. The kernel does not apply it to
    root: run tool workers as an unprivileged user (the compose image does). ``max_memory_bytes``
    is the address space of each process (runtimes that reserve large virtual areas, such as
    V8 or the JVM, may need more); ``max_file_bytes`` the largest file a process may write;
    ``max_cpu_s`` the CPU seconds of each process (the timeout bounds the wall time).
    """

    model_config = ConfigDict(frozen=True)

    max_processes: int | None = Field(default=256, ge=1)
    max_memory_bytes: int | None = Field(default=8 * 2**30, ge=2**24)
    max_file_bytes: int | None = Field(default=2**30, ge=1)
    max_cpu_s: int | None = Field(default=600, ge=1)


class RunCommandTool:
    """``run_command``: ``/bin/sh -c`` in the workspace, bounded in time, output, processes,
    memory, file size and environment."""

    starts_processes = True
    """Never run by a reasoning worker (:func:`workers.tools.base.starts_processes`)."""

    def __init__(
        self,
        environment: CommandEnvironment | None = None,
        *,
        shell: str = "/bin/sh",
        limits: CommandLimits | None = None,
        python: str = sys.executable,
    ) -> None:
        self._environment = environment or CommandEnvironment()
        self._shell = shell
        self._limits = limits or CommandLimits()
        self._python = python
        self._check = ArgumentCheck(RUN_COMMAND_DEFINITION)

    @property
    def environment(self) -> CommandEnvironment:
        """The environment of the commands (a stdio MCP server gets the same)."""
        return self._environment

    @property
    def limits(self) -> CommandLimits:
        """The rlimits of the commands (a stdio MCP server gets the same)."""
        return self._limits

    @property
    def definition(self) -> ToolDefinition:
        """Name, description and JSON Schema of ``run_command``."""
        return RUN_COMMAND_DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Run the command; a non-zero exit is a normal output, a timeout an ``is_error`` one."""
        failure = self._check.failure(arguments, kind="command")
        if failure is not None:
            return failure
        try:
            root = workspace_root(context.workspace)
        except WorkspacePathError as exc:
            return path_failure(exc, kind="command")
        timeout_s = min(float(arguments.get("timeout_s", context.timeout_s)), context.timeout_s)
        command = str(arguments["command"])
        capture = _OutputCapture(context.max_output_bytes)
        async with _OutputPipe(capture) as pipe:
            try:
                launcher = await self._start(command, root, pipe.write_fd)
            except OSError as exc:
                return error_output(
                    f"could not start the command launcher ({self._python!r}): "
                    f"{exc.strerror or exc}",
                    error_type="os_error",
                    kind="command",
                )
            finally:
                pipe.close_write_end()
            outcome = await _supervise(launcher, pipe, timeout_s)
        if outcome.report.get("error"):
            return error_output(
                f"could not start {self._shell!r} for the command: {outcome.report['error']}",
                error_type="os_error",
                kind="command",
            )
        return _command_output(outcome, capture, timeout_s=timeout_s, limits=self._limits)

    async def _start(self, command: str, root: Path, output_fd: int) -> _Launcher:
        report_read, report_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                self._python,
                "-I",
                "-S",
                str(_LAUNCHER),
                cwd=root,
                env={},
                stdin=asyncio.subprocess.PIPE,
                stdout=output_fd,
                stderr=output_fd,
                start_new_session=True,
                pass_fds=(report_write,),
            )
        except BaseException:
            os.close(report_read)
            raise
        finally:
            os.close(report_write)
        launcher = _Launcher(process, report_read)
        request = {
            "shell": self._shell,
            "command": command,
            "env": self._environment.variables(root),
            "limits": self._limits.model_dump(),
            "parent_pid": os.getpid(),
            "report_fd": report_write,
            "workspace_identity": expected_identity(),
        }
        try:
            await launcher.send(json.dumps(request).encode())
        except BaseException:  # cancelled: the launcher has not started the shell yet
            launcher.abandon()
            raise
        return launcher


@dataclass(slots=True)
class _Launcher:
    """The launcher process of one command and the read end of its report pipe."""

    process: asyncio.subprocess.Process
    report_fd: int

    async def send(self, request: bytes) -> None:
        """Hand the launcher its request; a launcher that died early shows in its report."""
        stdin = self.process.stdin
        assert stdin is not None  # created with stdin=PIPE
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            stdin.write(request)
            await stdin.drain()
        stdin.close()

    def abandon(self) -> None:
        """Kill a launcher that has not started the command, and close its report pipe."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        os.close(self.report_fd)

    def stop(self) -> None:
        """Ask the launcher to kill the command and every process it started."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def read_report(self) -> dict[str, Any]:
        """The launcher's report (after it exited); empty when it wrote none."""
        chunks = []
        os.set_blocking(self.report_fd, False)
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.report_fd, 65536):
                chunks.append(chunk)
        os.close(self.report_fd)
        try:
            report = json.loads(b"".join(chunks) or b"{}")
        except ValueError:
            return {}
        return report if isinstance(report, dict) else {}


@dataclass(frozen=True, slots=True)
class _Run:
    """How a command ended: the launcher's report, and what the tool itself saw."""

    report: dict[str, Any]
    timed_out: bool
    launcher_killed: bool
    stream_left_open: bool


class _OutputCapture:
    """Keeps the first and the last ``max_bytes / 2`` bytes of a stream and hashes all of it."""

    def __init__(self, max_bytes: int) -> None:
        self._head_budget = max(max_bytes, 0) // 2
        self._tail_budget = max(max_bytes, 0) - self._head_budget
        self._head = bytearray()
        self._tail = bytearray()
        self._hasher = hashlib.sha256()
        self.total_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self._hasher.update(chunk)
        self.total_bytes += len(chunk)
        room = self._head_budget - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        if len(self._tail) > 2 * self._tail_budget:
            del self._tail[: len(self._tail) - self._tail_budget]

    @property
    def digest(self) -> str:
        return self._hasher.hexdigest()

    def text(self) -> str:
        """The output, or its beginning and end around a marker naming the omitted size."""
        if self.total_bytes <= self._head_budget + self._tail_budget:
            return bytes(self._head + self._tail).decode("utf-8", errors="replace")
        head = utf8_prefix(bytes(self._head), self._head_budget)
        tail = utf8_suffix(bytes(self._tail), self._tail_budget)
        omitted = self.total_bytes - len(head) - len(tail)
        marker = f"\n[... {omitted} bytes of output omitted ({self.total_bytes} in total) ...]\n"
        return head.decode("utf-8", errors="replace") + marker + tail.decode("utf-8", "replace")


class _CaptureProtocol(asyncio.Protocol):
    """Feeds what arrives on the pipe to the capture; resolves ``closed`` at end of stream."""

    def __init__(self, capture: _OutputCapture, closed: asyncio.Future[None]) -> None:
        self._capture = capture
        self._closed = closed

    def data_received(self, data: bytes) -> None:
        self._capture.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)


class _OutputPipe:
    """A pipe the command writes (stdout and stderr) and the event loop reads into a capture.

    The pipe belongs to the tool, not to the subprocess transport, so that it can be closed
    even when a detached process still holds the write end.
    """

    def __init__(self, capture: _OutputCapture) -> None:
        self._capture = capture
        self._read_fd, self.write_fd = os.pipe()
        self._transport: asyncio.ReadTransport | None = None
        self._closed: asyncio.Future[None] | None = None
        self.stream_left_open = False

    async def __aenter__(self) -> _OutputPipe:
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()
        self._closed = closed
        reader = os.fdopen(self._read_fd, "rb", buffering=0)
        try:
            self._transport, _ = await loop.connect_read_pipe(
                lambda: _CaptureProtocol(self._capture, closed), reader
            )
        except BaseException:
            reader.close()
            self.close_write_end()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close_write_end()
        if self._transport is not None:
            self._transport.close()

    def close_write_end(self) -> None:
        """Close the tool's copy of the write end (the child keeps its own)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    async def wait_closed(self, timeout_s: float) -> bool:
        """True when every writer closed the pipe within ``timeout_s``."""
        assert self._closed is not None  # set by __aenter__
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), timeout_s)
        except TimeoutError:
            return False
        return True


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid``; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _supervise(launcher: _Launcher, pipe: _OutputPipe, timeout_s: float) -> _Run:
    """Wait for the command, stop it at the timeout, drain the output; how it ended.

    The launcher is stopped however the wait ends, cancellation included: an executor that
    gives up on the call leaves no process behind.
    """
    process = launcher.process
    timed_out = launcher_killed = False
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        launcher.stop()
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), _STOP_GRACE_S)
        except TimeoutError:
            launcher_killed = True
        _kill_group(process.pid)  # what is left of the launcher's group, if anything
        await process.wait()
        report = launcher.read_report()
    stream_left_open = not await pipe.wait_closed(_DRAIN_GRACE_S)
    return _Run(report, timed_out, launcher_killed or not report, stream_left_open)


def _exit_code(run: _Run) -> int:
    if run.timed_out:
        return TIMEOUT_EXIT_CODE
    status = run.report.get("status")
    if not isinstance(status, int):
        return -1
    returncode = os.waitstatus_to_exitcode(status)
    return 128 - returncode if returncode < 0 else returncode


def _processes(count: int) -> str:
    return "1 process" if count == 1 else f"{count} processes"


def _process_notes(run: _Run, timeout_s: float) -> list[str]:
    """What happened to the command's processes, as the model reads it."""
    report = run.report
    killed = int(report.get("killed", 0))
    notes = []
    if run.timed_out:
        started = "" if not killed else f" and the {_processes(killed)} it started"
        notes.append(f"[timed out after {timeout_s:g}s: killed the command{started}]")
    elif killed:
        notes.append(
            f"[the command left {_processes(killed)} running when it ended; "
            f"{'it was' if killed == 1 else 'they were'} killed]"
        )
    survivors = int(report.get("survivors", 0))
    if survivors:
        notes.append(f"[{_processes(survivors)} could not be killed and may still run]")
    if run.launcher_killed:
        notes.append(
            "[the command launcher did not answer and was killed with its process group; "
            "processes that left the group may still run]"
        )
    elif not report.get("subreaper", True):
        notes.append(
            "[no subreaper on this system: the command's process group was killed, "
            "processes that left it (setsid) may still run]"
        )
    if run.stream_left_open:
        notes.append("[a detached process kept the output open; stopped reading it]")
    return notes


@dataclass(frozen=True, slots=True)
class _LimitHit:
    """A limit, the signal that enforces it, the messages that show it, and the note."""

    name: str
    setting: str
    signal_name: str | None
    phrases: tuple[str, ...]
    note: str


_LIMIT_HITS = (
    _LimitHit(
        "file_size",
        "max_file_bytes",
        "SIGXFSZ",
        ("File size limit exceeded", "File too large"),
        "[limit: a process tried to write a file larger than {value} bytes and was refused "
        "(RLIMIT_FSIZE); write smaller files]",
    ),
    _LimitHit(
        "cpu",
        "max_cpu_s",
        "SIGXCPU",
        ("CPU time limit exceeded",),
        "[limit: a process used its {value} s of CPU time and was stopped (RLIMIT_CPU)]",
    ),
    _LimitHit(
        "processes",
        "max_processes",
        None,
        ("Resource temporarily unavailable", "Cannot fork", "can't fork", "fork: retry"),
        "[limit: starting a process failed; a command may start at most {value} processes "
        "(RLIMIT_NPROC)]",
    ),
    _LimitHit(
        "memory",
        "max_memory_bytes",
        None,
        ("Cannot allocate memory", "MemoryError", "std::bad_alloc"),
        "[limit: a memory allocation failed; each process may use at most {value} bytes of "
        "address space (RLIMIT_AS)]",
    ),
)


def _limits_hit(run: _Run, exit_code: int, text: str, limits: CommandLimits) -> list[_LimitHit]:
    signals = run.report.get("limit_signals") or {}
    hits = []
    for hit in _LIMIT_HITS:
        if getattr(limits, hit.setting) is None:
            continue
        by_signal = hit.signal_name is not None and (
            hit.signal_name in signals or exit_code == 128 + signal.Signals[hit.signal_name].value
        )
        if by_signal or any(phrase in text for phrase in hit.phrases):
            hits.append(hit)
    return hits


def _command_output(
    run: _Run, capture: _OutputCapture, *, timeout_s: float, limits: CommandLimits
) -> ToolOutput:
    exit_code = _exit_code(run)
    text = capture.text()
    hits = _limits_hit(run, exit_code, text, limits)
    lines = [f"exit code: {exit_code}", *_process_notes(run, timeout_s)]
    lines += [hit.note.format(value=getattr(limits, hit.setting)) for hit in hits]
    content = "\n".join([*lines, text])
    metadata = {
        "kind": "command",
        "exit_code": str(exit_code),
        "output_hash": capture.digest,
        "output_bytes": str(capture.total_bytes),
    }
    killed = int(run.report.get("killed", 0))
    if killed:
        metadata["killed_processes"] = str(killed)
    if hits:
        metadata["limit_hit"] = ",".join(hit.name for hit in hits)
    if run.timed_out:
        metadata["error_type"] = "timeout"
    return ToolOutput(content=content, is_error=run.timed_out, metadata=metadata)
