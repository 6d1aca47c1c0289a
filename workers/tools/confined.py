"""Opening a checked workspace path so that no symbolic link, even one swapped in after the
check, can take the open, a created file or a rename outside the workspace.

:func:`~workers.tools.workspace.resolve_in_workspace` *checks* a path: it resolves links the way
the system does and refuses a result outside the workspace. A command running beside the tool
can swap a directory for a link between that check and the ``open``. So the file tools *open*
the checked path from a descriptor of the workspace root, one component at a time, with
``O_NOFOLLOW`` (``openat(dir_fd, name, O_DIRECTORY | O_NOFOLLOW)`` for each directory,
``O_NOFOLLOW`` for the file), and create temporary files and rename them through the
descriptor of their directory. The checked path has no link left in it, so meeting one means the
tree changed after the check: the call checks again and retries (:func:`attempts`), and says so
if the tree keeps changing. Whatever happens to the names meanwhile, every descriptor is a
directory reached from the root through real entries, so nothing is read, created or replaced
outside the workspace. (A command that can write outside the workspace could *move* a directory
out while a tool holds it; it could also write there itself.)

**Hard links.** A regular file with more than one link may be the same file as one outside the
workspace (a command can ``ln`` any file it may read into the workspace), and nothing on the
inode says where its other names are. So a regular file whose link count is above 1 is not read
(``file_read`` refuses it, ``grep`` skips it) and not hashed; ``file_write`` replaces the name
with a new file, which leaves the other names with the old content. Copy a file instead of
linking it to make it readable.

**Size.** A checked path has at most :data:`MAX_PATH_COMPONENTS` components and
:data:`MAX_PATH_BYTES` bytes below the workspace; a longer one is refused as too long (it made
``file_write`` recurse until ``RecursionError``). Every walk here is iterative.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from workers.tools.errors import WorkspacePathError
from workers.tools.workspace import (
    check_identity,
    forget_resolutions,
    resolve_below,
    workspace_root,
)

__all__ = [
    "MAX_LIST_DEPTH",
    "MAX_PATH_BYTES",
    "MAX_PATH_COMPONENTS",
    "CheckedPath",
    "PathChangedError",
    "attempts",
    "check_path",
    "directory_fd",
    "open_file_at",
    "open_for_search",
    "walk_at",
]

MAX_PATH_COMPONENTS = 256
MAX_PATH_BYTES = 4096
MAX_LIST_DEPTH = 64
"""A recursive listing enters at most this many levels (one open descriptor each)."""
_ATTEMPTS = 3
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
_SHOWN_CHARS = 120

_T = TypeVar("_T")


class PathChangedError(WorkspacePathError):
    """A symbolic link appeared on a checked path before it was opened (the tree changed)."""


@dataclass(frozen=True, slots=True)
class CheckedPath:
    """A path checked inside the workspace: the real root and the components below it."""

    root: Path
    parts: tuple[str, ...]
    user_path: str

    @property
    def rel(self) -> str:
        """Workspace-relative, with ``/`` separators; ``.`` for the root."""
        return "/".join(self.parts) or "."

    @property
    def absolute(self) -> Path:
        """The real absolute path (for messages and path-based callers)."""
        return self.root.joinpath(*self.parts)

    @property
    def parent_rel(self) -> str:
        """The parent directory, workspace-relative."""
        return "/".join(self.parts[:-1]) or "."

    def changed(self) -> PathChangedError:
        """The error for a link met on this path after the check."""
        return PathChangedError(
            f"path {_shown(self.user_path)!r} changed while it was being opened: a symbolic "
            "link appeared where the check found a directory or file; try again once the "
            "workspace stops changing"
        )


def _shown(user_path: str) -> str:
    if len(user_path) <= _SHOWN_CHARS:
        return user_path
    return f"{user_path[:_SHOWN_CHARS]}... ({len(user_path)} characters)"


def check_path(workspace: Path, user_path: str, *, reuse: bool = False) -> CheckedPath:
    """Check ``user_path`` (see ``resolve_in_workspace``) and bound its size.

    ``reuse``: take the real paths resolved within
    :func:`~workers.tools.workspace.resolving_once`, for a caller that opens the result
    without following links and runs under :func:`attempts` (which checks afresh when the open
    meets a link). Raises WorkspacePathError (PathOutsideWorkspaceError for a path that leads
    out).
    """
    root = workspace_root(workspace, reuse=reuse)
    try:
        parts = resolve_below(root, user_path, reuse=reuse).relative_to(root).parts
    except OSError as exc:  # a link replaced between its lstat and its readlink
        raise CheckedPath(root, (), user_path).changed() from exc
    size = len("/".join(parts).encode("utf-8", "surrogateescape"))
    if len(parts) > MAX_PATH_COMPONENTS or size > MAX_PATH_BYTES:
        raise WorkspacePathError(
            f"path {_shown(user_path)!r} is too long: {len(parts)} components and {size} "
            f"bytes below the workspace, at most {MAX_PATH_COMPONENTS} components and "
            f"{MAX_PATH_BYTES} bytes are accepted; use a shorter path"
        )
    return CheckedPath(root, parts, user_path)


def attempts(action: Callable[[], _T]) -> _T:
    """Run ``action`` (which checks and opens a path) again when the path changed under it,
    with the real paths resolved before forgotten (so the check walks the tree again)."""
    for _ in range(_ATTEMPTS - 1):
        try:
            return action()
        except PathChangedError:
            forget_resolutions()
            continue
    return action()


def _link_or_directory_at(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is now a link or a directory: either way, not the file that made the
    directory open fail, so the entry changed meanwhile."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return False
    return stat.S_ISLNK(mode) or stat.S_ISDIR(mode)


def _open_directory_at(dir_fd: int, name: str, path: CheckedPath, *, create: bool) -> int:
    """The descriptor of directory ``name`` in ``dir_fd``, never through a link."""
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS or _link_or_directory_at(dir_fd, name):
            raise path.changed() from exc
        raise
    with suppress(FileExistsError):
        os.mkdir(name, 0o777, dir_fd=dir_fd)
    return _open_directory_at(dir_fd, name, path, create=False)


@contextmanager
def directory_fd(
    path: CheckedPath, depth: int | None = None, *, create: bool = False
) -> Iterator[int]:
    """A descriptor of the directory made of the first ``depth`` components of ``path`` (all
    by default), opened component by component from the root without following a link;
    missing directories are made when ``create``.

    Raises PathChangedError for a link on the way, FileNotFoundError for a missing directory,
    NotADirectoryError for a component that is a file.
    """
    parts = path.parts if depth is None else path.parts[:depth]
    fd = os.open(path.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_identity(path.root, os.fstat(fd))
        for name in parts:
            child = _open_directory_at(fd, name, path, create=create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def open_file_at(dir_fd: int, name: str, flags: int, path: CheckedPath, mode: int = 0o600) -> int:
    """``openat`` with ``O_NOFOLLOW``: a link in place of the file is a PathChangedError."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise path.changed() from exc
        raise


def open_for_search(root: Path, file: Path) -> BinaryIO:
    """Open ``file`` (a path below the real ``root``, with no link in it) to read it, or raise
    OSError: for a link on the way, a file that is not regular, or one with several links."""
    if not file.is_relative_to(root):
        raise OSError(errno.EXDEV, "not below the workspace", str(file))
    path = CheckedPath(root, file.relative_to(root).parts, str(file))
    if not path.parts:
        raise IsADirectoryError(errno.EISDIR, "the workspace is a directory", str(file))
    try:
        with directory_fd(path, -1) as parent:
            fd = open_file_at(parent, path.parts[-1], os.O_RDONLY | os.O_NONBLOCK, path)
    except PathChangedError as exc:
        raise OSError(errno.ELOOP, "a symbolic link appeared on the path", str(file)) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(file))
        if info.st_nlink > 1:
            raise OSError(errno.EMLINK, "has several hard links", str(file))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _sorted_at(dir_fd: int) -> list[os.DirEntry[str]]:
    """The entries of the directory open at ``dir_fd``, by name; empty when unreadable."""
    try:
        with os.scandir(dir_fd) as scanner:
            return sorted(scanner, key=lambda entry: entry.name)
    except OSError:
        return []


def _subdirectory_at(dir_fd: int, name: str) -> int | None:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None


@dataclass(slots=True)
class _Level:
    fd: int
    rel: str
    entries: Iterator[os.DirEntry[str]]


def walk_at(dir_fd: int, rel: str, *, recursive: bool) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """``(workspace-relative path, entry)`` of the directory open at ``dir_fd`` (at ``rel``),
    depth-first in sorted order; links are yielded but never entered, nor directories deeper
    than :data:`MAX_LIST_DEPTH` levels. ``dir_fd`` stays the caller's."""
    stack = [_Level(dir_fd, rel, iter(_sorted_at(dir_fd)))]
    try:
        while stack:
            level = stack[-1]
            entry = next(level.entries, None)
            if entry is None:
                _close_level(stack.pop(), dir_fd)
                continue
            entry_rel = entry.name if level.rel == "." else f"{level.rel}/{entry.name}"
            yield entry_rel, entry
            if recursive and len(stack) <= MAX_LIST_DEPTH and entry.is_dir(follow_symlinks=False):
                child = _subdirectory_at(level.fd, entry.name)
                if child is not None:
                    stack.append(_Level(child, entry_rel, iter(_sorted_at(child))))
    finally:
        for level in stack:
            _close_level(level, dir_fd)


def _close_level(level: _Level, caller_fd: int) -> None:
    if level.fd != caller_fd:
        os.close(level.fd)
