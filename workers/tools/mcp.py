"""MCP tool servers, reached with the official ``mcp`` SDK's client (``ClientSession`` over
``stdio_client`` or ``streamable_http_client``): their connections, their listings, and the
tool that calls them.

Decisions:

- **Who connects.** A tool worker, never a reasoning worker (:class:`McpTool` declares
  ``starts_processes``): a stdio server is then a child of a process that never had a model
  key in its environment or its memory (:mod:`workers.key_handoff`), as a command is. A
  reasoning worker asks a tool worker for the listing (:mod:`workers.runtime`).
- **Program.** ``command[0]`` is looked up on the command ``PATH``; ``{python}`` stands for the
  worker's own interpreter, which has the SDK (``command: ["{python}", "server.py"]``).
- **Confinement of a stdio server.** It runs under the command launcher
  (:mod:`workers.tools.launcher` in serve mode: the SDK starts ``python -I -S launcher.py
  --serve``, whose request, in an environment variable the launcher removes, names the
  server's argv), so it gets what a command gets: the rlimits of
  :class:`~workers.tools.command.CommandLimits` (the same values as ``run_command``'s), a
  subreaper that kills every process the server started (double-forked or ``setsid``'d ones
  included) when the server exits, when the connection closes (the SDK's SIGTERM) or when the
  worker dies (``PR_SET_PDEATHSIG``). Its current folder is the task's workspace (or ``cwd``,
  a folder inside it); its environment is exactly a command's
  (:class:`~workers.tools.command.CommandEnvironment`: ``PATH``, ``LANG``, ``HOME``=workspace,
  ``TERM``, the operator's extras) plus the server's own ``env``; nothing else of the worker's
  environment reaches it. Its stderr (and the launcher's, when it cannot start the program)
  goes to a private temporary file, whose end is quoted when the server fails.
- **Address of a task's HTTP server.** A server over streamable HTTP that a task (or an agent
  profile) declares may reach only public addresses, as ``web_fetch`` may
  (:mod:`workers.tools.address_policy`): when the connection opens, its host is resolved and a
  loopback, private, link-local, multicast, reserved or unspecified address refuses it with an
  :class:`McpConfigError` naming the URL (redacted), the address, its kind and the fix. The
  connection then goes to the checked addresses (:class:`~workers.tools.pinned_transport.
  PinnedTransport`), not to a second DNS answer, refuses any other host (the SDK follows a
  same-origin 307/308, which goes to the same checked address) and ignores the proxy variables
  of the environment. The operator's servers (``ORGA_MCP_SERVERS``) are trusted and
  not checked, nor is anything when ``ORGA_ALLOW_PRIVATE_NETWORK`` is set.
- **Reuse.** One connection per task and server (by the server's declaration digest) in each
  worker process, kept between calls: with several tool workers a task's calls may reach
  several processes, each with its own connection (a stateful server sees them split). A
  connection is closed when its task ends, when the worker stops (:meth:`McpSessions.close_task`
  closes a task's at once), or when unused for ``ORGA_MCP_IDLE_TIMEOUT_S`` *and* its task is
  no longer active (:attr:`McpSessions.active_tasks`: a task awaiting a reviewer keeps it).
- **One restart.** A call that fails because the connection broke (the server exited, the
  HTTP session was lost) or the server did not answer within the tool timeout closes the
  connection, opens a new one and sends the call once more, so an MCP call is *at least
  once* after a timeout (it may have run before the server stopped answering); both sends
  carry the call's idempotency key in the request's ``_meta`` (:data:`IDEMPOTENCY_META_KEY`)
  for a server that deduplicates; a second failure is
  :class:`McpServerError`, naming the server and the error, which the executor counts on the
  tool's circuit breaker and hands to the recovery strategy. An error the server *answers*
  (an unknown tool, invalid arguments, a tool result with ``isError``) is not retried.
- **Listing.** :meth:`McpSessions.list_tools` connects to every server of the task and lists
  its tools (following ``nextCursor``); a server that cannot start or list is an
  :class:`McpConfigError` naming it and the cause, reported in the listing (the reasoning then
  fails with it as a configuration error).

The SDK's connections are anyio context managers that must be left by the task that entered
them: each connection therefore lives in an asyncio task of its own (:class:`McpConnection`),
which callers on any task of the loop use through its session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from shared.errors import ConfigError, OrgaError
from shared.inference import ToolDefinition
from shared.mcp import (
    PYTHON_PLACEHOLDER,
    McpListing,
    McpServerSpec,
    McpTarget,
    McpToolEntry,
    is_mcp_tool,
    offered_tool_name,
    redact_command,
    redact_url,
)
from workers.tools import launcher
from workers.tools.address_policy import (
    BLOCKED_KINDS,
    IPAddress,
    Resolver,
    SystemResolver,
    checked_addresses,
)
from workers.tools.base import Tool, ToolContext, ToolOutput
from workers.tools.command import CommandEnvironment, CommandLimits
from workers.tools.errors import BlockedAddressError, WorkspacePathError
from workers.tools.output import error_output
from workers.tools.workspace import resolve_in_workspace

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "PYTHON_PLACEHOLDER",
    "RESTART_CODES",
    "McpConfigError",
    "McpConnection",
    "McpServerError",
    "McpSessions",
    "McpTool",
    "McpToolLookup",
    "definitions",
    "result_output",
]

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, RequestParamsMeta
    from mcp.types import Tool as McpToolInfo

    from workers.executor import ToolLookup

log = logging.getLogger("orga.worker.mcp")

_STDERR_TAIL = 600
_CLOSE_GRACE_S = 5.0
_LIST_PAGES = 100
_TOOLS_KEPT = 4096
_LAUNCHER = Path(launcher.__file__)
_MAX_REQUEST_BYTES = 100_000
"""A serve request larger than this is refused (the kernel caps one environment string at
128 KiB)."""
ATTEMPT_SHARE = 0.45
"""Each of a call's two attempts may take this share of the tool timeout."""
IDEMPOTENCY_META_KEY = "orga/idempotency_key"
"""The ``_meta`` key of a ``tools/call`` that carries the call's idempotency key: the same on
the resend after a timeout or a broken connection, so a server may run the call once."""
RESTART_CODES = frozenset({-32000, -32001})
"""``mcp.types.CONNECTION_CLOSED`` and ``REQUEST_TIMEOUT``: the connection is unusable."""


class McpServerError(OrgaError):
    """A call to an MCP server failed twice (before and after a restart): ``server`` names it."""

    def __init__(self, message: str, server: str) -> None:
        super().__init__(message)
        self.server = server


class McpConfigError(ConfigError):
    """An MCP server could not be started, reached or listed: a configuration error of the
    task (or the deployment) naming the server and the cause."""


class McpConnection:
    """One live session with one server, owned by an asyncio task of its own."""

    def __init__(
        self,
        spec: McpServerSpec,
        workspace: Path,
        environment: CommandEnvironment,
        python: str = sys.executable,
        limits: CommandLimits | None = None,
        *,
        address_check: Resolver | None = None,
    ) -> None:
        self.spec = spec
        self.workspace = workspace
        self.environment = environment
        self.python = python
        self.limits = limits or CommandLimits()
        self.address_check = address_check
        """The resolver of the address policy for a task's HTTP server; None: not checked (a
        stdio server, an operator's server, or the private network allowed)."""
        self._pinned: tuple[str, list[IPAddress]] | None = None
        self.last_used = time.monotonic()
        self._session: ClientSession | None = None
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stderr: IO[str] | None = None
        self._failure: BaseException | None = None

    @property
    def alive(self) -> bool:
        """Whether the session is open and its owner still runs."""
        return self._session is not None and self._owner is not None and not self._owner.done()

    async def open(self, timeout_s: float) -> None:
        """Start the server (stdio) or the session (HTTP) and initialize it, within
        ``timeout_s``; McpConfigError naming the server and the cause otherwise."""
        if self.spec.url is not None and self.address_check is not None:
            self._pinned = await self._checked_host(self.spec.url, self.address_check, timeout_s)
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._owner = asyncio.create_task(self._own(), name=f"mcp-{self.spec.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except TimeoutError:
            message = self._describe(f"did not start within {timeout_s:g}s")
            await self.aclose()
            raise McpConfigError(message) from None
        except Exception as exc:
            message = self._describe(_reason(exc))
            await self.aclose()
            raise McpConfigError(message) from exc

    async def _checked_host(
        self, url: str, resolver: Resolver, timeout_s: float
    ) -> tuple[str, list[IPAddress]]:
        """``url``'s host (as on the wire) and its addresses, every one public; McpConfigError
        naming the URL, the address, its kind and the fix otherwise."""
        import httpx2

        parsed = httpx2.URL(url)
        host = parsed.raw_host.decode("ascii")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            async with asyncio.timeout(timeout_s):
                return host, await checked_addresses(host, port, resolver, allow_private=False)
        except BlockedAddressError as exc:
            raise McpConfigError(
                self._describe(
                    f"{exc.finding}; a server that a task or an agent profile declares may not "
                    f"reach {BLOCKED_KINDS} addresses (it would make a tool worker post to "
                    "cloud metadata, Redis or internal hosts); declare the server in the "
                    "workers' ORGA_MCP_SERVERS file, or set ORGA_ALLOW_PRIVATE_NETWORK=true "
                    "on the workers when every submitter is trusted"
                )
            ) from exc
        except (OSError, TimeoutError) as exc:
            cause = "it did not resolve in time" if isinstance(exc, TimeoutError) else exc
            raise McpConfigError(
                self._describe(f"could not resolve host {host!r}: {cause}")
            ) from exc

    async def _own(self) -> None:
        """Enter the SDK's contexts, serve until told to stop (or until the transport
        fails), and leave them on this same task."""
        assert self._ready is not None
        from mcp import ClientSession  # the SDK is imported by the first connection only

        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(await self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self._session = session
                self._ready.set_result(None)
                await self._stop.wait()
        except Exception as exc:  # reported to the waiting opener, or to the next caller
            self._failure = exc
            if not self._ready.done():
                self._ready.set_exception(exc)
        finally:
            self._session = None
            if not self._ready.done():
                self._ready.set_exception(ConnectionError("closed before it was initialized"))

    async def _transport(
        self, stack: AsyncExitStack
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        import httpx2
        from mcp import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        spec = self.spec
        if spec.command is not None:
            cwd = self._cwd()
            request = self._launch_request()
            # Kept open until aclose, so a failure can quote what the server wrote.
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
            parameters = StdioServerParameters(
                command=self.python,
                args=["-I", "-S", str(_LAUNCHER), launcher.SERVE_FLAG],
                env={launcher.REQUEST_VARIABLE: request},
                cwd=str(cwd),
            )
            return stdio_client(parameters, errlog=self._stderr)
        assert spec.url is not None
        timeout = httpx2.Timeout(30.0, read=300.0)
        if self._pinned is None:
            client = httpx2.AsyncClient(headers=spec.headers, timeout=timeout)
        else:
            from workers.tools.pinned_transport import PinnedTransport

            client = httpx2.AsyncClient(
                headers=spec.headers,
                timeout=timeout,
                transport=PinnedTransport(*self._pinned),
                follow_redirects=False,
                trust_env=False,
            )
        # The SDK leaves a client it was given open: the stack closes it with the session.
        await stack.enter_async_context(client)
        return streamable_http_client(spec.url, http_client=client)

    def _launch_request(self) -> str:
        """The launcher's serve request (JSON): the server's argv, its environment (a
        command's plus its own ``env``), the command limits and this worker's pid."""
        assert self.spec.command is not None
        program, *args = self.spec.command
        request = json.dumps(
            {
                "argv": [self.python if program == PYTHON_PLACEHOLDER else program, *args],
                "env": {**self.environment.variables(self.workspace), **self.spec.env},
                "limits": self.limits.model_dump(),
                "parent_pid": os.getpid(),
            }
        )
        if len(request.encode()) > _MAX_REQUEST_BYTES:
            raise ValueError(
                f"its command and env take {len(request.encode())} bytes, more than the "
                f"{_MAX_REQUEST_BYTES} a server's launch request may hold; shorten them "
                "(put long settings in a file in the workspace)"
            )
        return request

    def _cwd(self) -> Path:
        if self.spec.cwd is None:
            return self.workspace
        try:
            return resolve_in_workspace(self.workspace, self.spec.cwd)
        except WorkspacePathError as exc:
            raise McpConfigError(self._describe(f"cwd {self.spec.cwd!r}: {exc}")) from exc

    def session(self) -> ClientSession:
        """The open session; McpServerError when it has closed."""
        session = self._session
        if session is None or not self.alive:
            raise McpServerError(self._describe("the connection is closed"), self.spec.name)
        self.last_used = time.monotonic()
        return session

    async def list_tools(self, timeout_s: float) -> list[McpToolInfo]:
        """Every tool of the server (all pages)."""
        session = self.session()
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES):
            params = None if cursor is None else {"cursor": cursor}
            page = await asyncio.wait_for(session.list_tools(params=params), timeout_s)  # type: ignore[arg-type]
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout_s: float,
        *,
        idempotency_key: str | None = None,
    ) -> CallToolResult:
        """One ``tools/call`` (with ``_meta`` carrying ``idempotency_key`` when given);
        MCPError or a transport error when it fails."""
        session = self.session()
        # An open map (extra items allowed): the SDK's TypedDict names only the reserved keys.
        meta = (
            None
            if idempotency_key is None
            else cast("RequestParamsMeta", {IDEMPOTENCY_META_KEY: idempotency_key})
        )
        return await asyncio.wait_for(
            session.call_tool(tool, arguments, read_timeout_seconds=timeout_s, meta=meta),
            timeout_s + 1.0,
        )

    async def aclose(self) -> None:
        """Close the session and stop the server (the launcher kills every process it started)."""
        self._stop.set()
        owner = self._owner
        if owner is not None and not owner.done():
            try:
                await asyncio.wait_for(asyncio.shield(owner), _CLOSE_GRACE_S)
            except (TimeoutError, asyncio.CancelledError):
                owner.cancel()
                with contextlib.suppress(BaseException):
                    await owner
        if self._stderr is not None:
            self._stderr.close()

    def _describe(self, cause: str) -> str:
        spec = self.spec
        where = (
            f"command {redact_command(spec.command)!r}"
            if spec.command
            else f"url {redact_url(spec.url or '')!r}"
        )
        tail = self.stderr_tail()
        said = f"; its stderr ends with: {tail!r}" if tail else ""
        return f"MCP server {self.spec.name!r} ({where}): {cause}{said}"

    def describe_failure(self, exc: BaseException) -> str:
        """What happened to a call, naming the server (and quoting its stderr's end)."""
        failure = self._failure
        cause = _reason(exc)
        if failure is not None and failure is not exc and not _answered(failure):
            cause = f"{cause} (the connection ended with {_reason(failure)})"
        return self._describe(cause)

    def stderr_tail(self) -> str:
        """The last characters the server wrote on stderr (stdio servers)."""
        handle = self._stderr
        if handle is None or handle.closed:
            return ""
        with contextlib.suppress(OSError, ValueError):
            handle.flush()
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - _STDERR_TAIL * 4))
            return handle.read()[-_STDERR_TAIL:].strip()
        return ""


def _reason(exc: BaseException) -> str:
    from mcp import MCPError

    if isinstance(exc, MCPError):
        return f"MCP error {exc.code}: {exc.message}"
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _answered(exc: BaseException) -> bool:
    from mcp import MCPError

    return isinstance(exc, MCPError)


def _broken(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is unusable (then restart once) rather than that the
    server answered with an error."""
    from mcp import MCPError

    if isinstance(exc, MCPError):
        return exc.code in RESTART_CODES
    return isinstance(exc, Exception)


class McpSessions:
    """The MCP connections of one worker process: per task and server, reused across calls."""

    def __init__(
        self,
        environment: CommandEnvironment | None = None,
        idle_timeout_s: float = 300.0,
        start_timeout_s: float = 60.0,
        python: str = sys.executable,
        limits: CommandLimits | None = None,
        *,
        allow_private_network: bool = False,
        trusted: Sequence[McpServerSpec] = (),
        resolver: Resolver | None = None,
    ) -> None:
        self.environment = environment or CommandEnvironment()
        self.limits = limits or CommandLimits()
        """The rlimits of a stdio server: those of ``run_command``'s commands."""
        self.python = python
        """What ``{python}`` as a server's program stands for: the worker's interpreter."""
        self.idle_timeout_s = idle_timeout_s
        self.start_timeout_s = start_timeout_s
        """How long a server may take to start and answer ``initialize``."""
        self.allow_private_network = allow_private_network
        """``ORGA_ALLOW_PRIVATE_NETWORK``: a task's HTTP server may reach any address."""
        self._trusted = frozenset((s.name, s.digest()) for s in trusted)
        """The operator's servers (``ORGA_MCP_SERVERS``): never address-checked."""
        self.resolver = resolver or SystemResolver()
        self._connections: dict[tuple[str, str], McpConnection] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._dropped: set[tuple[str, str]] = set()
        self.restarts = 0
        """How many connections were opened again after one broke (for tests and logs)."""
        self.on_open: Callable[[], None] | None = None
        """Called when a connection opens (a worker process starts its reaper there)."""
        self.active_tasks: Callable[[list[str]], Awaitable[set[str]]] | None = None
        """Which of the given tasks are still active (not ended; awaiting a review counts):
        their idle connections are kept. A worker process answers from Redis; None keeps
        none (an idle connection is closed whatever its task)."""

    async def connection(self, task_id: str, spec: McpServerSpec, workspace: Path) -> McpConnection:
        """The task's open connection to ``spec``, opened when there is none (or it broke)."""
        await self.close_idle()
        key = (task_id, spec.name + ":" + spec.digest())
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            current = self._connections.get(key)
            if current is not None and current.alive:
                return current
            if current is not None:
                await current.aclose()
            if current is not None or key in self._dropped:
                self.restarts += 1
                self._dropped.discard(key)
            fresh = McpConnection(
                spec,
                workspace,
                self.environment,
                self.python,
                self.limits,
                address_check=self._address_check(spec),
            )
            self._connections.pop(key, None)
            await fresh.open(self.start_timeout_s)
            self._connections[key] = fresh
            if self.on_open is not None:
                self.on_open()
            return fresh

    def _address_check(self, spec: McpServerSpec) -> Resolver | None:
        """The resolver that checks ``spec``'s address: None for a stdio server, an operator's
        server, or when the private network is allowed."""
        trusted = (spec.name, spec.digest()) in self._trusted
        if spec.url is None or trusted or self.allow_private_network:
            return None
        return self.resolver

    async def _drop(self, task_id: str, spec: McpServerSpec, broken: McpConnection) -> None:
        key = (task_id, spec.name + ":" + spec.digest())
        async with self._locks.setdefault(key, asyncio.Lock()):
            if self._connections.get(key) is broken:
                del self._connections[key]
                self._dropped.add(key)
        await broken.aclose()

    async def list_tools(
        self,
        task_id: str,
        servers: Sequence[McpServerSpec],
        workspace: Path,
        timeout_s: float,
    ) -> McpListing:
        """Every tool of every server, with its offered name; the first server that cannot
        start or list is named in ``error`` (and nothing is listed)."""
        entries: list[McpToolEntry] = []
        for spec in servers:
            try:
                connection = await self.connection(task_id, spec, workspace)
                tools = await connection.list_tools(timeout_s)
            except McpConfigError as exc:
                return McpListing(error=str(exc))
            except Exception as exc:
                return McpListing(
                    error=f"MCP server {spec.name!r} could not list its tools: {_reason(exc)}"
                )
            entries.extend(_entries(spec.name, tools))
        return McpListing(tools=entries)

    async def call(
        self,
        task_id: str,
        target: McpTarget,
        workspace: Path,
        arguments: dict[str, Any],
        timeout_s: float,
        *,
        idempotency_key: str | None = None,
    ) -> CallToolResult:
        """``tools/call`` on the task's connection; a broken connection or a call that timed
        out is restarted once and the call sent again (at least once: a call that timed out
        may have run, and runs again), with the same ``idempotency_key`` in its ``_meta``;
        McpServerError after that."""
        spec = target.server
        for attempt in (1, 2):
            try:
                connection = await self.connection(task_id, spec, workspace)
            except McpConfigError as exc:
                raise McpServerError(str(exc), spec.name) from exc
            try:
                return await connection.call(
                    target.tool, arguments, timeout_s, idempotency_key=idempotency_key
                )
            except Exception as exc:
                if not _broken(exc):
                    raise McpServerError(connection.describe_failure(exc), spec.name) from exc
                message = connection.describe_failure(exc)
                await self._drop(task_id, spec, connection)
                log.warning(
                    "mcp.call_failed",
                    extra={"server": spec.name, "tool": target.tool, "attempt": attempt},
                )
                if attempt == 2:
                    raise McpServerError(
                        f"{message}; the call failed again after restarting the server",
                        spec.name,
                    ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def close_task(self, task_id: str) -> None:
        """Close every connection of ``task_id``."""
        for key in [k for k in self._connections if k[0] == task_id]:
            connection = self._connections.pop(key)
            self._locks.pop(key, None)
            self._dropped.discard(key)
            await connection.aclose()

    async def close_idle(self) -> None:
        """Close the connections unused for ``idle_timeout_s`` whose task is no longer active
        (:attr:`active_tasks`): a task waiting for a reviewer keeps its servers' state. When
        the active tasks cannot be read, nothing is closed this time."""
        cutoff = time.monotonic() - self.idle_timeout_s
        idle = [
            key
            for key, connection in self._connections.items()
            if connection.last_used < cutoff
            and ((lock := self._locks.get(key)) is None or not lock.locked())
        ]
        if not idle:
            return
        keep: set[str] = set()
        if self.active_tasks is not None:
            try:
                keep = await self.active_tasks(sorted({task_id for task_id, _ in idle}))
            except Exception as exc:
                log.warning("mcp.active_tasks_unknown", extra={"error": str(exc)[:300]})
                return
        for key in idle:
            connection = self._connections.get(key)
            if key[0] in keep or connection is None or connection.last_used >= cutoff:
                continue
            self._connections.pop(key, None)
            self._locks.pop(key, None)
            await connection.aclose()

    async def aclose(self) -> None:
        """Close every connection."""
        for task_id in {k[0] for k in self._connections}:
            await self.close_task(task_id)

    def task_ids(self) -> set[str]:
        """The tasks that have a connection here."""
        return {task_id for task_id, _server in self._connections}

    def open_count(self) -> int:
        """How many connections are open."""
        return sum(1 for c in self._connections.values() if c.alive)


def _entries(server: str, tools: Sequence[McpToolInfo]) -> list[McpToolEntry]:
    taken: set[str] = set()
    entries = []
    for tool in tools:
        offered = offered_tool_name(server, tool.name, taken)
        taken.add(offered)
        schema = dict(tool.input_schema or {"type": "object"})
        entries.append(
            McpToolEntry(
                offered=offered,
                server=server,
                tool=tool.name,
                description=tool.description or tool.title or "",
                input_schema=schema,
            )
        )
    return entries


def definitions(listing: McpListing) -> list[ToolDefinition]:
    """The listing's tools as the model sees them."""
    return [
        ToolDefinition(
            name=entry.offered,
            description=f"[MCP server {entry.server}] {entry.description}".strip(),
            parameters=entry.input_schema or {"type": "object"},
        )
        for entry in listing.tools
    ]


def result_output(server: str, tool: str, result: CallToolResult) -> ToolOutput:
    """A tool result as an observation: text parts joined, other parts as JSON; the
    structured content when there is no text. Metadata for the stagnation detector:
    ``kind=other``, ``mcp_server``, ``mcp_tool``, ``output_hash``."""
    from mcp.types import TextContent

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, sort_keys=True))
    content = "\n".join(parts)
    return ToolOutput(
        content=content,
        is_error=bool(result.is_error),
        metadata={
            "kind": "other",
            "mcp_server": server,
            "mcp_tool": tool,
            "output_hash": hashlib.sha256(content.encode()).hexdigest(),
        },
    )


class McpToolLookup:
    """The executor's tools plus the MCP tools: a name ``<server>__<tool>`` that no registered
    tool has is an :class:`McpTool` (the call's ``ToolContext.mcp`` says where it goes)."""

    def __init__(self, tools: Mapping[str, Tool] | ToolLookup, sessions: McpSessions) -> None:
        self._tools = tools
        self._sessions = sessions
        self._mcp: dict[str, McpTool] = {}

    def get(self, name: str, /) -> Tool | None:
        """The registered tool, else the MCP tool of that name (None for other names)."""
        tool = self._tools.get(name)
        if tool is not None or not is_mcp_tool(name):
            return tool
        mcp_tool = self._mcp.get(name)
        if mcp_tool is None:
            mcp_tool = self._mcp[name] = McpTool(name, self._sessions)
            while len(self._mcp) > _TOOLS_KEPT:
                self._mcp.pop(next(iter(self._mcp)))
        return mcp_tool

    def __iter__(self) -> Iterator[str]:
        """The registered names (MCP tools are per task, listed apart)."""
        return iter(self._tools)


class McpTool:
    """A tool of an MCP server, offered as ``<server>__<tool>``: the call goes to the task's
    connection (:class:`McpSessions`) with the target the worker resolved from the task's
    listing (``ToolContext.mcp``)."""

    starts_processes = True
    """Never run by a reasoning worker: a stdio server is started by a tool worker only."""

    def __init__(self, name: str, sessions: McpSessions) -> None:
        self._name = name
        self._sessions = sessions

    @property
    def definition(self) -> ToolDefinition:
        """The name only: the schema the model saw is the listing's, checked at the gate."""
        return ToolDefinition(
            name=self._name, description="A tool of an MCP server", parameters={"type": "object"}
        )

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Call the tool; a failure of the server raises McpServerError (the executor counts
        it on the breaker and recovers); a tool result with ``isError`` is an error output."""
        target = context.mcp
        if target is None or context.task_id is None:
            return error_output(
                f"{self._name!r} is not a tool of this task's MCP servers (none lists it)",
                error_type="unknown_tool",
            )
        # Two attempts (and a restart between them) fit in the executor's timeout.
        attempt_s = max(context.timeout_s * ATTEMPT_SHARE, 0.1)
        result = await self._sessions.call(
            context.task_id,
            target,
            context.workspace,
            arguments,
            attempt_s,
            idempotency_key=context.idempotency_key,
        )
        return result_output(target.server.name, target.tool, result)
