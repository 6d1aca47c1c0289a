"""A sub-agent's workspace: a real folder the runtime made inside its parent's, checked on every
open (workers/workspaces.py); the ``delegate`` call refused when a link is in the way; and a
workspace template copied off the event loop."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import fakeredis
import pytest

import workers.tools.command
from shared.actions import Allow, Deny, ToolCallAction
from shared.loop_types import LoopConfig
from shared.protocol import Fence, ToolRequest
from workers.gates.base import GateContext
from workers.gates.permissive import PermissiveGate
from workers.handlers import run_tool_call
from workers.runtime import local_core
from workers.tools import RunCommandTool, ToolContext, ToolOutput
from workers.tools.files import FileReadTool, FileWriteTool
from workers.tools.workspace import expecting_workspace
from workers.workspaces import (
    InMemoryWorkspaceClaims,
    RedisWorkspaceClaims,
    SubagentsFolderGate,
    SubagentWorkspaceError,
    WorkspaceClaims,
    open_subagent_workspace,
)


def _open(workspace: Path, base: Path, claims: WorkspaceClaims, *, create: bool = True) -> Path:
    return asyncio.run(open_subagent_workspace(workspace, base, claims, create=create))[0]


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
    ["subagents/../../x", "other/p.1", "subagents/p.1/x", "subagents/subagents"],
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


def test_a_workspace_root_spelled_with_dotdot_still_works(tree: tuple[Path, Path]) -> None:
    parent, _ = tree
    spelled = Path(f"{parent.parent}/../{parent.parent.name}/{parent.name}")
    child = spelled / "subagents" / "p.1"
    assert _open(child, spelled, InMemoryWorkspaceClaims()) == child
    assert (parent / "subagents" / "p.1").is_dir()


def test_a_copy_childs_own_folder_below_the_root_is_checked_too(tree: tuple[Path, Path]) -> None:
    """A ``copy`` child works in ``{root}/{child id}``: a link planted there is refused, and a
    template is copied into the folder the runtime makes."""
    parent, outside = tree
    root = parent.parent
    os.symlink(outside, root / "p.1")
    with pytest.raises(SubagentWorkspaceError, match=r"/p\.1' is a symbolic link"):
        _open(root / "p.1", root, InMemoryWorkspaceClaims())
    (parent / "notes.md").write_text("the parent's notes")
    made, identity = asyncio.run(
        open_subagent_workspace(root / "p.2", root, InMemoryWorkspaceClaims(), str(parent))
    )
    assert (made / "notes.md").read_text() == "the parent's notes"
    assert identity == (made.stat().st_dev, made.stat().st_ino)
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no staging left


class _HeldClaims(InMemoryWorkspaceClaims):
    """A claim held until released (another worker's call that made the folder and has not
    recorded it yet); counts the looks at the record."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.looks = 0

    async def claim(self, workspace: str, identity: str) -> str:
        await self.released.wait()
        return await super().claim(workspace, identity)

    async def recorded(self, workspace: str) -> str | None:
        self.looks += 1
        return await super().recorded(workspace)


def test_two_first_calls_at_once_both_open_the_folder(tree: tuple[Path, Path]) -> None:
    """The second call finds the folder made and not yet recorded: it waits for the record
    instead of refusing the folder."""
    parent, _ = tree
    child = parent / "subagents" / "p.1"

    async def both() -> list[Path]:
        claims = _HeldClaims()
        first = asyncio.create_task(open_subagent_workspace(child, parent, claims))
        while (
            not child.is_dir() and not first.done()
        ):  # made by the first call, which now waits on its claim
            await asyncio.sleep(0)
        second = asyncio.create_task(open_subagent_workspace(child, parent, claims))
        while claims.looks == 0 and not second.done():  # the second call found no record yet
            await asyncio.sleep(0)
        claims.released.set()
        return [(await first)[0], (await second)[0]]

    assert asyncio.run(both()) == [child, child]


def _swapped(tree: tuple[Path, Path]) -> tuple[Path, tuple[int, int]]:
    """A sub-agent folder checked (its identity kept), then swapped for a link outside."""
    parent, outside = tree
    child, identity = asyncio.run(
        open_subagent_workspace(parent / "subagents" / "p.1", parent, InMemoryWorkspaceClaims())
    )
    child.rename(parent / "moved-away")
    child.symlink_to(outside)
    return child, identity


def test_a_folder_swapped_after_the_check_is_refused_by_the_tools(tree: tuple[Path, Path]) -> None:
    """The check and the tool's own open are two steps: a link swapped in between (a parent's
    command watching the folder) is met by the tool, which compares the root it opens with the
    folder that was checked."""
    child, identity = _swapped(tree)
    context = ToolContext(workspace=child, timeout_s=10)

    async def calls() -> list[ToolOutput]:
        with expecting_workspace(identity):
            return [
                await FileReadTool().run({"path": "secret.txt"}, context),
                await FileWriteTool().run({"path": "w.txt", "content": "x"}, context),
                await RunCommandTool().run({"command": "touch ran-here"}, context),
            ]

    for output in asyncio.run(calls()):
        assert output.is_error and "not the folder checked when this call started" in (
            output.content
        ), output
    _, outside = tree
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    free = asyncio.run(FileReadTool().run({"path": "secret.txt"}, context))
    assert "s3cret" in free.content  # without the expected identity the link is followed


def test_the_command_launcher_refuses_a_working_folder_that_is_not_the_checked_one(
    tmp_path: Path,
) -> None:
    """The launcher compares the folder it starts in with the checked identity before it runs
    the shell (the path may be swapped between the tool's check and the process start)."""
    checked = tmp_path / "checked"
    checked.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    status = checked.stat()
    read, write = os.pipe()
    request = {
        "shell": "/bin/sh", "command": "touch ran-here", "env": {}, "limits": {},
        "parent_pid": os.getpid(), "report_fd": write,
        "workspace_identity": [status.st_dev, status.st_ino],
    }  # fmt: skip
    launcher = Path(workers.tools.command.__file__).with_name("launcher.py")
    subprocess.run(
        [sys.executable, "-I", "-S", str(launcher)], input=json.dumps(request).encode(),
        cwd=other, pass_fds=(write,), check=True, timeout=30,
    )  # fmt: skip
    os.close(write)
    with os.fdopen(read, "rb") as report:
        assert "the workspace folder was replaced" in json.loads(report.read())["error"]
    assert not (other / "ran-here").exists()


@pytest.mark.parametrize("subagent", [False, True], ids=["task", "subagent"])
def test_a_workspace_template_is_not_copied_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, subagent: bool
) -> None:
    """A task's first call copies its workspace template (``shutil.copytree``: a repository,
    seconds to minutes), and so does a sub-agent's in its own folder: in a thread, not on the
    event loop, which a thread-pool tool worker shares between all its calls and heartbeats
    (docs/performance.md: no built-in tool blocks it)."""
    template = tmp_path / "template"
    template.mkdir()
    (template / "a.txt").write_text("x\n")
    copied_on: list[int] = []
    real = shutil.copytree

    def recording(*args: Any, **kwargs: Any) -> Any:
        copied_on.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(shutil, "copytree", recording)  # workers.workspaces calls it so
    root = tmp_path / "workspaces" / "t"
    request = ToolRequest(
        fence=Fence(task_id="t", step_id="s", iteration=1, attempt=1, call_id="c1"),
        agent_id="a",
        action=ToolCallAction(
            call_id="c1", name="file_read", arguments=json.dumps({"path": "a.txt"})
        ),
        workspace=str(root / "subagents" / "t.1" if subagent else root),
        workspace_base=str(root) if subagent else None,
        workspace_template=str(template),
        config=LoopConfig(),
    )

    async def go() -> int:
        core = local_core()
        try:
            message = await run_tool_call(request, core)
            assert "x" in message.observation.content, message
            return threading.get_ident()
        finally:
            await core.aclose()

    loop_thread = asyncio.run(go())
    assert copied_on and loop_thread not in copied_on


def test_two_calls_opening_a_new_workspace_together_copy_its_template_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of ``fixm``: the template copy moved to a thread, so the calls of one turn that
    open a task's new workspace together (parallel tool calls) each see it missing and each
    copy the whole template (a repository: minutes of I/O each) before one rename wins; on
    the loop the second call found the first's copy. The copy should be shared (one per
    workspace in flight)."""
    import workers.workspaces

    template = tmp_path / "template"
    template.mkdir()
    (template / "a.txt").write_text("a")
    copies: list[str] = []
    release = threading.Event()
    real_copytree = shutil.copytree

    def copytree(src: Any, dst: Any, **kwargs: Any) -> Any:
        copies.append(str(dst))
        release.wait(10)  # held until both calls have looked at the workspace
        return real_copytree(src, dst, **kwargs)

    monkeypatch.setattr(workers.workspaces.shutil, "copytree", copytree)
    workspace = tmp_path / "ws" / "t"

    async def both() -> None:
        async def open_it() -> Path:
            return await workers.workspaces.open_task_workspace(workspace, str(template))

        async def let_go() -> None:
            await asyncio.sleep(0)  # both calls have run up to their first await
            release.set()

        await asyncio.gather(open_it(), open_it(), let_go())

    asyncio.run(both())
    assert (workspace / "a.txt").read_text() == "a"
    assert len(copies) == 1, f"the template was copied {len(copies)} times: {copies}"


def test_calls_opening_a_new_workspace_together_each_get_its_copy_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared copy's failure is raised to every call that awaited it, and the next call
    tries again (nothing of the failed copy is kept)."""
    import workers.workspaces

    template = tmp_path / "template"
    template.mkdir()
    (template / "a.txt").write_text("a")
    real_copytree = shutil.copytree
    copies: list[str] = []

    def copytree(src: Any, dst: Any, **kwargs: Any) -> Any:
        copies.append(str(dst))
        if len(copies) == 1:
            raise OSError(28, "No space left on device")
        return real_copytree(src, dst, **kwargs)

    monkeypatch.setattr(workers.workspaces.shutil, "copytree", copytree)
    workspace = tmp_path / "ws" / "t"

    async def go() -> list[Any]:
        def open_it() -> Any:
            return workers.workspaces.open_task_workspace(workspace, str(template))

        failed = await asyncio.gather(open_it(), open_it(), return_exceptions=True)
        return [*failed, await open_it()]

    first, second, third = asyncio.run(go())
    assert isinstance(first, OSError) and isinstance(second, OSError)
    assert third == workspace and (workspace / "a.txt").read_text() == "a"
    assert len(copies) == 2
