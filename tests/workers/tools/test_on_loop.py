"""``file_read`` on the event loop: only a small regular file on local mounts reached without
a link; everything else (a network mount, a link, a FIFO, a large file) in a thread, with the
same checks and the same answers either way."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from workers.tools import FileReadTool, ToolContext, ToolOutput, on_loop
from workers.tools.on_loop import LOOP_READ_BYTES, MountTable, parse_mountinfo, reads_on_loop

pytestmark = pytest.mark.skipif(not Path("/proc/self/mountinfo").exists(), reason="Linux only")


def _line(point: str, kind: str, mount_id: int = 30) -> str:
    return f"{mount_id} 1 8:1 / {point} rw,relatime shared:1 - {kind} /dev/sda1 rw\n"


def _table(tmp_path: Path, *mounts: tuple[str, str]) -> MountTable:
    """A mount table read from a mountinfo file written here ("/" is ext4 unless given)."""
    text = _line("/", "ext4", 1) + "".join(_line(point, kind) for point, kind in mounts)
    path = tmp_path.parent / f"mountinfo-{tmp_path.name}"
    path.write_text(text)
    return MountTable(str(path))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hello')\n")
    return root


def test_a_small_file_on_local_mounts_is_read_on_the_loop(workspace: Path, tmp_path: Path) -> None:
    table = _table(tmp_path, (str(tmp_path), "tmpfs"))
    assert reads_on_loop(workspace, "src/main.py", table)
    assert reads_on_loop(workspace, str(workspace / "src" / "main.py"), table)
    assert reads_on_loop(workspace, "src/../src/main.py", table)


@pytest.mark.parametrize("kind", ["nfs4", "cifs", "fuse.sshfs", "9p", "ceph", "proc"])
def test_a_mount_of_another_kind_on_the_path_sends_the_read_to_a_thread(
    workspace: Path, tmp_path: Path, kind: str
) -> None:
    """The workspace's own mount, one above it, one on the file's way below it."""
    assert not reads_on_loop(workspace, "src/main.py", _table(tmp_path, (str(workspace), kind)))
    assert not reads_on_loop(workspace, "src/main.py", _table(tmp_path, (str(tmp_path), kind)))
    below = _table(tmp_path, (str(workspace / "src"), kind))
    assert not reads_on_loop(workspace, "src/main.py", below)
    (workspace / "other").mkdir()
    beside = _table(tmp_path, (str(workspace / "other"), kind))
    assert reads_on_loop(workspace, "src/main.py", beside)  # not on this file's way


def test_a_network_mount_stacked_over_a_local_one_counts(workspace: Path, tmp_path: Path) -> None:
    table = _table(tmp_path, (str(workspace), "ext4"), (str(workspace), "nfs"))
    assert not reads_on_loop(workspace, "src/main.py", table)


def test_a_network_root_sends_every_read_to_a_thread(workspace: Path, tmp_path: Path) -> None:
    path = tmp_path / "root-nfs"
    path.write_text(_line("/", "nfs", 1))
    assert not reads_on_loop(workspace, "src/main.py", MountTable(str(path)))


def test_a_link_anywhere_on_the_path_sends_the_read_to_a_thread(
    workspace: Path, tmp_path: Path
) -> None:
    table = _table(tmp_path)
    (workspace / "file-link").symlink_to(workspace / "src" / "main.py")
    (workspace / "dir-link").symlink_to(workspace / "src")
    linked_ws = tmp_path / "linked-ws"
    linked_ws.symlink_to(workspace)
    assert not reads_on_loop(workspace, "file-link", table)
    assert not reads_on_loop(workspace, "dir-link/main.py", table)
    assert not reads_on_loop(linked_ws, "src/main.py", table)  # the workspace itself a link


def test_what_is_not_a_small_regular_file_goes_to_a_thread(workspace: Path, tmp_path: Path) -> None:
    table = _table(tmp_path)
    os.mkfifo(workspace / "pipe")
    (workspace / "big.txt").write_text("x" * (LOOP_READ_BYTES + 1))
    (workspace / "edge.txt").write_text("x" * LOOP_READ_BYTES)
    assert not reads_on_loop(workspace, "pipe", table)
    assert not reads_on_loop(workspace, "big.txt", table)
    assert reads_on_loop(workspace, "edge.txt", table)
    assert not reads_on_loop(workspace, "src", table)
    assert not reads_on_loop(workspace, ".", table)
    assert not reads_on_loop(workspace, "missing.txt", table)
    assert not reads_on_loop(workspace, "src/main.py/below", table)
    assert not reads_on_loop(workspace, "../ws/../outside.txt", table)
    assert not reads_on_loop(workspace, "/etc/hostname", table)
    assert not reads_on_loop(workspace, "a\x00b", table)
    assert not reads_on_loop(Path("relative"), "src/main.py", table)


def test_an_unreadable_mount_table_sends_every_read_to_a_thread(
    workspace: Path, tmp_path: Path
) -> None:
    assert not reads_on_loop(workspace, "src/main.py", MountTable(str(tmp_path / "absent")))


def test_mountinfo_paths_are_unescaped_and_odd_lines_skipped() -> None:
    text = (
        "36 35 98:0 / /mnt/my\\040disk rw - ext4 /dev/a rw\n"
        "37 35 98:0 / /srv rw shared:2 master:1 - nfs4 host:/x rw\n"
        "garbage\n"
    )
    assert parse_mountinfo(text) == {"/mnt/my disk": True, "/srv": False}


def test_the_process_table_is_read_and_kept_until_the_kernel_says_it_changed() -> None:
    table = MountTable()
    first = table.current()
    assert first is not None and "/" in first
    assert table.current() is first  # no change reported: not read again


# --- the tool: where its work runs, and that the answers do not depend on it ---------------


class _Where(FileReadTool):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        self.threads.append(threading.get_ident())
        return super().work(arguments, context)


@pytest.fixture
def local_table(tmp_path: Path) -> Iterator[None]:
    """The process's table replaced by one where every mount is local."""
    saved = on_loop._MOUNTS
    on_loop._MOUNTS = _table(tmp_path)
    try:
        yield
    finally:
        on_loop._MOUNTS = saved


def _run_where(tool: _Where, path: str, workspace: Path) -> tuple[ToolOutput, bool]:
    async def run() -> tuple[ToolOutput, int]:
        output = await tool.run({"path": path}, ToolContext(workspace=workspace))
        return output, threading.get_ident()

    output, loop_thread = asyncio.run(run())
    return output, tool.threads[-1] == loop_thread


@pytest.mark.usefixtures("local_table")
def test_the_tool_reads_a_small_local_file_on_the_loop(workspace: Path) -> None:
    output, on_the_loop = _run_where(_Where(), "src/main.py", workspace)
    assert on_the_loop
    assert not output.is_error and output.content == "print('hello')\n"
    assert output.metadata["path"] == "src/main.py"


@pytest.mark.usefixtures("local_table")
def test_a_fifo_is_refused_from_a_thread_without_blocking(workspace: Path) -> None:
    os.mkfifo(workspace / "pipe")
    output, on_the_loop = _run_where(_Where(), "pipe", workspace)
    assert not on_the_loop
    assert output.is_error and output.metadata["error_type"] == "not_a_file"


@pytest.mark.usefixtures("local_table")
def test_a_link_out_of_the_workspace_is_refused_as_before(workspace: Path, tmp_path: Path) -> None:
    """Confinement is the tool's own check, wherever it runs: a link leading out goes to the
    thread, which refuses it; one inside is followed there and read."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET CONTENT\n")
    (workspace / "out").symlink_to(secret)
    (workspace / "in").symlink_to(workspace / "src" / "main.py")
    tool = _Where()
    output, on_the_loop = _run_where(tool, "out", workspace)
    assert not on_the_loop
    assert output.is_error and output.metadata["error_type"] == "path_outside_workspace"
    assert "TOP SECRET" not in output.content
    output, on_the_loop = _run_where(tool, "in", workspace)
    assert not on_the_loop
    assert not output.is_error and output.content == "print('hello')\n"
    output, on_the_loop = _run_where(tool, "../secret.txt", workspace)
    assert not on_the_loop and output.is_error


@pytest.mark.usefixtures("local_table")
def test_a_large_file_is_read_in_a_thread_whole(workspace: Path) -> None:
    (workspace / "big.txt").write_text("y\n" * LOOP_READ_BYTES)
    output, on_the_loop = _run_where(_Where(), "big.txt", workspace)
    assert not on_the_loop
    assert output.metadata["total_lines"] == str(LOOP_READ_BYTES)
