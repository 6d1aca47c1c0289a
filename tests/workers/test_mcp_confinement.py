"""A stdio MCP server runs under the command launcher (serve mode), driven for real with the
SDK's server in tests/fakes: the rlimits of a command, and no process it started outlives it,
whether the connection closes, the server exits or the worker dies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from shared.mcp import McpServerSpec, McpTarget
from tests.fakes.mcp_http import stdio_command
from workers.tools.base import ToolContext
from workers.tools.command import CommandLimits, RunCommandTool
from workers.tools.mcp import McpSessions

STDIO = McpServerSpec(name="fake", command=stdio_command())
LIMITS = CommandLimits(
    max_processes=300, max_memory_bytes=3 * 2**30, max_file_bytes=5 * 2**20, max_cpu_s=77
)
_PRINT_LIMITS = (
    "import json, resource; print(json.dumps({n: list(resource.getrlimit(getattr(resource, "
    "'RLIMIT_' + n))) for n in ('NPROC', 'AS', 'FSIZE', 'CPU', 'CORE')}))"
)


def _text(result: object) -> str:
    content = getattr(result, "content")  # noqa: B009 - a CallToolResult
    return "\n".join(block.text for block in content)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _gone_within(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _kill(pids: list[int]) -> None:
    """Clean up after a failed assertion: nothing of a test may stay behind."""
    for pid in pids:
        if pid != os.getpid() and _alive(pid):
            os.kill(pid, signal.SIGKILL)


async def _call(sessions: McpSessions, tool: str, workspace: Path) -> Any:
    result = await sessions.call("t1", McpTarget(server=STDIO, tool=tool), workspace, {}, 20)
    return json.loads(_text(result))


def test_a_stdio_server_gets_the_rlimits_of_a_command(tmp_path: Path) -> None:
    """The server's address space, file size, CPU and core limits are exactly those a command
    gets, and its process limit is set the same way (the user's tasks plus max_processes);
    its parent is the launcher."""

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        sessions = McpSessions(limits=LIMITS)
        try:
            seen = await _call(sessions, "limits", tmp_path)
        finally:
            await sessions.aclose()
        context = ToolContext(workspace=tmp_path, task_id="t1", timeout_s=30)
        tool = RunCommandTool(limits=LIMITS)
        output = await tool.run({"command": f'{sys.executable} -c "{_PRINT_LIMITS}"'}, context)
        command = json.loads(output.content.split("\n", 1)[1])
        return seen, command

    seen, command = asyncio.run(scenario())
    server = seen["limits"]
    for name in ("AS", "FSIZE", "CPU", "CORE"):
        assert server[name] == command[name], name
    assert server["AS"] == [3 * 2**30] * 2 and server["FSIZE"] == [5 * 2**20] * 2
    assert server["CPU"] == [77, 78] and server["CORE"] == [0, 0]
    soft, hard = server["NPROC"]
    assert soft == hard and 300 < soft <= command["NPROC"][0] + 64
    assert abs(soft - command["NPROC"][0]) <= 64
    parent = Path(f"/proc/{seen['ppid']}/cmdline")
    assert not parent.exists() or b"launcher.py\0--serve" in parent.read_bytes()


def test_a_detached_grandchild_dies_when_the_connection_closes(tmp_path: Path) -> None:
    """A process the server double-forked into a session of its own (out of reach of the
    SDK's process-group kill) is killed when the task's connection closes."""
    pids: list[int] = []

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            pids.append(await _call(sessions, "spawn_detached", tmp_path))
            pids.append((await _call(sessions, "limits", tmp_path))["pid"])
            assert all(_alive(pid) for pid in pids)
            assert os.getsid(pids[0]) != os.getsid(pids[1])  # it left the server's session
        finally:
            await sessions.close_task("t1")

    try:
        asyncio.run(scenario())
        assert _gone_within(pids, 5), [pid for pid in pids if _alive(pid)]
    finally:
        _kill(pids)


def test_a_detached_grandchild_dies_when_the_server_exits(tmp_path: Path) -> None:
    """When the server process itself ends (here: killed), the launcher kills what it left."""
    pids: list[int] = []

    async def scenario() -> None:
        sessions = McpSessions()
        try:
            pids.append(await _call(sessions, "spawn_detached", tmp_path))
            seen = await _call(sessions, "limits", tmp_path)
            assert seen["ppid"] != os.getpid()  # the launcher stands between
            pids.extend([seen["pid"], seen["ppid"]])
            os.kill(seen["pid"], signal.SIGKILL)
            # The grandchild and the launcher go while the connection is still open.
            assert await asyncio.to_thread(_gone_within, pids, 5)
        finally:
            await sessions.aclose()

    try:
        asyncio.run(scenario())
    finally:
        _kill(pids)


_WORKER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from pathlib import Path
    from shared.mcp import McpServerSpec, McpTarget
    from workers.tools.mcp import McpSessions

    async def main():
        spec = McpServerSpec(name="fake", command=json.loads(sys.argv[1]))
        sessions = McpSessions()
        workspace = Path(sys.argv[2])
        pids = []
        for tool in ("spawn_detached", "limits"):
            result = await sessions.call("t1", McpTarget(server=spec, tool=tool), workspace, {}, 20)
            pids.append(json.loads(result.content[0].text))
        print(json.dumps([pids[0], pids[1]["pid"], pids[1]["ppid"]]), flush=True)
        os._exit(0)  # the worker dies without closing anything

    asyncio.run(main())
    """
)


def test_nothing_of_a_server_outlives_its_worker(tmp_path: Path) -> None:
    """A worker that dies without closing its connection leaves no server, launcher or
    detached grandchild behind (the launcher's parent-death signal)."""
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, json.dumps(stdio_command()), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        assert _gone_within(pids, 5), [pid for pid in pids if _alive(pid)]
    finally:
        _kill(pids)


def _serve(request: object, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    from workers.tools import launcher

    env = {} if request is None else {launcher.REQUEST_VARIABLE: json.dumps(request)}
    return subprocess.run(
        [sys.executable, "-I", "-S", launcher.__file__, launcher.SERVE_FLAG],
        input="hello\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )


def test_the_launcher_serves_on_its_own_stdio_and_exits_with_the_childs_status(
    tmp_path: Path,
) -> None:
    """In serve mode the child reads the launcher's stdin and writes its stdout, sees only the
    request's environment (not the request), and its exit status is the launcher's; a missing
    request or program is a line on stderr and status 127."""
    script = 'read line; echo "got $line"; env | sort; exit 7'
    request = {
        "argv": ["sh", "-c", script],
        "env": {"PATH": "/usr/bin:/bin", "ONLY": "this"},
        "limits": CommandLimits().model_dump(),
        "parent_pid": os.getpid(),
    }
    done = _serve(request, tmp_path)
    assert done.returncode == 7, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "got hello"
    names = {line.split("=", 1)[0] for line in lines[1:]}
    assert "ONLY=this" in lines and "ORGA_LAUNCH_REQUEST" not in names
    killed = _serve({**request, "argv": ["sh", "-c", "kill -9 $$"]}, tmp_path)
    assert killed.returncode == 128 + 9
    missing = _serve({**request, "argv": ["no-such-mcp-server"]}, tmp_path)
    assert missing.returncode == 127
    assert "could not start 'no-such-mcp-server'" in missing.stderr
    assert "No such file" in missing.stderr
    nothing = _serve(None, tmp_path)
    assert nothing.returncode == 127 and "ORGA_LAUNCH_REQUEST" in nothing.stderr
