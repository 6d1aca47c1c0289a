"""MCP tool servers driven for real (the SDK's server in tests/fakes, over stdio and over
streamable HTTP): listing, calls, reuse of a task's connection, one restart after a crash or a
timeout, clear failures naming the server, and the confinement of a stdio server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.mcp import McpListing, McpServerSpec, McpTarget
from tests.fakes.mcp_http import HttpMcpServer, stdio_command
from workers.tools.base import ToolContext
from workers.tools.mcp import (
    IDEMPOTENCY_META_KEY,
    McpServerError,
    McpSessions,
    McpTool,
    McpToolLookup,
    definitions,
)

STDIO = McpServerSpec(name="fake", command=stdio_command())


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpMcpServer]:
    """The fake server over streamable HTTP on a private port."""
    with HttpMcpServer(tmp_path / "http-server.log") as server:
        yield server


def _text(result: object) -> str:
    content = getattr(result, "content")  # noqa: B009 - a CallToolResult
    return "\n".join(block.text for block in content)


async def _listed(sessions: McpSessions, spec: McpServerSpec, workspace: Path) -> McpListing:
    listing = await sessions.list_tools("t1", [spec], workspace, 30)
    assert listing.error is None, listing.error
    return listing


def test_a_stdio_server_is_listed_called_and_reused(tmp_path: Path) -> None:
    """Its tools are offered as fake__<tool> with their schemas; calls of one task share one
    server process."""

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            listing = await _listed(sessions, STDIO, tmp_path)
            offered = {d.name: d for d in definitions(listing)}
            assert {"fake__echo", "fake__add", "fake__hang"} <= set(offered)
            assert offered["fake__add"].parameters["required"] == ["a", "b"]
            add = McpTarget(server=STDIO, tool="add")
            assert _text(await sessions.call("t1", add, tmp_path, {"a": 2, "b": 3}, 10)) == "5"
            count = McpTarget(server=STDIO, tool="calls")
            first = int(_text(await sessions.call("t1", count, tmp_path, {}, 10)))
            second = int(_text(await sessions.call("t1", count, tmp_path, {}, 10)))
            assert second == first + 1  # the same process answered both
            assert sessions.open_count() == 1 and sessions.restarts == 0
            await sessions.close_task("t1")
            assert sessions.open_count() == 0
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_an_http_server_is_listed_and_called(tmp_path: Path, http_server: HttpMcpServer) -> None:
    """Over streamable HTTP the same tools answer, on one session reused across calls."""
    spec = McpServerSpec(name="web", url=http_server.url)

    async def scenario() -> None:
        sessions = McpSessions(allow_private_network=True)  # the fake listens on 127.0.0.1
        try:
            listing = await _listed(sessions, spec, tmp_path)
            assert "web__echo" in {t.offered for t in listing.tools}
            echo = McpTarget(server=spec, tool="echo")
            result = await sessions.call("t1", echo, tmp_path, {"text": "hi"}, 10)
            assert _text(result) == "echo: hi"
            count = McpTarget(server=spec, tool="calls")
            first = int(_text(await sessions.call("t1", count, tmp_path, {}, 10)))
            second = int(_text(await sessions.call("t1", count, tmp_path, {}, 10)))
            assert second == first + 1
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_crashed_server_is_restarted_once_and_the_call_retried(tmp_path: Path) -> None:
    """A server that exits mid-call is started again and the call sent again: it answers."""

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            await _listed(sessions, STDIO, tmp_path)
            target = McpTarget(server=STDIO, tool="crash_once")
            result = await sessions.call("t1", target, tmp_path, {}, 10)
            assert _text(result) == "survived a restart"
            assert sessions.restarts == 1
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_server_that_keeps_crashing_fails_the_call_naming_it(tmp_path: Path) -> None:
    """After one restart the call fails with the server's name and error."""

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            target = McpTarget(server=STDIO, tool="crash")
            with pytest.raises(McpServerError) as caught:
                await sessions.call("t1", target, tmp_path, {}, 10)
            assert caught.value.server == "fake"
            message = str(caught.value)
            assert "MCP server 'fake'" in message and "Connection closed" in message
            assert "failed again after restarting the server" in message
            assert sessions.restarts == 1
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_server_that_never_answers_times_out_clearly(tmp_path: Path) -> None:
    """A call that gets no answer is tried once more on a new server, then fails saying it
    timed out, in bounded time."""

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            await _listed(sessions, STDIO, tmp_path)
            target = McpTarget(server=STDIO, tool="hang")
            started = time.monotonic()
            with pytest.raises(McpServerError, match=r"'fake'.*timed out.*after restarting"):
                await sessions.call("t1", target, tmp_path, {}, 1.0)
            assert time.monotonic() - started < 30
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_server_that_cannot_start_is_a_listing_error_naming_it(tmp_path: Path) -> None:
    """The listing says which server failed and quotes what it wrote on stderr."""
    broken = McpServerSpec(name="broken", command=stdio_command("--fail-start"))
    missing = McpServerSpec(name="missing", command=["/nonexistent/mcp-server"])
    unreachable = McpServerSpec(name="gone", url="http://127.0.0.1:9/mcp")

    async def scenario() -> None:
        sessions = McpSessions(start_timeout_s=20, allow_private_network=True)
        try:
            listing = await sessions.list_tools("t1", [broken], tmp_path, 20)
            assert listing.error is not None and "MCP server 'broken'" in listing.error
            assert "refusing to start (--fail-start)" in listing.error
            listing = await sessions.list_tools("t1", [missing], tmp_path, 20)
            assert listing.error is not None and "'missing'" in listing.error
            assert "No such file" in listing.error or "FileNotFoundError" in listing.error
            listing = await sessions.list_tools("t1", [unreachable], tmp_path, 20)
            assert listing.error is not None and "'gone'" in listing.error
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_stdio_server_runs_confined_in_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its folder is the workspace and its environment the scrubbed one of a command plus its
    own ``env``: no key or setting of the worker reaches it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    monkeypatch.setenv("ORGA_REDIS_URL", "redis://secret")
    spec = McpServerSpec(name="fake", command=stdio_command(), env={"NOTES_DIR": "notes"})

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            target = McpTarget(server=spec, tool="environment")
            seen = json.loads(_text(await sessions.call("t1", target, tmp_path, {}, 10)))
        finally:
            await sessions.aclose()
        assert seen["cwd"] == str(tmp_path)
        assert "OPENAI_API_KEY" not in seen["names"] and "ORGA_REDIS_URL" not in seen["names"]
        assert {"PATH", "HOME", "LANG", "TERM", "NOTES_DIR"} <= set(seen["names"])
        assert "ORGA_LAUNCH_REQUEST" not in seen["names"]  # the launcher's request stays its own
        # Its parent is the launcher, whose environment holds no key or setting either.
        assert seen["parent_names"] and "OPENAI_API_KEY" not in seen["parent_names"]
        settings = {name for name in seen["parent_names"] if name.startswith("ORGA_")}
        assert settings <= {"ORGA_LAUNCH_REQUEST"}

    asyncio.run(scenario())


def test_the_tool_lookup_runs_mcp_names_through_their_target(tmp_path: Path) -> None:
    """An unregistered ``server__tool`` name is an MCP tool; without a target it answers an
    error, with one it calls the server."""

    async def scenario() -> None:
        sessions = McpSessions()
        lookup = McpToolLookup({}, sessions)
        assert lookup.get("plain") is None
        tool = lookup.get("fake__echo")
        assert isinstance(tool, McpTool) and tool.starts_processes
        context = ToolContext(workspace=tmp_path, task_id="t1", timeout_s=20)
        assert (await tool.run({"text": "x"}, context)).is_error
        targeted = context.model_copy(update={"mcp": McpTarget(server=STDIO, tool="echo")})
        try:
            output = await tool.run({"text": "x"}, targeted)
        finally:
            await sessions.aclose()
        assert output.content == "echo: x" and not output.is_error
        assert output.metadata["mcp_server"] == "fake" and output.metadata["kind"] == "other"

    asyncio.run(scenario())


def test_the_sdk_is_imported_by_the_first_connection_only() -> None:
    """A worker that runs no MCP server does not pay for importing the SDK (seconds)."""
    probe = "import sys, workers.runtime, workers.tasks; print('mcp' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def test_the_broken_connection_codes_are_the_sdks() -> None:
    """The codes that make a call restart the server are the SDK's connection-closed and
    request-timeout codes."""
    from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    from workers.tools import mcp as module

    assert frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT}) == module.RESTART_CODES


def test_the_tool_profile_and_allow_list_filter_mcp_tools_by_glob() -> None:
    """MCP tools join the registry's before the allow-list and the tool profile's globs, so
    ``notes__*`` keeps a server's tools and ``*__delete*`` drops some of them."""
    from shared.inference import ToolDefinition
    from shared.loop_types import LoopConfig
    from shared.tool_profile import ToolProfile
    from workers.handlers import prepare_tools

    builtin = [ToolDefinition(name="file_read", description="", parameters={"type": "object"})]
    mcp = [
        ToolDefinition(name=name, description="", parameters={"type": "object"})
        for name in ("notes__save", "notes__delete_all", "search__query")
    ]
    profile = ToolProfile(include=["notes__*", "file_*"], exclude=["*__delete*"])
    config = LoopConfig(tool_profile=profile)
    offered = prepare_tools(builtin, config, None, mcp).tool_definitions
    assert [d.name for d in offered] == ["file_read", "notes__save"]
    allowed = prepare_tools(builtin, LoopConfig(), ["search__query"], mcp).tool_definitions
    assert [d.name for d in allowed] == ["search__query"]


def test_an_idle_connection_is_closed_and_started_again_when_needed(tmp_path: Path) -> None:
    """A connection unused past the idle timeout is closed (its server stops); the task's next
    call starts a new one."""

    async def scenario() -> None:
        sessions = McpSessions(idle_timeout_s=0.3)
        try:
            count = McpTarget(server=STDIO, tool="calls")
            assert _text(await sessions.call("t1", count, tmp_path, {}, 10)) == "1"
            await asyncio.sleep(0.5)
            await sessions.close_idle()
            assert sessions.open_count() == 0
            assert _text(await sessions.call("t1", count, tmp_path, {}, 10)) == "1"  # new one
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_failing_server_s_error_quotes_no_credential(tmp_path: Path) -> None:
    """A deployment server may hold credentials in its URL or argv: the error that reaches the
    journal names the server without userinfo, query or a credential option's value."""
    web = McpServerSpec(name="gone", url="http://me:hunter2@127.0.0.1:9/mcp?token=s3cr3t")
    stdio = McpServerSpec(name="missing", command=["/nonexistent/mcp", "--api-key", "s3cr3t"])

    async def scenario() -> None:
        sessions = McpSessions(start_timeout_s=20, trusted=(web, stdio))
        try:
            for spec in (web, stdio):
                listing = await sessions.list_tools("t1", [spec], tmp_path, 20)
                assert listing.error is not None and f"'{spec.name}'" in listing.error
                assert "s3cr3t" not in listing.error and "hunter2" not in listing.error
            again = await sessions.list_tools("t1", [web], tmp_path, 20)
            assert again.error is not None and "http://127.0.0.1:9/mcp?***" in again.error
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_an_idle_connection_of_an_active_task_is_kept(tmp_path: Path) -> None:
    """A task still active (e.g. awaiting a reviewer) keeps its idle connection: the server's
    state survives; once the task is no longer active the idle connection is closed. When the
    active tasks cannot be read nothing is closed."""
    active: set[str] = {"t1"}
    asked: list[list[str]] = []

    async def active_tasks(task_ids: list[str]) -> set[str]:
        asked.append(task_ids)
        if "unreadable" in active:
            raise ConnectionError("redis down")
        return active & set(task_ids)

    async def scenario() -> None:
        sessions = McpSessions(idle_timeout_s=0.3)
        sessions.active_tasks = active_tasks
        try:
            count = McpTarget(server=STDIO, tool="calls")
            assert _text(await sessions.call("t1", count, tmp_path, {}, 10)) == "1"
            await asyncio.sleep(0.5)
            await sessions.close_idle()
            assert sessions.open_count() == 1 and asked == [["t1"]]
            assert _text(await sessions.call("t1", count, tmp_path, {}, 10)) == "2"  # same one
            active.clear()
            active.add("unreadable")
            await asyncio.sleep(0.5)
            await sessions.close_idle()
            assert sessions.open_count() == 1
            active.clear()
            await sessions.close_idle()
            assert sessions.open_count() == 0
        finally:
            await sessions.aclose()

    asyncio.run(scenario())


def test_a_call_carries_its_idempotency_key_in_meta_also_when_sent_again(tmp_path: Path) -> None:
    """``tools/call`` carries the call's idempotency key in ``_meta``; the resend after a crash
    (the call may have run: at least once) carries the same key, so a server can run it once."""

    async def scenario() -> None:
        sessions = McpSessions()
        tool = McpToolLookup({}, sessions).get("fake__request_meta")
        assert isinstance(tool, McpTool)
        target = McpTarget(server=STDIO, tool="request_meta")
        context = ToolContext(
            workspace=tmp_path, task_id="t1", timeout_s=20, idempotency_key="k-1", mcp=target
        )
        try:
            output = await tool.run({"crash_first": True}, context)
        finally:
            await sessions.aclose()
        assert not output.is_error, output.content
        assert json.loads(output.content)[IDEMPOTENCY_META_KEY] == "k-1"
        assert sessions.restarts == 1

    asyncio.run(scenario())
    sent = [json.loads(line) for line in (tmp_path / "meta.log").read_text().splitlines()]
    assert [m.get(IDEMPOTENCY_META_KEY) for m in sent] == ["k-1", "k-1"]
