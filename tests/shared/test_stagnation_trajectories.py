"""Hand-made trajectories for the stagnation tests, and checks that they say what they claim.

Builders mimic what our tools put in ``Observation.metadata``: ``file_read`` gives the hash of the
whole file, ``file_write`` the hashes before and after, ``run_command`` the exit code.
"""

from __future__ import annotations

import hashlib
import json

from shared.stagnation import StagnationConfig, StagnationDetector, StagnationVerdict, ToolEvent
from shared.stagnation.events import ToolKind

__all__ = [
    "ack",
    "command",
    "failed_write",
    "noted",
    "page",
    "poll",
    "read",
    "replay",
    "search",
    "sha",
    "signature",
    "write",
]


def sha(text: str) -> str:
    """SHA-256 hex of ``text``, as the file tools compute it."""
    return hashlib.sha256(text.encode()).hexdigest()


def read(path: str, content: str, **arguments: object) -> ToolEvent:
    """A whole-file read."""
    return ToolEvent(
        tool_name="file_read",
        arguments={"path": path, **arguments},
        output=content,
        kind=ToolKind.READ,
        path=path,
        content_hash=sha(content),
    )


def page(path: str, lines: list[str], start: int, count: int) -> ToolEvent:
    """Lines ``start .. start+count-1`` of a file, numbered, with the whole file's hash."""
    shown = "\n".join(f"{n}: {lines[n - 1]}" for n in range(start, start + count))
    return ToolEvent(
        tool_name="file_read",
        arguments={"path": path, "start_line": start, "end_line": start + count - 1},
        output=shown,
        kind=ToolKind.READ,
        path=path,
        content_hash=sha("\n".join(lines)),
    )


def search(pattern: str, output: str) -> ToolEvent:
    """A grep over the workspace."""
    return ToolEvent(
        tool_name="grep",
        arguments={"pattern": pattern},
        output=output,
        kind=ToolKind.READ,
        content_hash=sha(output),
    )


def command(line: str, output: str, exit_code: int = 0) -> ToolEvent:
    """A shell command with its exit code."""
    return ToolEvent(
        tool_name="run_command",
        arguments={"command": line},
        output=output,
        exit_code=exit_code,
        kind=ToolKind.COMMAND,
    )


def ack(line: str) -> ToolEvent:
    """A command that succeeded silently: exit 0, no output."""
    return command(line, "", 0)


def noted(text: str) -> ToolEvent:
    """A tool that is neither a read, a write nor a command, answering "ok" (a note taken)."""
    return ToolEvent(tool_name="note", arguments={"text": text}, output="ok")


def poll(job: str, status: str) -> ToolEvent:
    """The same status call, whose result may change."""
    return ToolEvent(tool_name="job_status", arguments={"job": job}, output=status)


def write(path: str, before: str | None, after: str) -> ToolEvent:
    """A successful write; ``before`` None when the tool did not report it."""
    return ToolEvent(
        tool_name="file_write",
        arguments={"path": path, "content": after},
        output=f"wrote {len(after)} bytes to {path}",
        kind=ToolKind.WRITE,
        path=path,
        before_hash=None if before is None else sha(before),
        after_hash=sha(after),
    )


def failed_write(path: str, content: str, error: str) -> ToolEvent:
    """A write the tool refused."""
    return ToolEvent(
        tool_name="file_write",
        arguments={"path": path, "content": content},
        output=error,
        kind=ToolKind.WRITE,
        path=path,
        is_error=True,
    )


def signature(event: ToolEvent) -> str:
    """The exact input-side signature shipped detectors use: name + canonical JSON arguments."""
    return event.tool_name + json.dumps(event.arguments, sort_keys=True)


def replay(
    events: list[ToolEvent], config: StagnationConfig | None = None
) -> list[StagnationVerdict]:
    """Observe every event with a fresh detector; one verdict per event."""
    detector = StagnationDetector(config)
    return [detector.observe(event) for event in events]


def test_page_builder_keeps_the_whole_file_hash() -> None:
    """Two pages of one file carry the same content hash and show different lines."""
    lines = [f"line {n}" for n in range(1, 101)]
    first, second = page("a.py", lines, 1, 10), page("a.py", lines, 11, 10)
    assert first.content_hash == second.content_hash
    assert first.output != second.output


def test_builders_set_the_kinds_the_tools_report() -> None:
    """Reads, writes and commands carry the kind, path and hashes our tools put in metadata."""
    assert read("a", "x").kind is ToolKind.READ
    assert write("a", "x", "y").before_hash == sha("x")
    assert command("ls", "a", 2).failed
    assert failed_write("a", "x", "denied").failed
