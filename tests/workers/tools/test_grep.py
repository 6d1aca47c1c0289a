"""grep: pure-Python regex search, deterministic, bounded, confined to the workspace."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from workers.tools import GrepTool, ToolContext, ToolOutput
from workers.tools.grep import MAX_LINE_CHARS


def _grep(workspace: Path, **arguments: Any) -> ToolOutput:
    limits = {
        "max_output_bytes": arguments.pop("max_output_bytes", 64_000),
        "timeout_s": arguments.pop("timeout_s", 30.0),
    }
    context = ToolContext(workspace=workspace, **limits)
    return asyncio.run(GrepTool().run(arguments, context))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """Python files, a text file, a binary file and a link to a file outside."""
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "b.py").write_text("import os\ndef main():\n    return TODO\n")
    (workspace / "src" / "a.py").write_text("# todo: tests\nx = 1\n")
    (workspace / "notes.txt").write_text("TODO list\n")
    (workspace / "blob.bin").write_bytes(b"TODO\x00\x01")
    (tmp_path / "secret.txt").write_text("TODO outside\n")
    (workspace / "leak.txt").symlink_to(tmp_path / "secret.txt")
    return workspace


def test_matches_are_path_line_text_in_sorted_order(workspace: Path) -> None:
    """Matches come as path:line:text, files in sorted order, binary and links skipped."""
    output = _grep(workspace, pattern="TODO")
    assert output.content == "notes.txt:1:TODO list\nsrc/b.py:3:    return TODO"
    assert output.metadata["kind"] == "read"
    assert output.metadata["matches"] == "2"
    assert output.metadata["output_hash"] == hashlib.sha256(output.content.encode()).hexdigest()


def test_ignore_case(workspace: Path) -> None:
    """ignore_case finds every spelling."""
    output = _grep(workspace, pattern="todo", ignore_case=True)
    assert output.content.splitlines() == [
        "notes.txt:1:TODO list",
        "src/a.py:1:# todo: tests",
        "src/b.py:3:    return TODO",
    ]


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        ("*.py", ["src/b.py:3:    return TODO"]),
        ("src/*.txt", []),
        ("*.txt", ["notes.txt:1:TODO list"]),
    ],
)
def test_glob_restricts_files(workspace: Path, glob: str, expected: list[str]) -> None:
    """A glob without '/' matches names; with '/' it matches workspace paths."""
    output = _grep(workspace, pattern="TODO", glob=glob)
    lines = [] if output.content.startswith("no match") else output.content.splitlines()
    assert lines == expected


def test_path_limits_the_search(workspace: Path) -> None:
    """A file or directory path searches only there."""
    assert _grep(workspace, pattern="x", path="src/a.py").content == "src/a.py:2:x = 1"
    assert _grep(workspace, pattern="TODO", path="src").content == "src/b.py:3:    return TODO"


def test_max_matches_stops_the_search(workspace: Path) -> None:
    """max_matches bounds the result and says how to see more."""
    output = _grep(workspace, pattern=".", max_matches=2)
    lines = output.content.splitlines()
    assert lines[:2] == ["notes.txt:1:TODO list", "src/a.py:1:# todo: tests"]
    assert lines[2].startswith("[stopped after 2 matches")
    assert output.metadata["matches"] == "2"


def test_no_match_is_not_an_error(workspace: Path) -> None:
    """A search without result says so and counts the files searched."""
    output = _grep(workspace, pattern="zebra")
    assert not output.is_error
    assert output.content == "no match for 'zebra' in . (3 files searched)"


def test_invalid_regex_names_the_pattern(workspace: Path) -> None:
    """An invalid regular expression is an error naming it."""
    output = _grep(workspace, pattern="foo(")
    assert output.is_error
    assert output.metadata["error_type"] == "invalid_arguments"
    assert output.content.startswith(
        "grep: invalid regular expression: the pattern 'foo(' cannot be used: it is not valid "
    )


def test_same_search_same_hash(workspace: Path) -> None:
    """Repeating a search gives the same output hash (the detector relies on it)."""
    first = _grep(workspace, pattern="TODO")
    assert _grep(workspace, pattern="TODO").metadata["output_hash"] == first.metadata["output_hash"]


def test_long_lines_are_clipped_and_output_capped(workspace: Path) -> None:
    """Each line is clipped and the whole output is capped in bytes."""
    (workspace / "wide.txt").write_text(("needle " + "z" * 5000 + "\n") * 20)
    output = _grep(workspace, pattern="needle", path="wide.txt", max_output_bytes=2000)
    first = output.content.splitlines()[0]
    assert first.startswith("wide.txt:1:needle ")
    assert first.endswith(f"[... {5007 - MAX_LINE_CHARS} more characters]")
    assert "[output truncated: showing" in output.content
    assert len(output.content.encode()) < 2200


def test_missing_path_is_an_error(workspace: Path) -> None:
    """A search root that does not exist is an error."""
    output = _grep(workspace, pattern="x", path="nope")
    assert output.is_error
    assert output.metadata["error_type"] == "not_found"


@pytest.mark.timeout(10)
def test_catastrophic_pattern_returns_well_within_the_tool_timeout(tmp_path: Path) -> None:
    """``(a+)+$`` over 34 a's and a '!' (issue 12, item 1) answers at once, under a 1 s limit."""
    (tmp_path / "redos.txt").write_text("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!\n" * 100 + "aaaa\n")
    started = time.monotonic()
    output = _grep(tmp_path, pattern="(a+)+$", timeout_s=1.0)
    assert time.monotonic() - started < 1.0
    assert not output.is_error
    assert output.content == "redos.txt:101:aaaa"


def test_a_pattern_re2_cannot_take_is_refused_with_the_fix(workspace: Path) -> None:
    """A lookahead is an invalid-arguments error saying RE2 lacks it and what to do instead."""
    output = _grep(workspace, pattern="TODO(?= list)")
    assert output.is_error
    assert output.metadata["error_type"] == "invalid_arguments"
    assert "it has a lookaround" in output.content
    assert "match the surrounding text as part of the pattern instead" in output.content


def test_the_search_stops_at_the_time_limit(workspace: Path) -> None:
    """Past ``timeout_s`` the search stops and says so, so the thread outlives no timeout."""
    output = _grep(workspace, pattern="TODO", timeout_s=0.0)
    assert not output.is_error
    assert output.content == (
        "no match for 'TODO' in . (0 files searched)\n"
        "[stopped at the time limit after 0 files; narrow the path or glob]"
    )
