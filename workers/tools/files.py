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

Every path is checked (``resolve_in_workspace``), then opened from the workspace root one
component at a time without following a link, and written through the descriptor of its
directory (:mod:`workers.tools.confined`): a link swapped in after the check cannot take a read,
a write or a temporary file outside the workspace. A regular file with several hard links is
not read (its other names may be outside); a path of more than 256 components or 4096 bytes is
refused as too long.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

from shared.inference import ToolDefinition
from workers.tools.arguments import BlockingTool
from workers.tools.base import ToolContext, ToolOutput
from workers.tools.confined import (
    CheckedPath,
    attempts,
    check_path,
    directory_fd,
    open_file_at,
    walk_at,
)
from workers.tools.errors import PathOutsideWorkspaceError, WorkspacePathError
from workers.tools.output import (
    BINARY_SNIFF_BYTES,
    cap_bytes,
    cap_text,
    error_output,
    looks_binary,
    sha256_hex,
)

__all__ = [
    "FILE_LIST_DEFINITION",
    "FILE_READ_DEFINITION",
    "FILE_WRITE_DEFINITION",
    "INLINE_READ_BYTES",
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

INLINE_READ_BYTES = 64 * 1024
"""``file_read`` of a file of at most this many bytes runs on the worker's event loop rather
than in a thread (:meth:`FileReadTool.work_inline`): opening, hashing and reading it take tens
of microseconds from the page cache, less than the hand-off to a thread and back
(docs/performance.md). The bound is enforced, not predicted: a file found bigger when opened,
or that grows past it while it is read, is dropped and read again in a thread, where the
call's timeout applies."""
_NEW_FILE_MODE = 0o644
_TEMP_NAME_CHARS = 200
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
    read_only = True

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_read_file`` (in a worker thread)."""
        return _read_file(arguments, context)

    def work_inline(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput | None:
        """A read of at most :data:`INLINE_READ_BYTES`, on the loop; None (a thread then
        reads) for a bigger file, and for a path that is absolute, climbs (``..``) or passes
        through a symbolic link, whose resolution may reach any filesystem of the host (a hung
        network mount): those are checked and refused, or read, in a thread as before."""
        path = str(arguments.get("path", ""))
        if (
            os.path.isabs(path)
            or ".." in path.split(os.sep)
            or _through_link(context.workspace, path)
        ):
            return None
        try:
            return _read_file(arguments, context, limit=INLINE_READ_BYTES)
        except _OverLimitError:
            return None


def _through_link(workspace: os.PathLike[str], path: str) -> bool:
    """Whether a part of ``path`` below ``workspace`` is a symbolic link: its resolution may
    reach any filesystem of the host (a link to a hung network mount), so the read goes to a
    thread. One ``lstat`` per part, on the loop; a part that cannot be looked at (missing, a
    NUL byte) is left to the read, which reports it at once."""
    current = os.fspath(workspace)
    for part in path.split(os.sep):
        if part in ("", "."):
            continue
        current = os.path.join(current, part)
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return True
        except (OSError, ValueError):
            return False
    return False


class _OverLimitError(Exception):
    """The file has more bytes than an inline read may take (:data:`INLINE_READ_BYTES`)."""


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


def _scan(
    handle: BinaryIO, window: _LineWindow, keep_bytes: int, limit: int | None = None
) -> _Scan | None:
    """Hash the whole file and keep the window's first ``keep_bytes`` + 1 bytes (what
    :func:`~workers.tools.output.cap_bytes` looks at); None when binary. The file is read in
    blocks of ``_PIECE_BYTES`` and the window's edges found with C calls (``bytes.split``,
    ``bytes.count``), never line by line in Python: a 40-line file took about 80 Python frames,
    a 20,000-line one 40,000. With ``limit``: :class:`_OverLimitError` once the reads return
    more bytes (a file that grew since it was opened: :func:`_open_for_reading` checked its
    size then)."""
    if looks_binary(handle.read(BINARY_SNIFF_BYTES)):
        return None
    handle.seek(0)
    hasher = hashlib.sha256()
    kept = bytearray()
    selected_bytes = newlines = 0
    last_byte = b""
    read = 0
    for block in iter(partial(handle.read, _PIECE_BYTES), b""):
        read += len(block)
        if limit is not None and read > limit:
            raise _OverLimitError
        hasher.update(block)
        start, end = _window_in_block(block, newlines, window)
        if end > start:
            selected_bytes += end - start
            room = keep_bytes + 1 - len(kept)
            if room > 0:
                kept += block[start : min(end, start + room)]
        newlines += block.count(b"\n")
        last_byte = block[-1:]
    total_lines = newlines + (1 if last_byte not in (b"", b"\n") else 0)
    return _Scan(hasher.hexdigest(), total_lines, bytes(kept), selected_bytes)


def _window_in_block(block: bytes, newlines_before: int, window: _LineWindow) -> tuple[int, int]:
    """The offsets in ``block`` of the window's bytes, ``newlines_before`` newlines having come
    before it (its first byte is on line ``newlines_before + 1``)."""
    start = _after_newline(block, window.first - 1 - newlines_before)
    if window.last is None:
        return start, len(block)
    return start, _after_newline(block, window.last - newlines_before)


def _after_newline(block: bytes, count: int) -> int:
    """The offset just past the ``count``-th newline of ``block``: 0 when ``count`` <= 0, the
    block's length when it has fewer newlines."""
    if count <= 0:
        return 0
    if count >= len(block):  # more newlines than bytes: none so far (and a bounded split)
        return len(block)
    pieces = block.split(b"\n", count)
    return len(block) - len(pieces[-1]) if len(pieces) > count else len(block)


def _read_file(
    arguments: Mapping[str, Any], context: ToolContext, limit: int | None = None
) -> ToolOutput:
    window = _line_window(arguments)
    if isinstance(window, str):
        return error_output(f"file_read: {window}", error_type="invalid_arguments", kind="read")
    try:
        return attempts(lambda: _read_once(str(arguments["path"]), window, context, limit))
    except WorkspacePathError as exc:
        return path_failure(exc, kind="read")


def _read_once(
    user_path: str, window: _LineWindow, context: ToolContext, limit: int | None = None
) -> ToolOutput:
    target = check_path(context.workspace, user_path, reuse=True)
    rel = target.rel
    try:
        fd = _open_for_reading(target, limit)
        if isinstance(fd, ToolOutput):
            return fd
        with os.fdopen(fd, "rb") as handle:
            scan = _scan(handle, window, context.max_output_bytes, limit)
    except (FileNotFoundError, NotADirectoryError):
        return _read_refusal(rel, "not_found")
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


def _open_for_reading(target: CheckedPath, limit: int | None = None) -> int | ToolOutput:
    """A descriptor of the regular file at ``target``, or the refusal to read it;
    :class:`_OverLimitError` when it has more than ``limit`` bytes as opened."""
    if not target.parts:
        return _read_refusal(target.rel, "is_directory")
    with directory_fd(target, -1) as parent:
        name = target.parts[-1]
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            raise target.changed()
        refusal = _refusal_for(target.rel, info)
        if refusal is not None:
            return refusal
        fd = open_file_at(parent, name, os.O_RDONLY | os.O_NONBLOCK, target)
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
        os.close(fd)
        raise target.changed()
    if limit is not None and opened.st_size > limit:
        os.close(fd)
        raise _OverLimitError
    return fd


def _refusal_for(rel: str, info: os.stat_result) -> ToolOutput | None:
    if stat.S_ISDIR(info.st_mode):
        return _read_refusal(rel, "is_directory")
    if not stat.S_ISREG(info.st_mode):
        return _read_refusal(rel, "not_a_file")
    if info.st_nlink > 1:
        return error_output(
            f"{rel!r} has {info.st_nlink} hard links, and the other names of a file may be "
            "outside the workspace, so file_read refuses it; copy it (cp) instead of linking "
            "it (ln) to read it",
            error_type="hard_linked",
            kind="read",
            path=rel,
        )
    return None


_READ_REFUSALS = {
    "is_directory": "{rel!r} is a directory; use file_list to see its entries",
    "not_found": "file {rel!r} does not exist; use file_list to find the right name",
    "not_a_file": "{rel!r} is not a regular file (a pipe, socket or device); file_read reads files",
}


def _read_refusal(rel: str, error_type: str) -> ToolOutput:
    message = _READ_REFUSALS[error_type].format(rel=rel)
    return error_output(message, error_type=error_type, kind="read", path=rel)


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
    applies_once = True
    """A second delivery of the same call (same idempotency key) is answered with the first
    result and writes nothing (``workers.applied_calls``)."""

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_write_file`` (in a worker thread)."""
        return _write_file(arguments, context)


def _write_file(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    data = str(arguments["content"]).encode("utf-8")
    create_dirs = bool(arguments.get("create_dirs", True))
    try:
        return attempts(lambda: _write_once(str(arguments["path"]), data, context, create_dirs))
    except WorkspacePathError as exc:
        return path_failure(exc, kind="write")


def _write_once(user_path: str, data: bytes, context: ToolContext, create_dirs: bool) -> ToolOutput:
    target = check_path(context.workspace, user_path, reuse=True)
    rel = target.rel
    if not target.parts:
        return _not_a_file_to_write(rel)
    try:
        with directory_fd(target, -1, create=create_dirs) as parent:
            return _write_at(parent, target, data)
    except FileNotFoundError:
        return _missing_parent(target, data)
    except OSError as exc:
        return os_failure("writing", rel, exc, kind="write", path=rel)


def _not_a_file_to_write(rel: str) -> ToolOutput:
    return error_output(
        f"{rel!r} exists and is not a regular file; choose another path",
        error_type="not_a_file",
        kind="write",
        path=rel,
    )


def _missing_parent(target: CheckedPath, data: bytes) -> ToolOutput:
    metadata = _write_metadata(target.rel, "", data, created=True)
    return error_output(
        f"directory {target.parent_rel!r} does not exist; create it or pass create_dirs=true",
        error_type="not_found",
        **metadata,
    )


def _write_metadata(rel: str, before: str, data: bytes, *, created: bool) -> dict[str, str]:
    return {
        "kind": "write",
        "path": rel,
        "before_hash": before,
        "after_hash": sha256_hex(data),
        "created": "true" if created else "false",
    }


def _write_at(parent: int, target: CheckedPath, data: bytes) -> ToolOutput:
    """Write ``data`` to the last name of ``target`` in its open directory ``parent``."""
    rel, name = target.rel, target.parts[-1]
    try:
        info: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise target.changed()
    if info is not None and not stat.S_ISREG(info.st_mode):
        return _not_a_file_to_write(rel)
    linked = info is not None and info.st_nlink > 1
    before = _hash_at(parent, target) if info is not None and not linked else ""
    metadata = _write_metadata(rel, before, data, created=info is None)
    if before and before == metadata["after_hash"]:
        return ToolOutput(
            content=f"{rel} unchanged: it already has this content", metadata=metadata
        )
    mode = stat.S_IMODE(info.st_mode) if info is not None else _NEW_FILE_MODE
    _replace_at(parent, name, data, mode)
    verb = "created" if info is None else "updated"
    if linked:
        verb = "replaced; its other hard links keep the old content"
    return ToolOutput(content=f"wrote {len(data)} bytes to {rel} ({verb})", metadata=metadata)


def _hash_at(parent: int, target: CheckedPath) -> str:
    fd = open_file_at(parent, target.parts[-1], os.O_RDONLY | os.O_NONBLOCK, target)
    with os.fdopen(fd, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _replace_at(parent: int, name: str, data: bytes, mode: int) -> None:
    """Write a temporary file in the directory open at ``parent``, then rename it over
    ``name``; both through the descriptor, so neither can land elsewhere."""
    temporary = f".{name[:_TEMP_NAME_CHARS]}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=parent)
        raise


class FileListTool(BlockingTool):
    """``file_list``: sorted directory entries, never following symbolic links."""

    DEFINITION = FILE_LIST_DEFINITION
    KIND = "read"
    read_only = True

    def work(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
        """Run ``_list_directory`` (in a worker thread)."""
        return _list_directory(arguments, context)


def _label(rel: str, entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return rel + "@"
    return rel + "/" if entry.is_dir(follow_symlinks=False) else rel


def _list_directory(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    try:
        return attempts(lambda: _list_once(arguments, context))
    except WorkspacePathError as exc:
        return path_failure(exc, kind="read")


def _list_once(arguments: Mapping[str, Any], context: ToolContext) -> ToolOutput:
    directory = check_path(context.workspace, str(arguments.get("path", ".")), reuse=True)
    rel = directory.rel
    limit = int(arguments.get("max_entries", _DEFAULT_MAX_ENTRIES))
    recursive = bool(arguments.get("recursive", False))
    try:
        with directory_fd(directory) as fd:
            labels = _labels(fd, rel, recursive=recursive, limit=limit)
    except FileNotFoundError:
        return _not_a_directory(rel, "missing")
    except NotADirectoryError:
        return _not_a_directory(rel, "a file; use file_read")
    except OSError as exc:  # a name too long, a permission denied on a parent...
        return os_failure("listing", rel, exc, kind="read", path=rel)
    listing = "\n".join(labels) if labels else f"[{rel} is empty]"
    metadata = {
        "kind": "read",
        "path": rel,
        "content_hash": sha256_hex(listing.encode("utf-8")),
        "entries": str(min(len(labels), limit)),
    }
    content = cap_text(listing, context.max_output_bytes, hint="list a subdirectory")
    return ToolOutput(content=content, metadata=metadata)


def _labels(fd: int, rel: str, *, recursive: bool, limit: int) -> list[str]:
    labels: list[str] = []
    for entry_rel, entry in walk_at(fd, rel, recursive=recursive):
        if len(labels) == limit:
            labels.append(f"[listing stopped after {limit} entries; list a subdirectory]")
            break
        labels.append(_label(entry_rel, entry))
    return labels


def _not_a_directory(rel: str, what: str) -> ToolOutput:
    return error_output(
        f"{rel!r} is not a directory ({what})", error_type="not_found", kind="read", path=rel
    )
