"""``run_command``: a shell command in the workspace, with a timeout, a scrubbed environment and
an output cap.

Decisions:

- **Shell.** The command runs as ``/bin/sh -c <command>``: agents write pipes, redirections and
  ``&&``. There is no shell-injection concern to defend against, since the whole string *is* the
  command the gate approved.
- **Environment.** Only ``PATH``, ``LANG``, ``HOME`` (the workspace), ``TERM=dumb`` and the
  operator's explicit extras (:class:`CommandEnvironment`). Nothing is inherited from the worker
  process: its API keys, tokens and ``ORGA_*`` settings never reach the child.
- **Process group.** The shell starts a new session; when it exits, or when the timeout fires,
  the whole group is killed with SIGKILL. Background processes therefore never outlive the call
  (a server started with ``&`` is gone when the command returns).
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
the cap), ``output_bytes``; ``error_type=timeout`` after a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
from collections.abc import Iterable, Mapping
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
from workers.tools.workspace import workspace_root

__all__ = [
    "DEFAULT_PATH",
    "RUN_COMMAND_DEFINITION",
    "SECRET_NAME_PATTERN",
    "TIMEOUT_EXIT_CODE",
    "CommandEnvironment",
    "RunCommandTool",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT_EXIT_CODE = 124
SECRET_NAME_PATTERN = re.compile(
    r"(^ORGA_)|(^AWS_)|(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)$", re.IGNORECASE
)
"""Names that look like secrets; :meth:`CommandEnvironment.from_parent` refuses to copy them."""

_READ_CHUNK_BYTES = 64 * 1024
_DRAIN_GRACE_S = 1.0
_FIXED_NAMES = frozenset({"PATH", "LANG", "HOME", "TERM"})

RUN_COMMAND_DEFINITION = ToolDefinition(
    name="run_command",
    description=(
        "Run a shell command (/bin/sh -c) with the workspace as the current directory. Returns "
        "'exit code: N' and the combined stdout and stderr; long output keeps its beginning and "
        "end. A non-zero exit code is reported, not treated as a failure. The command and every "
        "process it starts are killed at the timeout or when it exits: do not start servers in "
        "the background. The environment is minimal (PATH, LANG, HOME=workspace, TERM=dumb)."
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


class RunCommandTool:
    """``run_command``: ``/bin/sh -c`` in the workspace, bounded in time, output and environment."""

    def __init__(
        self, environment: CommandEnvironment | None = None, *, shell: str = "/bin/sh"
    ) -> None:
        self._environment = environment or CommandEnvironment()
        self._shell = shell
        self._check = ArgumentCheck(RUN_COMMAND_DEFINITION)

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
                process = await self._start(command, root, pipe.write_fd)
            except OSError as exc:
                return error_output(
                    f"could not start {self._shell!r} for the command: {exc.strerror or exc}",
                    error_type="os_error",
                    kind="command",
                )
            finally:
                pipe.close_write_end()
            timed_out = await _supervise(process, pipe, timeout_s)
        return _command_output(
            process,
            capture,
            timed_out=timed_out,
            timeout_s=timeout_s,
            stream_left_open=pipe.stream_left_open,
        )

    async def _start(self, command: str, root: Path, output_fd: int) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            self._shell,
            "-c",
            command,
            cwd=root,
            env=self._environment.variables(root),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            start_new_session=True,
        )


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


async def _supervise(
    process: asyncio.subprocess.Process, pipe: _OutputPipe, timeout_s: float
) -> bool:
    """Wait for the shell, kill its group, drain the output; True when the timeout fired.

    The group is killed however the wait ends, cancellation included: an executor that gives up
    on the call leaves no process behind.
    """
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
        timed_out = False
    except TimeoutError:
        timed_out = True
    finally:
        _kill_group(process.pid)
        await process.wait()  # prompt after SIGKILL; reaps the shell even when cancelled
    pipe.stream_left_open = not await pipe.wait_closed(_DRAIN_GRACE_S)
    return timed_out


def _exit_code(returncode: int | None, timed_out: bool) -> int:
    if timed_out:
        return TIMEOUT_EXIT_CODE
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def _command_output(
    process: asyncio.subprocess.Process,
    capture: _OutputCapture,
    *,
    timed_out: bool,
    timeout_s: float,
    stream_left_open: bool,
) -> ToolOutput:
    exit_code = _exit_code(process.returncode, timed_out)
    lines = [f"exit code: {exit_code}"]
    if timed_out:
        lines.append(
            f"[timed out after {timeout_s:g}s: the command and every process it started "
            "were killed]"
        )
    if stream_left_open:
        lines.append("[a detached process kept the output open; stopped reading it]")
    content = "\n".join([*lines, capture.text()])
    metadata = {
        "kind": "command",
        "exit_code": str(exit_code),
        "output_hash": capture.digest,
        "output_bytes": str(capture.total_bytes),
    }
    if timed_out:
        metadata["error_type"] = "timeout"
    return ToolOutput(content=content, is_error=timed_out, metadata=metadata)
