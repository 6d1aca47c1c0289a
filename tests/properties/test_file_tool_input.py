"""Path traversal and symlink escapes against the file tools (hypothesis).

A temporary tree holds a workspace and, beside it, an ``outside`` folder with a canary file.
The workspace is full of traps: links to the canary, to the outside folder, absolute links,
chains of links, a dangling link pointing outside, a link loop. Generated paths combine them
with ``..``, absolute prefixes, ``//``, NUL bytes, encodings and very long names. Every path
that leads out is refused with a message saying so, the canary is never read, and nothing
outside the workspace is created or changed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.actions import ToolCallAction
from workers.gates.base import GateContext
from workers.gates.default import DefaultPolicyGate
from workers.tools import (
    FileListTool,
    FileReadTool,
    FileWriteTool,
    GrepTool,
    ToolContext,
    ToolOutput,
)

CANARY = "CANARY-d41d8cd98f00b204e980"
WRITTEN = "WRITTEN-BY-THE-TEST"
LONG = "a" * 300


@dataclass(frozen=True)
class Tree:
    """The temporary tree: ``root/workspace`` and ``root/outside`` with its canary."""

    root: Path

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    def snapshot(self) -> dict[str, tuple[int, bytes, int]]:
        """Every entry outside the workspace: mode, content (files) and modification time."""
        entries: dict[str, tuple[int, bytes, int]] = {}
        for path in _everything(self.root):
            if path == self.workspace or self.workspace in path.parents:
                continue
            info = path.lstat()
            content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            entries[str(path.relative_to(self.root))] = (info.st_mode, content, info.st_mtime_ns)
        return entries


def _everything(root: Path) -> Iterator[Path]:
    for directory, names, files in os.walk(root, followlinks=False):
        for name in names + files:
            yield Path(directory) / name


def _build(root: Path) -> Tree:
    tree = Tree(root)
    outside, workspace = tree.outside, tree.workspace
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(CANARY + "\n")
    (outside / "dir" / "deep.txt").write_text(CANARY + " deep\n")
    (root / "sibling.txt").write_text(CANARY + " sibling\n")
    (workspace / "sub" / "inner").mkdir(parents=True)
    (workspace / "notes.txt").write_text("inside\n")
    (workspace / "sub" / "code.py").write_text("print('inside')\n")
    links = {
        "out_file": "../outside/secret.txt",
        "out_dir": "../outside",
        "abs_dir": str(outside),
        "abs_file": str(outside / "secret.txt"),
        "chain1": "chain2",
        "chain2": "sub/chain3",
        "sub/chain3": "../../outside/dir",
        "dangling": "../outside/created-by-write.txt",
        "dangling_dir": "../outside/new-dir",
        "up": "..",
        "loop1": "loop2",
        "loop2": "loop1",
        "in_dir": "sub",
        "in_file": "notes.txt",
        "sub/inner/back_out": "../../../outside",
    }
    for name, target in links.items():
        os.symlink(target, workspace / name)
    return tree


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    """The trap-filled tree for the tools that only read, shared by this module."""
    return _build(tmp_path_factory.mktemp("escape"))


@pytest.fixture(scope="module")
def write_tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    """A trap-filled tree of its own for file_write, whose workspace the examples fill."""
    return _build(tmp_path_factory.mktemp("escape-write"))


SEGMENTS = st.sampled_from(
    [
        "..", "..", ".", "", "...", "sub", "inner", "notes.txt", "secret.txt", "dir", "deep.txt",
        "out_file", "out_dir", "abs_dir", "abs_file", "chain1", "chain2", "dangling",
        "dangling_dir", "up", "loop1", "in_dir", "in_file", "back_out", "outside", "workspace",
        "sibling.txt", "%2e%2e", "%2f", "..%2f..", "..\\..", "．．", "..／", "\u202e", "é", "😀",
        "\x00", "a\x00b", LONG, "new.txt",
    ]
)  # fmt: skip
PREFIXES = st.sampled_from(["", "", "/", "//", "./", "{root}/", "{outside}/", "{workspace}/"])


@st.composite
def paths(draw: st.DrawFn) -> str:
    """A path built from traps, relative or absolute, sometimes very long."""
    parts = draw(st.lists(SEGMENTS, min_size=1, max_size=8))
    separator = draw(st.sampled_from(["/", "/", "//", "/./"]))
    prefix = draw(PREFIXES)
    path = prefix + separator.join(parts)
    if draw(st.booleans()) and draw(st.booleans()):
        path = path + "/" + "/".join([LONG] * draw(st.integers(min_value=1, max_value=20)))
    return path


def _fill(path: str, tree: Tree) -> str:
    return path.format(root=tree.root, outside=tree.outside, workspace=tree.workspace)


def _run(tool: Any, arguments: dict[str, Any], tree: Tree) -> ToolOutput:
    context = ToolContext(workspace=tree.workspace, max_output_bytes=200_000)
    output: ToolOutput = asyncio.run(tool.run(arguments, context))
    return output


def _leads_out(path: str, tree: Tree) -> bool:
    """Whether the operating system would resolve ``path`` outside the workspace.

    ``os.path.realpath`` stops at a link loop and leaves the links after it unresolved
    (``loop/../out_file`` comes back as ``workspace/out_file``), so it is applied until the
    path no longer changes: the place the kernel reaches, where it reaches one.
    """
    workspace = Path(os.path.realpath(tree.workspace))
    candidate = Path(path) if os.path.isabs(path) else workspace / path
    resolved = Path(os.path.realpath(candidate))
    while (again := Path(os.path.realpath(resolved))) != resolved:
        resolved = again
    return resolved != workspace and workspace not in resolved.parents


def _check_outcome(output: ToolOutput, path: str, tree: Tree) -> None:
    assert CANARY not in output.content
    assert all(CANARY not in value for value in output.metadata.values())
    if "\x00" in path:
        assert output.is_error
        assert "NUL byte" in output.content
        return
    if _leads_out(path, tree):
        assert output.is_error, output.content
        assert "is outside the workspace" in output.content
        assert output.metadata["error_type"] == "path_outside_workspace"
        return
    rel = output.metadata.get("path")
    if rel is not None:
        assert not rel.startswith(("/", "../")), rel
        assert rel != ".."


SETTINGS = settings(deadline=None, max_examples=150)


@SETTINGS
@given(paths())
def test_file_read_never_reads_outside(tree: Tree, path: str) -> None:
    """file_read: every escape is refused as outside the workspace; the canary stays unread."""
    path = _fill(path, tree)
    before = tree.snapshot()
    _check_outcome(_run(FileReadTool(), {"path": path}, tree), path, tree)
    assert tree.snapshot() == before


@SETTINGS
@given(paths(), st.booleans())
def test_file_list_never_lists_outside(tree: Tree, path: str, recursive: bool) -> None:
    """file_list: escapes are refused; a listing never follows a link out of the workspace."""
    path = _fill(path, tree)
    before = tree.snapshot()
    output = _run(FileListTool(), {"path": path, "recursive": recursive}, tree)
    _check_outcome(output, path, tree)
    if not output.is_error:
        listed = output.content.splitlines()
        assert not any(line.endswith(("deep.txt", "secret.txt")) for line in listed)
    assert tree.snapshot() == before


@SETTINGS
@given(paths())
def test_grep_never_searches_outside(tree: Tree, path: str) -> None:
    """grep: escapes are refused; a search never reads the canary through a link."""
    path = _fill(path, tree)
    before = tree.snapshot()
    output = _run(GrepTool(), {"pattern": "CANARY|inside", "path": path}, tree)
    _check_outcome(output, path, tree)
    assert tree.snapshot() == before


@SETTINGS
@given(paths(), st.booleans())
def test_file_write_never_writes_outside(write_tree: Tree, path: str, create_dirs: bool) -> None:
    """file_write: escapes are refused and nothing outside the workspace is created or changed;
    a write that succeeds lands inside the workspace."""
    tree = write_tree
    path = _fill(path, tree)
    before = tree.snapshot()
    arguments = {"path": path, "content": WRITTEN, "create_dirs": create_dirs}
    output = _run(FileWriteTool(), arguments, tree)
    _check_outcome(output, path, tree)
    assert tree.snapshot() == before
    if not output.is_error:
        written = Path(os.path.realpath(tree.workspace)) / output.metadata["path"]
        assert written.read_text() == WRITTEN


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "../../../../../../../../etc/passwd",
        "sub/../../outside/secret.txt",
        "out_file",
        "out_dir/secret.txt",
        "abs_file",
        "abs_dir/dir/deep.txt",
        "chain1/deep.txt",
        "up/outside/secret.txt",
        "sub/inner/back_out/secret.txt",
        "in_dir/../../outside/secret.txt",
        "{outside}/secret.txt",
        "{root}/sibling.txt",
        "//{outside}/secret.txt",
        "{workspace}/../outside/secret.txt",
    ],
)
def test_classic_escapes_are_refused_by_every_tool(write_tree: Tree, path: str) -> None:
    """The textbook escapes: refused by read, list, grep and write, with the resolved target."""
    tree = write_tree
    path = _fill(path, tree)
    before = tree.snapshot()
    for tool, arguments in [
        (FileReadTool(), {"path": path}),
        (FileListTool(), {"path": path}),
        (GrepTool(), {"pattern": "CANARY", "path": path}),
        (FileWriteTool(), {"path": path, "content": WRITTEN}),
    ]:
        output = _run(tool, arguments, tree)
        assert output.is_error, (tool, output.content)
        assert "is outside the workspace" in output.content
        assert CANARY not in output.content
    assert tree.snapshot() == before


@pytest.mark.parametrize(
    "path",
    [
        "loop1/../out_file",
        "loop1/../out_dir/secret.txt",
        "loop2/x/../../chain1/deep.txt",
        "loop1//../abs_file",
        "sub/../loop1/../sub/inner/back_out/secret.txt",
    ],
)
def test_a_link_loop_does_not_hide_the_links_after_it(write_tree: Tree, path: str) -> None:
    """``realpath`` gives up at a loop and leaves later links unresolved: the escape through
    them is still refused, by every tool (this read the canary before the fix)."""
    tree = write_tree
    before = tree.snapshot()
    for tool, arguments in [
        (FileReadTool(), {"path": path}),
        (FileListTool(), {"path": path}),
        (GrepTool(), {"pattern": "CANARY", "path": path}),
        (FileWriteTool(), {"path": path, "content": WRITTEN}),
    ]:
        output = _run(tool, arguments, tree)
        assert output.is_error, (tool, output.content)
        assert "is outside the workspace" in output.content
        assert CANARY not in output.content
    assert tree.snapshot() == before


@pytest.mark.parametrize("target", ["dangling", "dangling_dir/x.txt", "out_dir/new.txt"])
def test_writing_through_a_link_that_points_out_creates_nothing(
    write_tree: Tree, target: str
) -> None:
    """A dangling link (or a linked directory) pointing out cannot be used to create a file."""
    tree = write_tree
    before = tree.snapshot()
    output = _run(FileWriteTool(), {"path": target, "content": WRITTEN}, tree)
    assert output.is_error
    assert "through a symbolic link" in output.content
    assert tree.snapshot() == before


@pytest.mark.parametrize("tool", [FileReadTool(), FileListTool(), GrepTool(), FileWriteTool()])
@pytest.mark.parametrize("path", [LONG * 20, "/".join([LONG] * 20), "x/" * 3000])
def test_very_long_paths_are_errors_not_exceptions(write_tree: Tree, tool: Any, path: str) -> None:
    """Names past the system's limits come back as is_error outputs, never as exceptions."""
    tree = write_tree
    arguments = {"path": path, "pattern": "x", "content": WRITTEN}
    arguments = {
        k: v for k, v in arguments.items() if k in tool.definition.parameters["properties"]
    }
    output = _run(tool, arguments, tree)
    assert output.is_error
    assert "too long" in output.content


def test_links_inside_the_workspace_still_work(tree: Tree) -> None:
    """Confinement is not paranoia: a link to a file or folder inside is followed."""
    read = _run(FileReadTool(), {"path": "in_file"}, tree)
    assert read.content == "inside\n"
    assert read.metadata["path"] == "notes.txt"
    listed = _run(FileListTool(), {"path": "in_dir"}, tree)
    assert "sub/code.py" in listed.content


def test_the_default_gate_also_sees_through_a_link_loop(write_tree: Tree) -> None:
    """The gate, the first line of defence, denies ``loop1/../out_file`` as the tool does."""
    action = ToolCallAction(
        call_id="c1", name="file_read", arguments=json.dumps({"path": "loop1/../out_file"})
    )
    context = GateContext(agent_id="agent", workspace=write_tree.workspace)
    decision = asyncio.run(DefaultPolicyGate().evaluate_action(action, context))
    assert decision.decision == "deny"
