"""Within ``resolving_once`` the file tools reuse the real paths the default gate resolved, and
the confinement stays as strong: a link swapped in after the gate's resolution is met on the
way and the call checks afresh."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.actions import Allow
from tests.workers.gates.actions import context, decide, tool
from tests.workers.tools.escape import CANARY, escape_tree
from workers.gates.default import DefaultPolicyGate
from workers.tools import FileReadTool, ToolContext
from workers.tools import workspace as workspace_module
from workers.tools.confined import check_path
from workers.tools.workspace import forget_resolutions, resolving_once


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    return escape_tree(tmp_path)


@pytest.fixture
def realpaths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``os.path.realpath`` the workspace module makes, by argument."""
    calls: list[str] = []
    real: Callable[..., str] = os.path.realpath

    def counting(path: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(workspace_module.os.path, "realpath", counting)
    return calls


def _read(workspace: Path, path: str) -> Any:
    return FileReadTool().work({"path": path}, ToolContext(workspace=workspace))


def test_the_tool_reuses_the_paths_the_gate_resolved(
    tree: tuple[Path, Path], realpaths: list[str]
) -> None:
    workspace, _ = tree
    with resolving_once():
        assert isinstance(decide(DefaultPolicyGate(), tool("file_read", {"path": "sub/secret.txt"}),
                                 context(workspace)), Allow)  # fmt: skip
        gated = len(realpaths)
        checked = check_path(workspace, "sub/secret.txt", reuse=True)
        assert len(realpaths) == gated
        assert _read(workspace, "sub/secret.txt").content.startswith("inside")
    assert checked.absolute == (workspace / "sub" / "secret.txt").resolve()
    assert gated > 0


def test_outside_the_scope_every_check_resolves(
    tree: tuple[Path, Path], realpaths: list[str]
) -> None:
    workspace, _ = tree
    check_path(workspace, "sub/secret.txt", reuse=True)
    first = len(realpaths)
    with resolving_once():
        pass
    check_path(workspace, "sub/secret.txt", reuse=True)
    assert len(realpaths) == 2 * first > 0


def test_a_check_without_reuse_resolves_within_the_scope(
    tree: tuple[Path, Path], realpaths: list[str]
) -> None:
    """``grep`` (which walks what it checked by path) and any other caller resolve afresh."""
    workspace, _ = tree
    with resolving_once():
        check_path(workspace, "sub/secret.txt", reuse=True)
        first = len(realpaths)
        check_path(workspace, "sub/secret.txt")
        assert len(realpaths) == 2 * first


def test_forgetting_resolves_again(tree: tuple[Path, Path], realpaths: list[str]) -> None:
    workspace, _ = tree
    with resolving_once():
        check_path(workspace, "sub/secret.txt", reuse=True)
        first = len(realpaths)
        forget_resolutions()
        check_path(workspace, "sub/secret.txt", reuse=True)
        assert len(realpaths) == 2 * first


def test_a_link_swapped_in_after_the_gate_is_refused(tree: tuple[Path, Path]) -> None:
    """The gate resolved ``sub/secret.txt`` inside; ``sub`` then becomes a link out. The tool
    meets the link on the way, forgets, checks again and refuses the path: the canary is never
    returned."""
    workspace, outside = tree
    with resolving_once():
        gate = DefaultPolicyGate()
        assert isinstance(decide(gate, tool("file_read", {"path": "sub/secret.txt"}),
                                 context(workspace)), Allow)  # fmt: skip
        shutil.rmtree(workspace / "sub")
        os.symlink(outside, workspace / "sub")
        output = _read(workspace, "sub/secret.txt")
    assert output.is_error
    assert CANARY not in output.content
    assert "outside the workspace" in output.content


def test_a_link_inside_repointed_after_the_gate_leads_to_its_new_target(tmp_path: Path) -> None:
    """A path through a link is not kept: ``link -> a`` is allowed by the gate, then re-pointed
    to ``b`` (a command running alongside, say); the tool reads ``b``'s file, as a fresh
    resolution would, not ``a``'s."""
    workspace = tmp_path / "ws"
    for name in ("a", "b"):
        (workspace / name).mkdir(parents=True)
        (workspace / name / "f.txt").write_text(f"in {name}\n")
    os.symlink("a", workspace / "link")
    with resolving_once():
        assert isinstance(decide(DefaultPolicyGate(), tool("file_read", {"path": "link/f.txt"}),
                                 context(workspace)), Allow)  # fmt: skip
        os.unlink(workspace / "link")
        os.symlink("b", workspace / "link")
        output = _read(workspace, "link/f.txt")
    assert output.content.startswith("in b"), output.content
