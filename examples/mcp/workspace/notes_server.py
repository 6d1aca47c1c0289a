"""A tiny MCP server with the official SDK (``MCPServer``, FastMCP's name in mcp 2.x): notes
kept as files in the folder named by NOTES_DIR (below its current folder, the workspace)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")
NOTES = Path(os.environ.get("NOTES_DIR", "notes"))


@server.tool(description="Multiply two integers.")
def multiply(a: int, b: int) -> int:
    """``a * b``."""
    return a * b


@server.tool(description="Save a note (a short name of letters, digits, '-' or '_').")
def save_note(name: str, text: str) -> str:
    """Write ``text`` to ``NOTES/<name>.txt``."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"note name {name!r} must be 1 to 64 letters, digits, '-' or '_'")
    NOTES.mkdir(exist_ok=True)
    (NOTES / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
    return f"saved {NOTES / name}.txt"


@server.tool(description="The names of the saved notes.")
def list_notes() -> list[str]:
    """Every note's name."""
    return sorted(p.stem for p in NOTES.glob("*.txt")) if NOTES.is_dir() else []


if __name__ == "__main__":
    server.run("stdio")
