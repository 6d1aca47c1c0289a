"""file_read, file_write and file_list in a temporary workspace."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest

from workers.tools import FileListTool, FileReadTool, FileWriteTool, Tool, ToolContext, ToolOutput
from workers.tools.files import (
    INLINE_READ_BYTES,
    _LineWindow,
    _OverLimitError,
    _scan,
    line_pieces,
)
from workers.tools.output import BINARY_SNIFF_BYTES

TEXT = "".join(f"line {n}\n" for n in range(1, 11))


def _run(tool: Tool, arguments: dict[str, Any], workspace: Path, **limits: Any) -> ToolOutput:
    context = ToolContext(workspace=workspace, **limits)
    return asyncio.run(tool.run(arguments, context))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace holding a ten-line text file."""
    (tmp_path / "notes.txt").write_text(TEXT)
    return tmp_path


def test_read_whole_file(workspace: Path) -> None:
    """A read returns the text and the read metadata."""
    output = _run(FileReadTool(), {"path": "notes.txt"}, workspace)
    assert not output.is_error
    assert output.content == TEXT
    assert output.metadata == {
        "kind": "read",
        "path": "notes.txt",
        "content_hash": _sha(TEXT.encode()),
        "total_lines": "10",
    }


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"start_line": 2, "end_line": 3}, "line 2\nline 3\n[lines 2-3 of 10]"),
        ({"start_line": 9}, "line 9\nline 10\n[lines 9-10 of 10]"),
        ({"end_line": 1}, "line 1\n[lines 1-1 of 10]"),
        ({"offset": 4, "limit": 2}, "line 5\nline 6\n[lines 5-6 of 10]"),
        ({"offset": 8}, "line 9\nline 10\n[lines 9-10 of 10]"),
        ({"start_line": 9, "end_line": 50}, "line 9\nline 10\n[lines 9-10 of 10]"),
    ],
)
def test_read_line_ranges_share_the_whole_file_hash(
    workspace: Path, arguments: dict[str, Any], expected: str
) -> None:
    """Any line range returns those lines, with the hash of the whole file."""
    output = _run(FileReadTool(), {"path": "notes.txt", **arguments}, workspace)
    assert output.content == expected
    assert output.metadata["content_hash"] == _sha(TEXT.encode())


def test_read_past_the_end_is_a_note(workspace: Path) -> None:
    """A range after the last line says so without being an error."""
    output = _run(FileReadTool(), {"path": "notes.txt", "start_line": 40}, workspace)
    assert not output.is_error
    assert "has 10 lines; line 40 is past the end" in output.content


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"start_line": 2, "offset": 1}, "either start_line/end_line or offset/limit"),
        ({"start_line": 5, "end_line": 2}, "end_line 2 is before start_line 5"),
        ({"start_line": 0}, "at 'start_line'"),
        ({"limit": "3"}, "at 'limit'"),
        ({"lines": 3}, "Additional properties"),
    ],
)
def test_read_rejects_bad_ranges(workspace: Path, arguments: dict[str, Any], fragment: str) -> None:
    """Contradictory or invalid range arguments are is_error outputs saying what is wrong."""
    output = _run(FileReadTool(), {"path": "notes.txt", **arguments}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == "invalid_arguments"
    assert fragment in output.content


def test_read_refuses_binary(workspace: Path) -> None:
    """A file with NUL bytes is refused as binary."""
    (workspace / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    output = _run(FileReadTool(), {"path": "image.png"}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == "binary"
    assert "'image.png' is a binary file" in output.content


@pytest.mark.parametrize(
    ("path", "error_type"), [("missing.txt", "not_found"), (".", "is_directory")]
)
def test_read_missing_and_directory(workspace: Path, path: str, error_type: str) -> None:
    """Missing files and directories are refused with a pointer to file_list."""
    output = _run(FileReadTool(), {"path": path}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == error_type
    assert "file_list" in output.content


class _WhereRead(FileReadTool):
    """file_read, noting where each read was done: ``("loop", thread)`` for a read answered on
    the loop, ``("thread", thread)`` for one handed to a thread."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, int]] = []

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        self.reads.append(("thread", threading.get_ident()))
        return super().work(arguments, context)

    def work_inline(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput | None:
        output = super().work_inline(arguments, context)
        if output is not None:
            self.reads.append(("loop", threading.get_ident()))
        return output


def test_a_small_file_is_read_on_the_loop_and_a_big_one_in_a_thread(workspace: Path) -> None:
    """A file of at most INLINE_READ_BYTES is read on the event loop's own thread (no hand-off
    to a thread and back), and so is a refusal that reads nothing (a pipe, a missing file); a
    bigger file, an absolute path and a path that climbs (``..``) go to a thread. Either way the
    output is the same read."""
    (workspace / "big.txt").write_text("x" * INLINE_READ_BYTES + "\n")
    (workspace / "edge.txt").write_text("y" * (INLINE_READ_BYTES - 1) + "\n")
    (workspace / "sub").mkdir()
    os.mkfifo(workspace / "pipe")
    tool = _WhereRead()
    context = ToolContext(workspace=workspace, max_output_bytes=2 * INLINE_READ_BYTES)
    paths = ["notes.txt", "edge.txt", "pipe", "absent.txt", "big.txt",
             str(workspace / "notes.txt"), "sub/../notes.txt"]  # fmt: skip

    async def reads() -> tuple[int, list[ToolOutput]]:
        return threading.get_ident(), [await tool.run({"path": p}, context) for p in paths]

    loop, (small, edge, pipe, absent, big, absolute, climbing) = asyncio.run(reads())
    assert tool.reads[:4] == [("loop", loop)] * 4
    assert [where for where, _ in tool.reads[4:]] == ["thread"] * 3
    assert all(thread != loop for _, thread in tool.reads[4:])
    assert small.content == absolute.content == climbing.content == TEXT
    assert edge.metadata["content_hash"] == _sha(b"y" * (INLINE_READ_BYTES - 1) + b"\n")
    assert big.metadata["content_hash"] == _sha(b"x" * INLINE_READ_BYTES + b"\n")
    assert pipe.metadata["error_type"] == "not_a_file"
    assert absent.metadata["error_type"] == "not_found"


def test_a_path_through_a_link_is_read_in_a_thread_and_refused_out_of_the_workspace(
    tmp_path: Path,
) -> None:
    """A path that passes through a symbolic link may resolve to any filesystem of the host (a
    hung network mount): it is read in a thread, never on the loop; a link out of the workspace
    is refused there as always. A link's target inside the workspace reads as itself."""
    workspace = tmp_path / "ws"
    (workspace / "real").mkdir(parents=True)
    (workspace / "real" / "inside.txt").write_text("inside\n")
    (tmp_path / "secret.txt").write_text("the secret content\n")
    (workspace / "link.txt").symlink_to(tmp_path / "secret.txt")
    (workspace / "dir").symlink_to(workspace / "real")
    tool = _WhereRead()

    async def read() -> tuple[int, list[ToolOutput]]:
        context = ToolContext(workspace=workspace)
        paths = ["link.txt", "dir/inside.txt", "real/inside.txt"]
        return threading.get_ident(), [await tool.run({"path": p}, context) for p in paths]

    loop, (outside, through, direct) = asyncio.run(read())
    assert [where for where, _ in tool.reads] == ["thread", "thread", "loop"]
    assert tool.reads[0][1] != loop and tool.reads[2][1] == loop
    assert outside.is_error
    assert "the secret content" not in outside.content
    assert through.content == direct.content == "inside\n"


def test_a_window_beyond_any_line_number_reads_as_before(workspace: Path) -> None:
    """Line numbers past what a block could hold (the schema sets no maximum) read as past the
    end, as the line-by-line scan read them, not as an overflow."""
    huge = 10**20
    cases = [
        ({"start_line": 1, "end_line": huge}, TEXT + "[lines 1-10 of 10]"),
        ({"offset": 8, "limit": 2**63}, "line 9\nline 10\n[lines 9-10 of 10]"),
        ({"start_line": huge}, f"[notes.txt has 10 lines; line {huge} is past the end]"),
    ]
    for arguments, expected in cases:
        output = _run(FileReadTool(), {"path": "notes.txt", **arguments}, workspace)
        assert not output.is_error
        assert output.content == expected


class _GrowingFile:
    """A small file's handle whose first read finds it grown by 1 MiB (a command writing to it
    while it is read): what the size seen when it was opened cannot bound."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = path.open("rb")
        self.grown = False
        self.read_bytes = 0

    def fileno(self) -> int:
        return self.handle.fileno()

    def seek(self, offset: int) -> int:
        return self.handle.seek(offset)

    def read(self, size: int = -1) -> bytes:
        if not self.grown:
            with self.path.open("ab") as writer:
                writer.write(b"more\n" * (1024 * 1024 // 5))
            self.grown = True
        data = self.handle.read(size)
        self.read_bytes += len(data)
        return data


def test_a_file_growing_while_it_is_read_inline_stops_the_inline_read(tmp_path: Path) -> None:
    """The inline bound is enforced on the bytes read, not predicted from the size when
    opened: a file that grows past it is dropped after at most one more block (and read again
    in a thread, where the call's timeout applies)."""
    path = tmp_path / "log.txt"
    path.write_text("start\n")
    growing = _GrowingFile(path)
    try:
        with pytest.raises(_OverLimitError):
            _scan(cast("BinaryIO", growing), _LineWindow(), 1000, limit=INLINE_READ_BYTES)
    finally:
        growing.handle.close()
    assert growing.read_bytes <= 2 * INLINE_READ_BYTES + BINARY_SNIFF_BYTES
    big = tmp_path / "big.txt"
    big.write_bytes(b"z\n" * INLINE_READ_BYTES)
    with big.open("rb") as handle, pytest.raises(_OverLimitError):
        _scan(handle, _LineWindow(), 1000, limit=INLINE_READ_BYTES)  # too big: stops reading


def test_read_refuses_a_fifo(workspace: Path) -> None:
    """A named pipe is refused instead of blocking the read forever."""
    os.mkfifo(workspace / "pipe")
    output = _run(FileReadTool(), {"path": "pipe"}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == "not_a_file"


def test_read_cap_never_splits_a_character(workspace: Path) -> None:
    """The byte cap cuts between characters and says how much was shown."""
    (workspace / "accents.txt").write_text("é" * 1000)
    output = _run(FileReadTool(), {"path": "accents.txt"}, workspace, max_output_bytes=101)
    body, marker = output.content.rsplit("\n", 1)
    assert body == "é" * 50
    assert marker == (
        "[output truncated: showing 100 of 2000 bytes; "
        "read a narrower range with start_line and end_line]"
    )
    assert output.metadata["content_hash"] == _sha(("é" * 1000).encode())


def test_read_counts_lines_longer_than_a_read_chunk(workspace: Path) -> None:
    """A very long line is one line, however it is read."""
    (workspace / "long.txt").write_text("a" * 200_000 + "\nlast\n")
    output = _run(FileReadTool(), {"path": "long.txt", "start_line": 2}, workspace)
    assert output.content == "last\n[lines 2-2 of 2]"
    assert output.metadata["total_lines"] == "2"


def test_read_invalid_utf8_is_replaced(workspace: Path) -> None:
    """Latin-1 bytes are shown with replacement characters, not refused."""
    (workspace / "latin.txt").write_bytes(b"caf\xe9\n")
    output = _run(FileReadTool(), {"path": "latin.txt"}, workspace)
    assert output.content == "caf\ufffd\n"


def test_write_creates_with_empty_before_hash(workspace: Path) -> None:
    """A new file has an empty before_hash and creates its parent directories."""
    output = _run(FileWriteTool(), {"path": "src/app.py", "content": "x = 1\n"}, workspace)
    assert not output.is_error
    assert (workspace / "src" / "app.py").read_text() == "x = 1\n"
    assert output.content == "wrote 6 bytes to src/app.py (created)"
    assert output.metadata == {
        "kind": "write",
        "path": "src/app.py",
        "before_hash": "",
        "after_hash": _sha(b"x = 1\n"),
        "created": "true",
    }


def test_write_update_reports_both_hashes(workspace: Path) -> None:
    """Replacing a file reports the hash before and after."""
    output = _run(FileWriteTool(), {"path": "notes.txt", "content": "new\n"}, workspace)
    assert output.metadata["before_hash"] == _sha(TEXT.encode())
    assert output.metadata["after_hash"] == _sha(b"new\n")
    assert output.metadata["created"] == "false"
    assert (workspace / "notes.txt").read_text() == "new\n"


def test_rewriting_the_same_content_keeps_the_hash(workspace: Path) -> None:
    """Writing a file's current content gives before == after and says unchanged."""
    output = _run(FileWriteTool(), {"path": "notes.txt", "content": TEXT}, workspace)
    assert output.metadata["before_hash"] == output.metadata["after_hash"] == _sha(TEXT.encode())
    assert "unchanged" in output.content


def test_write_is_atomic_and_keeps_the_mode(workspace: Path) -> None:
    """No temporary file is left behind and the file's permissions survive."""
    target = workspace / "notes.txt"
    target.chmod(0o600)
    _run(FileWriteTool(), {"path": "notes.txt", "content": "v2\n"}, workspace)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in workspace.iterdir()) == ["notes.txt"]


def test_write_through_inside_link_updates_the_target(workspace: Path) -> None:
    """A link inside the workspace stays a link; its target gets the content."""
    (workspace / "alias.txt").symlink_to(workspace / "notes.txt")
    output = _run(FileWriteTool(), {"path": "alias.txt", "content": "via link\n"}, workspace)
    assert output.metadata["path"] == "notes.txt"
    assert (workspace / "alias.txt").is_symlink()
    assert (workspace / "notes.txt").read_text() == "via link\n"


def test_write_without_create_dirs_needs_the_parent(workspace: Path) -> None:
    """With create_dirs false, a missing parent is an error with the fix."""
    arguments = {"path": "a/b/c.txt", "content": "x", "create_dirs": False}
    output = _run(FileWriteTool(), arguments, workspace)
    assert output.is_error
    assert "directory 'a/b' does not exist" in output.content
    assert not (workspace / "a").exists()


def test_write_refuses_a_directory(workspace: Path) -> None:
    """A directory cannot be overwritten with a file."""
    (workspace / "pkg").mkdir()
    output = _run(FileWriteTool(), {"path": "pkg", "content": "x"}, workspace)
    assert output.is_error
    assert output.metadata["error_type"] == "not_a_file"


def test_write_requires_content(workspace: Path) -> None:
    """The schema check runs inside the tool too."""
    output = _run(FileWriteTool(), {"path": "x.txt"}, workspace)
    assert output.is_error
    assert "'content' is a required property" in output.content


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small tree with a link to a directory outside the workspace."""
    workspace = tmp_path / "ws"
    outside = tmp_path / "outside"
    (workspace / "src" / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (workspace / "README.md").write_text("r")
    (workspace / "src" / "b.py").write_text("b")
    (workspace / "src" / "a.py").write_text("a")
    (workspace / "src" / "pkg" / "__init__.py").write_text("")
    (workspace / "out").symlink_to(outside)
    return workspace


def test_list_is_sorted_and_marks_kinds(tree: Path) -> None:
    """Entries are sorted; directories end with '/', links with '@'."""
    output = _run(FileListTool(), {}, tree)
    assert output.content == "README.md\nout@\nsrc/"
    assert output.metadata["kind"] == "read"
    assert output.metadata["path"] == "."
    assert output.metadata["entries"] == "3"
    assert output.metadata["content_hash"] == _sha(output.content.encode())


def test_list_recursive_is_depth_first_and_never_follows_links(tree: Path) -> None:
    """A recursive listing walks subdirectories in order and does not enter links."""
    output = _run(FileListTool(), {"recursive": True}, tree)
    assert output.content.splitlines() == [
        "README.md",
        "out@",
        "src/",
        "src/a.py",
        "src/b.py",
        "src/pkg/",
        "src/pkg/__init__.py",
    ]


def test_list_subdirectory_uses_workspace_paths(tree: Path) -> None:
    """Entries of a subdirectory are given relative to the workspace."""
    output = _run(FileListTool(), {"path": "src/pkg"}, tree)
    assert output.content == "src/pkg/__init__.py"
    assert output.metadata["path"] == "src/pkg"


def test_list_stops_at_max_entries(tree: Path) -> None:
    """max_entries bounds the listing and says it stopped."""
    output = _run(FileListTool(), {"recursive": True, "max_entries": 2}, tree)
    assert output.content.splitlines() == [
        "README.md",
        "out@",
        "[listing stopped after 2 entries; list a subdirectory]",
    ]
    assert output.metadata["entries"] == "2"


@pytest.mark.parametrize(("path", "fragment"), [("README.md", "a file"), ("nope", "missing")])
def test_list_refuses_non_directories(tree: Path, path: str, fragment: str) -> None:
    """Listing a file or a missing path is an error saying which."""
    output = _run(FileListTool(), {"path": path}, tree)
    assert output.is_error
    assert fragment in output.content


def test_list_empty_directory(tmp_path: Path) -> None:
    """An empty directory is reported as empty."""
    os.mkdir(tmp_path / "empty")
    output = _run(FileListTool(), {"path": "empty"}, tmp_path)
    assert output.content == "[empty is empty]"
    assert output.metadata["entries"] == "0"


def _scan_line_by_line(data: bytes, window: Any, keep_bytes: int) -> tuple[str, int, int, bytes]:
    """The scan as it was before it read by blocks (a piece per line), as the oracle."""
    hasher = hashlib.sha256()
    kept = bytearray()
    selected_bytes = total_lines = 0
    for line_no, piece in line_pieces(io.BytesIO(data)):
        hasher.update(piece)
        total_lines = line_no
        if window.contains(line_no):
            selected_bytes += len(piece)
            if len(kept) <= keep_bytes:
                kept += piece
    return hasher.hexdigest(), total_lines, selected_bytes, bytes(kept)


def test_the_block_scan_reads_what_the_line_scan_read() -> None:
    """Reading by blocks gives the hash, the line count, the window's size and the bytes the
    output is cut from that reading line by line gave: 3,000 random files (empty, with or
    without a final newline, lines longer than a block, a window inside, across or past the
    end) and windows, every output limit."""
    rng = random.Random(27)
    for _ in range(3_000):
        count = rng.choice([0, 1, 2, 10, 300])
        widths = [0, 1, 5, 40] + ([40_000] if count <= 10 else [])  # 80 KB: longer than a block
        lines = ["é" * rng.choice(widths) + "x" * rng.randint(0, 3) for _ in range(count)]
        data = "\n".join(lines).encode() + (b"\n" if rng.random() < 0.5 else b"")
        first = rng.randint(1, 320)
        window = _LineWindow(first, rng.choice([None, first, first + rng.randint(0, 50)]))
        keep = rng.choice([0, 1, 100, 64_000, 200_000])
        scan = _scan(io.BytesIO(data), window, keep)
        assert scan is not None
        digest, total, selected, kept = _scan_line_by_line(data, window, keep)
        assert (scan.digest, scan.total_lines, scan.selected_bytes) == (digest, total, selected)
        assert scan.selected == kept[: keep + 1]
        assert len(kept) <= keep or len(scan.selected) == keep + 1
