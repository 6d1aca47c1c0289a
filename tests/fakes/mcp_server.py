"""A real MCP server written with the SDK (``MCPServer``, the SDK 2.x name of FastMCP), for the
tests of MCP tool servers. Standard behaviour plus tools that misbehave on purpose.

    python tests/fakes/mcp_server.py                  # over stdio
    python tests/fakes/mcp_server.py --http PORT      # streamable HTTP on 127.0.0.1:PORT/mcp
    python tests/fakes/mcp_server.py --fail-start     # exits before answering anything

Tools: ``echo(text)``, ``add(a, b)``, ``write_note(name, text)`` (a file in its current
folder), ``environment()`` (its environment's names, its current folder and its parent's
environment names), ``crash_once()`` (exits the first time it is called in a folder, answers
after a restart), ``crash()`` (always exits), ``hang()`` (never answers), ``calls()`` (how
many calls this process answered: shows that a process is reused), ``limits()`` (its rlimits,
pid and parent pid), ``request_meta()`` (the request's ``_meta``), ``spawn_detached()``
(starts a ``sleep`` that double-forks away in a session of its own and returns its pid).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("fake-tools")
_calls = 0


def _count() -> int:
    global _calls  # noqa: PLW0603 - a counter of this process, by design
    _calls += 1
    return _calls


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    """Echo ``text``."""
    _count()
    return f"echo: {text}"


@server.tool(description="The _meta of this request (logged to meta.log in the folder).")
def request_meta(ctx: Context, crash_first: bool = False) -> dict[str, object]:
    """What the client sent in the request's ``_meta``, each one logged to ``meta.log``; with
    ``crash_first`` the first call in this folder exits after logging (answers after a restart)."""
    _count()
    meta = dict(ctx.request_context.meta or {})
    log = Path("meta.log")
    first = not log.exists()
    with log.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(meta, sort_keys=True) + "\n")
    if crash_first and first:
        os._exit(3)
    return meta


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    """``a + b``."""
    _count()
    return a + b


@server.tool(description="Write a note file in the current folder.")
def write_note(name: str, text: str) -> str:
    """Write ``text`` to ``name``."""
    _count()
    Path(name).write_text(text, encoding="utf-8")
    return f"wrote {name}"


@server.tool(description="This process's environment names, folder, and its parent's names.")
def environment() -> dict[str, object]:
    """What a confined server sees."""
    _count()
    parent = Path(f"/proc/{os.getppid()}/environ")
    try:
        parent_names = sorted(
            item.split(b"=", 1)[0].decode() for item in parent.read_bytes().split(b"\0") if item
        )
    except OSError:
        parent_names = []
    return {"names": sorted(os.environ), "cwd": os.getcwd(), "parent_names": parent_names}


@server.tool(description="Exit the first time in this folder; answer after a restart.")
def crash_once() -> str:
    """Crash once, then answer."""
    _count()
    marker = Path(".crashed_once")
    if not marker.exists():
        marker.write_text("1", encoding="utf-8")
        os._exit(3)
    return "survived a restart"


@server.tool(description="Always exit.")
def crash() -> str:
    """Crash every time."""
    _count()
    os._exit(3)


@server.tool(description="Never answer.")
async def hang() -> str:
    """Sleep forever."""
    _count()
    await asyncio.sleep(3600)
    return "woke"


@server.tool(description="How many calls this process answered, this one included.")
def calls() -> int:
    """The process's call count."""
    return _count()


@server.tool(description="This process's rlimits (soft, hard), pid and parent pid.")
def limits() -> dict[str, object]:
    """What the launcher set."""
    _count()
    names = ("NPROC", "AS", "FSIZE", "CPU", "CORE")
    return {
        "limits": {n: list(resource.getrlimit(getattr(resource, f"RLIMIT_{n}"))) for n in names},
        "pid": os.getpid(),
        "ppid": os.getppid(),
    }


_DETACH = (
    "import subprocess, sys; p = subprocess.Popen(['sleep', '300'], start_new_session=True, "
    "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(p.pid)"
)


@server.tool(description="Start a sleep that leaves this process's tree and session.")
def spawn_detached() -> int:
    """Double-fork: an intermediate process starts ``sleep 300`` with setsid and exits."""
    _count()
    done = subprocess.run(
        [sys.executable, "-c", _DETACH], capture_output=True, check=True, stdin=subprocess.DEVNULL
    )
    return int(done.stdout)


def main(argv: list[str]) -> None:
    """Run over stdio, or over streamable HTTP with ``--http PORT``."""
    if "--fail-start" in argv:
        print("fake MCP server: refusing to start (--fail-start)", file=sys.stderr)
        raise SystemExit(2)
    if "--http" in argv:
        port = int(argv[argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
        return
    server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
