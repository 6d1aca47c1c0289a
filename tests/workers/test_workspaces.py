"""A sub-agent's workspace: a real folder the runtime made inside its parent's, checked on every
open (workers/workspaces.py); and the ``delegate`` call refused when a link is in the way."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import fakeredis
import pytest

from shared.actions import Allow, Deny, ToolCallAction
from workers.gates.base import GateContext
from workers.gates.permissive import PermissiveGate
from workers.workspaces import (
    InMemoryWorkspaceClaims,
    RedisWorkspaceClaims,
    SubagentsFolderGate,
    SubagentWorkspaceError,
    WorkspaceClaims,
    open_subagent_workspace,
)


def _open(workspace: Path, base: Path, claims: WorkspaceClaims, *, create: bool = True) -> Path:
    return asyncio.run(open_subagent_workspace(workspace, base, claims, create=create))


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """The parent's workspace and a folder outside it holding a secret."""
    parent = tmp_path / "ws" / "p"
    parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    return parent, outside


def test_the_runtime_makes_the_folder_and_opens_it_again(tree: tuple[Path, Path]) -> None:
    parent, _ = tree
    claims = InMemoryWorkspaceClaims()
    child = parent / "subagents" / "p.1"
    assert _open(child, parent, claims) == child
    assert child.is_dir() and not child.is_symlink()
    assert _open(child, parent, claims) == child  # a later call of the same child
    grandchild = child / "subagents" / "p.1.1"
    assert _open(grandchild, parent, claims) == grandchild


def test_a_link_planted_where_the_childs_folder_goes_is_refused(tree: tuple[Path, Path]) -> None:
    """The red-team case: ``os.symlink('/outside', 'subagents/p.1')`` before delegating."""
    parent, outside = tree
    (parent / "subagents").mkdir()
    os.symlink(outside, parent / "subagents" / "p.1")
    with pytest.raises(SubagentWorkspaceError, match=r"subagents/p\.1' is a symbolic link"):
        _open(parent / "subagents" / "p.1", parent, InMemoryWorkspaceClaims())
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_linked_subagents_folder_is_refused_and_nothing_is_made_outside(
    tree: tuple[Path, Path],
) -> None:
    parent, outside = tree
    os.symlink(outside, parent / "subagents")
    with pytest.raises(SubagentWorkspaceError, match=r"/subagents' is a symbolic link"):
        _open(parent / "subagents" / "p.1", parent, InMemoryWorkspaceClaims())
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_link_in_the_middle_of_a_grandchilds_path_is_refused(tree: tuple[Path, Path]) -> None:
    parent, outside = tree
    claims = InMemoryWorkspaceClaims()
    child = parent / "subagents" / "p.1"
    _open(child, parent, claims)
    os.symlink(outside, child / "subagents")
    with pytest.raises(SubagentWorkspaceError, match="symbolic link"):
        _open(child / "subagents" / "p.1.1", parent, claims)


def test_a_file_where_a_folder_goes_is_refused(tree: tuple[Path, Path]) -> None:
    parent, _ = tree
    (parent / "subagents").write_text("not a folder")
    with pytest.raises(SubagentWorkspaceError, match="is not a directory"):
        _open(parent / "subagents" / "p.1", parent, InMemoryWorkspaceClaims())


def test_a_folder_the_runtime_did_not_make_is_refused(tree: tuple[Path, Path]) -> None:
    """A parent that made ``subagents/p.1`` itself (to plant files or links in it)."""
    parent, _ = tree
    (parent / "subagents" / "p.1").mkdir(parents=True)
    with pytest.raises(SubagentWorkspaceError, match="was not created by the runtime"):
        _open(parent / "subagents" / "p.1", parent, InMemoryWorkspaceClaims())


def test_a_folder_replaced_after_the_runtime_made_it_is_refused(tree: tuple[Path, Path]) -> None:
    parent, outside = tree
    claims = InMemoryWorkspaceClaims()
    child = parent / "subagents" / "p.1"
    _open(child, parent, claims)
    child.rename(parent / "elsewhere")
    child.mkdir()
    with pytest.raises(SubagentWorkspaceError, match="not the folder the runtime created"):
        _open(child, parent, claims)
    child.rmdir()
    os.symlink(outside, child)  # swapped for a link after the runtime made it
    with pytest.raises(SubagentWorkspaceError, match="symbolic link"):
        _open(child, parent, claims)


def test_checking_only_never_creates(tree: tuple[Path, Path]) -> None:
    parent, _ = tree
    with pytest.raises(FileNotFoundError):
        _open(parent / "subagents" / "p.1", parent, InMemoryWorkspaceClaims(), create=False)
    assert not (parent / "subagents").exists()


@pytest.mark.parametrize(
    "relative",
    ["p.1", "subagents/../../x", "other/p.1", "subagents/p.1/x"],
)
def test_a_path_that_is_not_a_subagents_folder_is_refused(
    tree: tuple[Path, Path], relative: str
) -> None:
    parent, _ = tree
    with pytest.raises(SubagentWorkspaceError, match="is not a subagents/<id> folder"):
        _open(Path(f"{parent}/{relative}"), parent, InMemoryWorkspaceClaims())


def test_redis_claims_keep_the_first_creators_identity() -> None:
    claims = RedisWorkspaceClaims(fakeredis.FakeAsyncRedis())

    async def scenario() -> tuple[str, str, str | None, str | None]:
        first = await claims.claim("/ws/p/subagents/p.1", "1:10")
        second = await claims.claim("/ws/p/subagents/p.1", "1:11")
        return (
            first,
            second,
            await claims.recorded("/ws/p/subagents/p.1"),
            await claims.recorded("/ws/p/subagents/p.2"),
        )

    assert asyncio.run(scenario()) == ("1:10", "1:10", "1:10", None)


def _delegate() -> ToolCallAction:
    return ToolCallAction(
        call_id="c1", name="delegate", arguments=json.dumps({"agent": "a", "goal": "g"})
    )


def _decide(workspace: Path, action: ToolCallAction) -> str:
    gate = SubagentsFolderGate(PermissiveGate())
    context = GateContext(agent_id="a", workspace=workspace, task_id="p", iteration=1)
    decision = asyncio.run(gate.evaluate_action(action, context))
    if isinstance(decision, Allow):
        return "allow"
    assert isinstance(decision, Deny), decision
    return f"deny: {decision.reason}"


def test_the_gate_refuses_a_delegation_with_a_link_in_the_way(tree: tuple[Path, Path]) -> None:
    parent, outside = tree
    assert _decide(parent, _delegate()) == "allow"  # no subagents folder yet
    (parent / "subagents").mkdir()
    (parent / "subagents" / "other").symlink_to(outside)  # not a child's name: not looked at
    assert _decide(parent, _delegate()) == "allow"
    (parent / "subagents" / "p.1").symlink_to(outside)
    denied = _decide(parent, _delegate())
    assert denied.startswith("deny: delegation refused: subagents/p.1 in this task's")
    assert "symbolic link" in denied
    write = ToolCallAction(call_id="c2", name="file_write", arguments="{}")
    assert _decide(parent, write) == "allow"  # only delegate calls are looked at


def test_the_gate_refuses_a_linked_subagents_folder(tree: tuple[Path, Path]) -> None:
    parent, outside = tree
    (parent / "subagents").symlink_to(outside)
    assert "'subagents' in this task's workspace is a symbolic link" in _decide(parent, _delegate())
