"""The file tools against a changing tree: hard links out, links swapped in mid-call, very deep
paths (issue 12, item 14)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers.tools.escape import CANARY, escape_tree
from workers.tools import FileListTool, FileReadTool, FileWriteTool, GrepTool, ToolContext
from workers.tools.confined import MAX_PATH_COMPONENTS, PathChangedError, attempts


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    return escape_tree(tmp_path)


def _work(tool: Any, arguments: dict[str, Any], workspace: Path) -> Any:
    """Run a file tool's blocking work directly (no event loop: the race tests call it often)."""
    return tool.work(arguments, ToolContext(workspace=workspace))


def _kind(tool: Any, arguments: dict[str, Any], workspace: Path) -> tuple[str, str]:
    """The error type of a call ('ok' for a success, 'raised' for an exception) and its text."""
    try:
        output = _work(tool, arguments, workspace)
    except Exception as exc:
        return "raised", repr(exc)
    return output.metadata.get("error_type", "ok"), output.content


# -- hard links ----------------------------------------------------------------------------


def test_read_refuses_a_hard_link_to_a_file_outside(tree: tuple[Path, Path]) -> None:
    """A hard link a command made to an outside file is not read (it printed the canary)."""
    workspace, outside = tree
    os.link(outside / "secret.txt", workspace / "linked.txt")
    output = _work(FileReadTool(), {"path": "linked.txt"}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == "hard_linked"
    assert "'linked.txt' has 2 hard links" in output.content
    assert "copy it (cp)" in output.content
    assert CANARY not in output.content


def test_grep_skips_hard_linked_files(tree: tuple[Path, Path]) -> None:
    """grep neither searches a hard-linked file in a directory nor one named directly."""
    workspace, outside = tree
    os.link(outside / "secret.txt", workspace / "sub" / "linked.txt")
    for path in (".", "sub", "sub/linked.txt"):
        output = _work(GrepTool(), {"pattern": "CANARY|inside", "path": path}, workspace)
        assert CANARY not in output.content, path
    whole = _work(GrepTool(), {"pattern": "CANARY|inside"}, workspace)
    assert whole.content == "sub/secret.txt:1:inside"


def test_write_replaces_a_hard_linked_name_and_spares_the_other(tree: tuple[Path, Path]) -> None:
    """Writing a hard-linked name replaces that name only; the outside file keeps its content
    and is never read (no before_hash)."""
    workspace, outside = tree
    os.link(outside / "secret.txt", workspace / "linked.txt")
    output = _work(FileWriteTool(), {"path": "linked.txt", "content": "mine\n"}, workspace)
    assert not output.is_error
    assert "its other hard links keep the old content" in output.content
    assert (output.metadata["before_hash"], output.metadata["created"]) == ("", "false")
    assert (workspace / "linked.txt").read_text() == "mine\n"
    assert (outside / "secret.txt").read_text() == CANARY + "\n"


# -- a link swapped in while the tools run -------------------------------------------------

_SWAPPER = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
first, second = sys.argv[1].encode(), sys.argv[2].encode()
print("ready", flush=True)
while True:
    libc.renameat2(-100, first, -100, second, 2)  # AT_FDCWD, RENAME_EXCHANGE
"""


def _can_exchange() -> bool:
    return sys.platform == "linux" and hasattr(ctypes.CDLL(None), "renameat2")


@pytest.fixture
def swapping(tree: tuple[Path, Path]) -> Iterator[tuple[Path, Path]]:
    """Another process swaps ``sub`` with a link to the outside folder, atomically and without
    pause (``renameat2(RENAME_EXCHANGE)``), as a command running beside the tools could."""
    if not _can_exchange():
        pytest.skip("needs renameat2 (Linux, glibc 2.28+)")
    workspace, outside = tree
    os.symlink(outside, workspace / "swap")
    swapper = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(workspace / "sub"), str(workspace / "swap")],
        stdout=subprocess.PIPE,
    )
    try:
        assert swapper.stdout is not None
        assert swapper.stdout.readline() == b"ready\n"
        yield tree
    finally:
        swapper.kill()
        swapper.wait()
        if swapper.stdout is not None:
            swapper.stdout.close()


def test_writes_never_land_outside_while_a_link_is_swapped_in(
    swapping: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """3000 writes under ``sub`` while it keeps turning into a link out: none lands outside,
    no temporary file is left outside, none raises (before: 6 to 48 files outside a run)."""
    workspace, outside = swapping
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not under test: speed
    kinds: Counter[str] = Counter()
    refusals: set[str] = set()
    for i in range(3000):
        kind, text = _kind(FileWriteTool(), {"path": f"sub/f{i}.txt", "content": "x"}, workspace)
        kinds[kind] += 1
        if kind != "ok":
            refusals.add(text.replace(f"f{i}", "f*")[:120])
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == CANARY + "\n"
    assert kinds["ok"] > 0
    assert set(kinds) <= {"ok", "path_outside_workspace", "invalid_path"}, (kinds, refusals)


def test_reads_never_return_outside_content_while_a_link_is_swapped_in(
    swapping: tuple[Path, Path],
) -> None:
    """file_read, grep and file_list under a swapping ``sub`` never show the outside folder."""
    workspace, _ = swapping
    kinds: Counter[str] = Counter()
    for _ in range(300):
        calls = [
            (FileReadTool(), {"path": "sub/secret.txt"}),
            (GrepTool(), {"pattern": "CANARY|inside", "path": "sub"}),
            (FileListTool(), {"path": "sub"}),
        ]
        for tool, arguments in calls:
            kind, text = _kind(tool, arguments, workspace)
            assert CANARY not in text
            kinds[f"{tool.definition.name}:{kind}"] += 1
    assert kinds["file_read:ok"] > 0
    assert not any(kind.endswith(":raised") for kind in kinds), kinds


def test_attempts_retries_a_changed_path_then_says_so() -> None:
    """A path that changed is checked and opened again; one that keeps changing is an error."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise PathChangedError("changed")
        return "opened"

    assert attempts(flaky) == "opened"

    def always() -> str:
        raise PathChangedError("changed")

    with pytest.raises(PathChangedError):
        attempts(always)


# -- very deep paths -----------------------------------------------------------------------


@pytest.mark.parametrize("tool", [FileWriteTool(), FileReadTool(), FileListTool()])
def test_a_2000_component_path_is_refused_as_too_long(tmp_path: Path, tool: Any) -> None:
    """2000 components (under the system's 4096 bytes) are refused with the limit, not a
    RecursionError (file_write raised one)."""
    path = "a/" * 1999 + "f"
    arguments = (
        {"path": path, "content": "x"} if isinstance(tool, FileWriteTool) else {"path": path}
    )
    output = _work(tool, arguments, tmp_path)
    assert output.is_error
    assert output.metadata["error_type"] == "invalid_path"
    assert "is too long: 2000 components" in output.content
    assert f"at most {MAX_PATH_COMPONENTS} components" in output.content
    assert len(output.content) < 400
    assert not (tmp_path / "a").exists()


def test_a_deep_path_within_the_limit_is_written_and_read(tmp_path: Path) -> None:
    """A path of 200 components is created level by level, then read back and listed."""
    path = "d/" * 199 + "deep.txt"
    written = _work(FileWriteTool(), {"path": path, "content": "deep\n"}, tmp_path)
    assert not written.is_error, written.content
    assert _work(FileReadTool(), {"path": path}, tmp_path).content == "deep\n"
    listed = _work(FileListTool(), {"path": "d", "recursive": True}, tmp_path)
    assert not listed.is_error
