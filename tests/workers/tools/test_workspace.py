"""Workspace confinement: every escape is refused, by the resolver and by every file tool."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.tools import (
    FileListTool,
    FileReadTool,
    FileWriteTool,
    GrepTool,
    PathOutsideWorkspaceError,
    Tool,
    ToolContext,
    WorkspacePathError,
    display_path,
    resolve_in_workspace,
    workspace_root,
)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with links out, and a sibling ``outside`` directory holding a secret."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    (workspace / "inside.txt").write_text("hello\n")
    (workspace / "sub").mkdir()
    (workspace / "link_file_out").symlink_to(outside / "secret.txt")
    (workspace / "link_dir_out").symlink_to(outside)
    (workspace / "dangling_out").symlink_to(outside / "missing.txt")
    (workspace / "link_inside").symlink_to(workspace / "inside.txt")
    return workspace, outside


def test_relative_path_resolves_inside(layout: tuple[Path, Path]) -> None:
    """A relative path is taken from the workspace and resolved to a real path."""
    workspace, _ = layout
    resolved = resolve_in_workspace(workspace, "sub/../inside.txt")
    assert resolved == workspace.resolve() / "inside.txt"
    assert display_path(workspace_root(workspace), resolved) == "inside.txt"


def test_absolute_path_inside_is_accepted(layout: tuple[Path, Path]) -> None:
    """An absolute path inside the workspace is accepted."""
    workspace, _ = layout
    resolved = resolve_in_workspace(workspace, str(workspace / "inside.txt"))
    assert resolved == workspace.resolve() / "inside.txt"


def test_workspace_itself_displays_as_dot(layout: tuple[Path, Path]) -> None:
    """The workspace root is shown as ``.``."""
    workspace, _ = layout
    root = workspace_root(workspace)
    assert display_path(root, resolve_in_workspace(workspace, ".")) == "."


def test_symlink_inside_resolves_to_its_target(layout: tuple[Path, Path]) -> None:
    """A link to a file inside the workspace is followed."""
    workspace, _ = layout
    assert resolve_in_workspace(workspace, "link_inside") == workspace.resolve() / "inside.txt"


ESCAPES = [
    "../outside/secret.txt",
    "sub/../../outside/secret.txt",
    "..",
    "/etc/passwd",
    "link_file_out",
    "link_dir_out/secret.txt",
    "link_dir_out/new_file.txt",
    "dangling_out",
]


@pytest.mark.parametrize("user_path", ESCAPES)
def test_escape_is_refused(layout: tuple[Path, Path], user_path: str) -> None:
    """``..``, absolute paths outside, and links out (file, directory, dangling) are refused."""
    workspace, _ = layout
    with pytest.raises(PathOutsideWorkspaceError) as caught:
        resolve_in_workspace(workspace, user_path)
    message = str(caught.value)
    assert repr(user_path) in message
    assert "outside the workspace" in message


@pytest.mark.parametrize("user_path", ["../ws-evil/loot.txt", "{root}-evil/loot.txt", "../ws-evil"])
def test_sibling_sharing_the_workspace_name_is_outside(
    layout: tuple[Path, Path], user_path: str
) -> None:
    """``ws-evil`` beside ``ws`` is outside ``ws`` (whole path components, not a string prefix),
    for the resolver and for every file tool."""
    workspace, _ = layout
    (workspace.parent / "ws-evil").mkdir()
    (workspace.parent / "ws-evil" / "loot.txt").write_text("LOOT\n")
    path = user_path.replace("{root}", str(workspace))
    with pytest.raises(PathOutsideWorkspaceError, match="outside the workspace"):
        resolve_in_workspace(workspace, path)
    for tool, extra in FILE_TOOLS:
        output = _tool_call(tool, {"path": path, **extra}, workspace)
        assert output.metadata.get("error_type") == "path_outside_workspace", output
        assert "LOOT" not in output.content
    assert sorted(p.name for p in (workspace.parent / "ws-evil").iterdir()) == ["loot.txt"]


@pytest.mark.parametrize("user_path", ["link_file_out", "link_dir_out/secret.txt"])
def test_link_escape_says_it_goes_through_a_link(layout: tuple[Path, Path], user_path: str) -> None:
    """The refusal of a link out tells the model that a symbolic link is the cause."""
    workspace, _ = layout
    with pytest.raises(PathOutsideWorkspaceError, match="through a symbolic link"):
        resolve_in_workspace(workspace, user_path)


def test_nul_byte_is_refused(layout: tuple[Path, Path]) -> None:
    """A path with a NUL byte is refused before touching the file system."""
    workspace, _ = layout
    with pytest.raises(WorkspacePathError, match="NUL"):
        resolve_in_workspace(workspace, "inside.txt\x00.png")


def test_missing_workspace_is_reported(tmp_path: Path) -> None:
    """A workspace that does not exist is an error naming it."""
    with pytest.raises(WorkspacePathError, match="not an existing directory"):
        resolve_in_workspace(tmp_path / "nope", "a.txt")


_SEGMENTS = st.sampled_from(
    ["..", ".", "sub", "inside.txt", "link_dir_out", "link_file_out", "dangling_out", "x"]
)


@pytest.fixture(scope="module")
def fixed_layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same layout, built once for the property test."""
    base = tmp_path_factory.mktemp("property")
    workspace, outside = base / "ws", base / "outside"
    workspace.mkdir()
    outside.mkdir()
    (workspace / "sub").mkdir()
    (workspace / "inside.txt").write_text("x")
    (workspace / "link_dir_out").symlink_to(outside)
    (workspace / "link_file_out").symlink_to(outside / "secret.txt")
    (workspace / "dangling_out").symlink_to(outside / "missing")
    return workspace, outside


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(_SEGMENTS, max_size=6), absolute=st.booleans())
def test_resolution_never_leaves_the_workspace(
    fixed_layout: tuple[Path, Path], segments: list[str], absolute: bool
) -> None:
    """Whatever the path, the result is inside the workspace or the path is refused."""
    workspace, _ = fixed_layout
    user_path = os.path.join(str(workspace) if absolute else "", *segments) if segments else "."
    root = workspace.resolve()
    try:
        resolved = resolve_in_workspace(workspace, user_path)
    except PathOutsideWorkspaceError:
        return
    assert resolved == root or root in resolved.parents


def _tool_call(tool: Tool, arguments: dict[str, Any], workspace: Path) -> Any:
    return asyncio.run(tool.run(arguments, ToolContext(workspace=workspace)))


FILE_TOOLS: list[tuple[Tool, dict[str, Any]]] = [
    (FileReadTool(), {}),
    (FileWriteTool(), {"content": "pwned"}),
    (FileListTool(), {}),
    (GrepTool(), {"pattern": "SECRET"}),
]


@pytest.mark.parametrize(("tool", "extra"), FILE_TOOLS, ids=lambda v: v.__class__.__name__)
@pytest.mark.parametrize("user_path", ESCAPES)
def test_every_file_tool_refuses_escapes(
    layout: tuple[Path, Path], tool: Tool, extra: dict[str, Any], user_path: str
) -> None:
    """Each file tool answers an escape with an is_error output naming the path."""
    workspace, outside = layout
    output = _tool_call(tool, {"path": user_path, **extra}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == "path_outside_workspace"
    assert repr(user_path) in output.content
    assert "outside the workspace" in output.content
    assert "TOP SECRET" not in output.content
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
