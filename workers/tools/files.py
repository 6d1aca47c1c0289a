"""The file tools: ``file_read``, ``file_write`` and ``file_list``, confined to the workspace.

Each tool runs its blocking file work in a thread, so concurrent tool calls do not stall the
event loop. Metadata for the stagnation detector (all strings):

- ``file_read``: ``kind=read``, ``path``, ``content_hash`` (SHA-256 of the *whole* file, whatever
  line range was returned), ``total_lines``;
- ``file_write``: ``kind=write``, ``path``, ``before_hash`` (``""`` when the file did not exist),
  ``after_hash``, ``created``;
- ``file_list``: ``kind=read``, ``path`` (the directory), ``content_hash`` (of the listing),
  ``entries``.

``path`` is always the workspace-relative real path, so two spellings of one file agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from shared.inference import ToolDefinition
from workers.tools.arguments import BlockingTool
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.errors import PathOutsideWorkspaceError, WorkspacePathError
from workers.tools.output import (
    BINARY_SNIFF_BYTES,
    cap_bytes,
    cap_text,
    error_output,
    looks_binary,
    sha256_hex,
)
from workers.tools.workspace import (
    display_path,
    resolve_in_workspace,
    walk_entries,
    workspace_root,
)

__all__ = [
    "FILE_LIST_DEFINITION",
    "FILE_READ_DEFINITION",
    "FILE_WRITE_DEFINITION",
    "FileListTool",
    "FileReadTool",
    "FileWriteTool",
    "line_pieces",
    "os_failure",
    "path_failure",
]

_PATH_HELP = "relative to the workspace; an absolute path is accepted only inside the workspace"

FILE_READ_DEFINITION = ToolDefinition(
    name="file_read",
    description=(
        "Read a UTF-8 text file from the workspace. Returns the file's text, or only a range of "
        "lines when start_line/end_line (or offset/limit) are given; use a range for large "
        "files. Binary files are refused. Long output is truncated with a marker."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": f"File to read, {_PATH_HELP}.",
            },
            "start_line": {
                "type": "integer",
                "minimum": 1,
                "description": "First line to return, 1-based (default 1).",
            },
            "end_line": {
                "type": "integer",
                "minimum": 1,
                "description": "Last line to return, inclusive (default: the end of the file).",
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "description": "Instead of start_line: number of lines to skip first.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": "Instead of end_line: maximum number of lines to return.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    },
)

FILE_WRITE_DEFINITION = ToolDefinition(
    name="file_write",
    description=(
        "Write text to a file in the workspace, replacing the whole file (it is created if it "
        "does not exist). The write is atomic: readers see the old or the new content, never a "
        "mix. Missing parent directories are created unless create_dirs is false."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": f"File to write, {_PATH_HELP}.",
            },
            "content": {"type": "string", "description": "The complete new content of the file."},
            "create_dirs": {
                "type": "boolean",
                "description": "Create missing parent directories (default true).",
            },
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
)

FILE_LIST_DEFINITION = ToolDefinition(
    name="file_list",
    description=(
        "List a directory of the workspace in sorted order, one entry per line, as paths "
        "relative to the workspace: directories end with '/', symbolic links with '@' (links "
        "are listed, never followed). With recursive, subdirectories are listed depth-first."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": f"Directory to list (default '.', the workspace), {_PATH_HELP}.",
            },
            "recursive": {
                "type": "boolean",
                "description": "Also list the contents of subdirectories (default false).",
            },
            "max_entries": {
                "type": "integer",
                "minimum": 1,
                "maximum": 10_000,
                "description": "Stop after this many entries (default 500).",
            },
        },
        "additionalProperties": False,
    },
)

_PIECE_BYTES = 64 * 1024
_NEW_FILE_MODE = 0o644
_DEFAULT_MAX_ENTRIES = 500


def path_failure(exc: WorkspacePathError, **metadata: str) -> ToolOutput:
    """The ``is_error`` output for a refused path argument."""
    outside = isinstance(exc, PathOutsideWorkspaceError)
    error_type = "path_outside_workspace" if outside else "invalid_path"
    return error_output(str(exc), error_type=error_type, **metadata)


def os_failure(action: str, rel: str, exc: OSError, **metadata: str) -> ToolOutput:
    """The ``is_error`` output for a file operation the operating system refused."""
    reason = exc.strerror or str(exc)
    return error_output(f"{action} {rel!r} failed: {reason}", error_type="os_error", **metadata)


class FileReadTool(BlockingTool):
    """``file_read``: a text file or a range of its lines, hashed whole for the detector."""

    DEFINITION = FILE_READ_DEFINITION
    KIND = "read"

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_read_file`` (in a worker thread)."""
        return _read_file(arguments, context)


@dataclass(frozen=True, slots=True)
class _LineWindow:
    """Lines ``first`` to ``last`` inclusive, 1-based; ``last=None`` means to the end."""

    first: int = 1
    last: int | None = None

    @property
    def whole_file(self) -> bool:
        return self.first == 1 and self.last is None

    def contains(self, line_no: int) -> bool:
        return line_no >= self.first and (self.last is None or line_no <= self.last)


def _line_window(arguments: Mapping[str, Any]) -> _LineWindow | str:
    """The requested lines, or the reason the arguments do not describe a range."""
    by_lines = "start_line" in arguments or "end_line" in arguments
    by_offset = "offset" in arguments or "limit" in arguments
    if by_lines and by_offset:
        return "give either start_line/end_line or offset/limit, not both"
    if by_offset:
        first = int(arguments.get("offset", 0)) + 1
        limit = arguments.get("limit")
        return _LineWindow(first, None if limit is None else first + int(limit) - 1)
    first = int(arguments.get("start_line", 1))
    end = arguments.get("end_line")
    if end is not None and int(end) < first:
        return f"end_line {int(end)} is before start_line {first}; give end_line >= start_line"
    return _LineWindow(first, None if end is None else int(end))


@dataclass(frozen=True, slots=True)
class _Scan:
    """One pass over a file: its hash, its line count, and the beginning of the selected lines."""

    digest: str
    total_lines: int
    selected: bytes
    selected_bytes: int


def line_pieces(handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(line number, piece)``; a line longer than ``_PIECE_BYTES`` comes in several pieces."""
    line_no = 1
    for piece in iter(partial(handle.readline, _PIECE_BYTES), b""):
        yield line_no, piece
        if piece.endswith(b"\n"):
            line_no += 1


def _scan(target: Path, window: _LineWindow, keep_bytes: int) -> _Scan | None:
    """Hash the whole file and keep up to ``keep_bytes`` of the window; None when binary."""
    hasher = hashlib.sha256()
    kept = bytearray()
    selected_bytes = total_lines = 0
    with target.open("rb") as handle:
        if looks_binary(handle.read(BINARY_SNIFF_BYTES)):
            return None
        handle.seek(0)
        for line_no, piece in line_pieces(handle):
            hasher.update(piece)
            total_lines = line_no
            if window.contains(line_no):
                selected_bytes += len(piece)
                if len(kept) <= keep_bytes:
                    kept += piece
    return _Scan(hasher.hexdigest(), total_lines, bytes(kept), selected_bytes)


def _read_file(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    window = _line_window(arguments)
    if isinstance(window, str):
        return error_output(f"file_read: {window}", error_type="invalid_arguments", kind="read")
    try:
        root = workspace_root(context.workspace)
        target = resolve_in_workspace(context.workspace, arguments["path"])
    except WorkspacePathError as exc:
        return path_failure(exc, kind="read")
    rel = display_path(root, target)
    try:
        missing = _not_a_readable_file(target, rel)
        if missing is not None:
            return missing
        scan = _scan(target, window, context.max_output_bytes)
    except OSError as exc:  # a name too long, a permission denied on a parent...
        return os_failure("reading", rel, exc, kind="read", path=rel)
    if scan is None:
        return error_output(
            f"{rel!r} is a binary file (it contains NUL bytes); file_read only returns text",
            error_type="binary",
            kind="read",
            path=rel,
        )
    return _read_output(rel, window, scan, context.max_output_bytes)


def _not_a_readable_file(target: Path, rel: str) -> ToolOutput | None:
    if target.is_dir():
        return error_output(
            f"{rel!r} is a directory; use file_list to see its entries",
            error_type="is_directory",
            kind="read",
            path=rel,
        )
    if not target.exists():
        return error_output(
            f"file {rel!r} does not exist; use file_list to find the right name",
            error_type="not_found",
            kind="read",
            path=rel,
        )
    if not target.is_file():
        return error_output(
            f"{rel!r} is not a regular file (a pipe, socket or device); file_read reads files",
            error_type="not_a_file",
            kind="read",
            path=rel,
        )
    return None


def _read_output(rel: str, window: _LineWindow, scan: _Scan, max_bytes: int) -> ToolOutput:
    metadata = {
        "kind": "read",
        "path": rel,
        "content_hash": scan.digest,
        "total_lines": str(scan.total_lines),
    }
    if window.first > max(scan.total_lines, 1):
        note = f"[{rel} has {scan.total_lines} lines; line {window.first} is past the end]"
        return ToolOutput(content=note, metadata=metadata)
    hint = "read a narrower range with start_line and end_line"
    text = cap_bytes(scan.selected, max_bytes, hint=hint, total_bytes=scan.selected_bytes)
    if not window.whole_file:
        last = scan.total_lines if window.last is None else min(window.last, scan.total_lines)
        separator = "" if text.endswith("\n") or not text else "\n"
        text += f"{separator}[lines {window.first}-{last} of {scan.total_lines}]"
    return ToolOutput(content=text, metadata=metadata)


class FileWriteTool(BlockingTool):
    """``file_write``: replace a file's content atomically, reporting before and after hashes."""

    DEFINITION = FILE_WRITE_DEFINITION
    KIND = "write"

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_write_file`` (in a worker thread)."""
        return _write_file(arguments, context)


def _write_file(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    try:
        root = workspace_root(context.workspace)
        target = resolve_in_workspace(context.workspace, arguments["path"])
    except WorkspacePathError as exc:
        return path_failure(exc, kind="write")
    rel = display_path(root, target)
    data = str(arguments["content"]).encode("utf-8")
    try:
        return _write_checked(target, rel, data, create_dirs=arguments.get("create_dirs", True))
    except OSError as exc:
        return os_failure("writing", rel, exc, kind="write", path=rel)


def _write_checked(target: Path, rel: str, data: bytes, *, create_dirs: bool) -> ToolOutput:
    if target.exists() and not target.is_file():
        return error_output(
            f"{rel!r} exists and is not a regular file; choose another path",
            error_type="not_a_file",
            kind="write",
            path=rel,
        )
    before = _file_hash(target) if target.exists() else ""
    metadata = {
        "kind": "write",
        "path": rel,
        "before_hash": before,
        "after_hash": sha256_hex(data),
        "created": "false" if before else "true",
    }
    if before == metadata["after_hash"]:
        return ToolOutput(
            content=f"{rel} unchanged: it already has this content", metadata=metadata
        )
    if not target.parent.is_dir():
        if not create_dirs:
            parent = Path(rel).parent.as_posix()
            return error_output(
                f"directory {parent!r} does not exist; create it or pass create_dirs=true",
                error_type="not_found",
                **metadata,
            )
        target.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(target, data)
    verb = "updated" if before else "created"
    return ToolOutput(content=f"wrote {len(data)} bytes to {rel} ({verb})", metadata=metadata)


def _file_hash(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _atomic_write(target: Path, data: bytes) -> None:
    """Write to a temporary file next to ``target``, then rename it over ``target``."""
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else _NEW_FILE_MODE
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


class FileListTool(BlockingTool):
    """``file_list``: sorted directory entries, never following symbolic links."""

    DEFINITION = FILE_LIST_DEFINITION
    KIND = "read"

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_list_directory`` (in a worker thread)."""
        return _list_directory(arguments, context)


def _label(entry: os.DirEntry[str], root: Path) -> str:
    rel = display_path(root, Path(entry.path))
    if entry.is_symlink():
        return rel + "@"
    return rel + "/" if entry.is_dir(follow_symlinks=False) else rel


def _list_directory(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    try:
        root = workspace_root(context.workspace)
        directory = resolve_in_workspace(context.workspace, arguments.get("path", "."))
    except WorkspacePathError as exc:
        return path_failure(exc, kind="read")
    rel = display_path(root, directory)
    try:
        is_directory = directory.is_dir()
        exists = is_directory or directory.exists()
    except OSError as exc:  # a name too long, a permission denied on a parent...
        return os_failure("listing", rel, exc, kind="read", path=rel)
    if not is_directory:
        what = "a file; use file_read" if exists else "missing"
        return error_output(
            f"{rel!r} is not a directory ({what})", error_type="not_found", kind="read", path=rel
        )
    limit = int(arguments.get("max_entries", _DEFAULT_MAX_ENTRIES))
    labels: list[str] = []
    for entry in walk_entries(directory, recursive=bool(arguments.get("recursive", False))):
        if len(labels) == limit:
            labels.append(f"[listing stopped after {limit} entries; list a subdirectory]")
            break
        labels.append(_label(entry, root))
    listing = "\n".join(labels) if labels else f"[{rel} is empty]"
    metadata = {
        "kind": "read",
        "path": rel,
        "content_hash": sha256_hex(listing.encode("utf-8")),
        "entries": str(min(len(labels), limit)),
    }
    content = cap_text(listing, context.max_output_bytes, hint="list a subdirectory")
    return ToolOutput(content=content, metadata=metadata)
