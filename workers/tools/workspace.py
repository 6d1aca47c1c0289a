"""Confining file paths to the agent's workspace.

Every file tool resolves its path arguments with :func:`resolve_in_workspace`, which follows
symbolic links the way the operating system will (``os.path.realpath``, repeated until it is
stable, since one call stops at a link loop and leaves the links after it unresolved) and
refuses the result unless it is the workspace itself or lies below it. That covers ``..``
escapes, absolute paths outside the workspace, symbolic links that point out (a link to a file,
a linked parent directory, a dangling link whose target would be created outside, a link
hidden behind a link loop) and NUL bytes. Absolute paths inside the workspace are accepted,
whichever way the workspace itself is spelled.

Limit: the check and the later ``open`` are two system calls, so a process that swaps a
directory for a symbolic link in between could still redirect one call. The agent's own
``run_command`` can do that, but it can also read any file directly: the confinement of the
file tools keeps honest mistakes and injected paths in the workspace; the policy gate and the
operating-system sandbox bound a hostile command.

**Resolving once.** Within :func:`resolving_once` (a reasoning worker's gate and the read-only
calls it then runs itself), each path is resolved once: the default gate resolves a call's
path arguments, and the check of ``file_read``, ``file_write`` and ``file_list``
(:func:`workers.tools.confined.check_path` with ``reuse=True``) takes the same real path
instead of walking the file system again.
Only a path whose resolution met no link is kept (its real path is its lexical normal form);
a path through a link is resolved again, so a link re-pointed between the gate and the tool
leads the tool where a fresh resolution would. That is as strong as resolving again: the kept
path is then opened one component at a time from the root without following a link, so a tree
that changed since (a link put in its way) is met as a link, and the call then forgets what was
resolved and checks afresh (:func:`~workers.tools.confined.attempts`). Outside that scope,
and for any other caller (``grep``, which walks the directory it checked by path), every call
resolves.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from workers.tools.errors import PathOutsideWorkspaceError, WorkspacePathError

__all__ = [
    "check_identity",
    "display_path",
    "expected_identity",
    "expecting_workspace",
    "forget_resolutions",
    "real_path",
    "real_workspace",
    "resolve_in_workspace",
    "resolving_once",
    "sorted_entries",
    "walk_entries",
    "workspace_root",
]


_resolved: ContextVar[dict[str, Path] | None] = ContextVar("orga_resolved_paths", default=None)
"""Within :func:`resolving_once`: path as given → its real path (links followed)."""


@contextmanager
def resolving_once() -> Iterator[None]:
    """Within: the real paths resolved are remembered for the checks that reuse them."""
    token = _resolved.set({})
    try:
        yield
    finally:
        _resolved.reset(token)


_expected: ContextVar[tuple[int, int] | None] = ContextVar("orga_workspace_identity", default=None)
"""Within :func:`expecting_workspace`: the (device, inode) the workspace root must have."""


@contextmanager
def expecting_workspace(identity: tuple[int, int] | None) -> Iterator[None]:
    """Within: every workspace root a tool opens must be the folder of this ``(device,
    inode)``, the one checked when the call started (a sub-agent's, :mod:`workers.workspaces`):
    a folder swapped for a link or another folder between that check and the tool's own open
    is refused instead of used."""
    token = _expected.set(identity)
    try:
        yield
    finally:
        _expected.reset(token)


def expected_identity() -> tuple[int, int] | None:
    """The (device, inode) set by :func:`expecting_workspace` (None: any root)."""
    return _expected.get()


def check_identity(root: Path | str, status: os.stat_result) -> None:
    """Raise WorkspacePathError when ``status`` (of the workspace root ``root`` as opened) is
    not the folder :func:`expecting_workspace` expects."""
    expected = _expected.get()
    if expected is not None and (status.st_dev, status.st_ino) != expected:
        raise WorkspacePathError(
            f"workspace {str(root)!r} is not the folder checked when this call started (it was "
            "replaced meanwhile, by a link or another folder); the call is refused rather than "
            "run outside the workspace. Leave the sub-agents' folders to the runtime"
        )


def forget_resolutions() -> None:
    """Forget what the current :func:`resolving_once` scope resolved (the tree changed)."""
    resolved = _resolved.get()
    if resolved is not None:
        resolved.clear()


def _remembered(path: Path, reuse: bool) -> Path | None:
    resolved = _resolved.get()
    return resolved.get(str(path)) if reuse and resolved is not None else None


def _remember(path: Path, real: Path) -> Path:
    """Keep ``real`` for ``path`` within :func:`resolving_once`, only when resolving it met no
    link (it is the path's lexical normal form): a link inside the workspace re-pointed
    between the gate and the tool must lead the tool to its new target, as a fresh resolution
    would."""
    resolved = _resolved.get()
    if resolved is not None and os.path.normpath(path) == str(real):
        resolved[str(path)] = real
    return real


def real_workspace(workspace: Path, *, reuse: bool = False) -> Path:
    """``os.path.realpath`` of the workspace (remembered within :func:`resolving_once`;
    ``reuse`` takes what was remembered)."""
    return _remembered(workspace, reuse) or _remember(workspace, Path(os.path.realpath(workspace)))


def workspace_root(workspace: Path, *, reuse: bool = False) -> Path:
    """The real path of the workspace; raises WorkspacePathError when it is not a directory."""
    root = real_workspace(workspace, reuse=reuse)
    try:
        status = root.stat()
    except OSError:
        status = None
    if status is None or not stat.S_ISDIR(status.st_mode):
        raise WorkspacePathError(
            f"workspace {str(workspace)!r} is not an existing directory; "
            "create it before running tools in it"
        )
    check_identity(workspace, status)
    return root


def resolve_in_workspace(workspace: Path, user_path: str) -> Path:
    """The real absolute path ``user_path`` designates, guaranteed inside ``workspace``.

    Relative paths are taken from the workspace. Raises PathOutsideWorkspaceError for anything
    that resolves outside it, and WorkspacePathError for a path containing a NUL byte.
    """
    return resolve_below(workspace_root(workspace), user_path)


def resolve_below(root: Path, user_path: str, *, reuse: bool = False) -> Path:
    """:func:`resolve_in_workspace` for the workspace's real path ``root`` (``reuse``: take a
    real path remembered within :func:`resolving_once`)."""
    if "\x00" in user_path:
        raise WorkspacePathError(
            f"path {user_path!r} contains a NUL byte; file names cannot contain NUL"
        )
    candidate = Path(user_path) if os.path.isabs(user_path) else root / user_path
    resolved = real_path(candidate, user_path, reuse=reuse)
    if not resolved.is_relative_to(root):
        raise PathOutsideWorkspaceError(_outside_message(user_path, root, candidate, resolved))
    return resolved


_MAX_RESOLUTIONS = 16


def real_path(candidate: Path, user_path: str, *, reuse: bool = False) -> Path:
    """``os.path.realpath`` repeated until it no longer changes the path (remembered within
    :func:`resolving_once`; ``reuse`` takes what was remembered).

    One call is not enough: at a symbolic-link loop ``realpath`` stops resolving and returns
    the rest of the path as written, then drops ``loop/..`` lexically, so in
    ``loop/../link_out/secret`` the link ``link_out`` would never be resolved. The next call
    resolves what the first left; a path that is its own ``realpath`` has no link left to
    follow outside a loop the system itself refuses to cross.
    """
    remembered = _remembered(candidate, reuse)
    if remembered is not None:
        return remembered
    current = Path(os.path.realpath(candidate))
    for _ in range(_MAX_RESOLUTIONS):
        again = Path(os.path.realpath(current))
        if again == current:
            return _remember(candidate, current)
        current = again
    raise WorkspacePathError(
        f"path {user_path!r} cannot be resolved: it goes through symbolic links that keep "
        "pointing elsewhere (a loop); remove the loop or use another path"
    )


def display_path(root: Path, resolved: Path) -> str:
    """``resolved`` relative to the workspace ``root``, with ``/`` separators (``.`` for root)."""
    return resolved.relative_to(root).as_posix()


def _outside_message(user_path: str, root: Path, candidate: Path, resolved: Path) -> str:
    lexical = Path(os.path.normpath(candidate))
    how = " through a symbolic link" if lexical.is_relative_to(root) else ""
    return (
        f"path {user_path!r} is outside the workspace {str(root)!r}: it resolves{how} to "
        f"{str(resolved)!r}; use a path inside the workspace, relative to it"
    )


def sorted_entries(directory: Path) -> list[os.DirEntry[str]]:
    """The entries of ``directory`` sorted by name; empty when it cannot be read."""
    try:
        with os.scandir(directory) as scanner:
            return sorted(scanner, key=lambda entry: entry.name)
    except OSError:
        return []


def walk_entries(directory: Path, *, recursive: bool) -> Iterator[os.DirEntry[str]]:
    """Entries depth-first in sorted order; symbolic links are yielded but never entered."""
    stack = [iter(sorted_entries(directory))]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        yield entry
        if recursive and entry.is_dir(follow_symlinks=False):
            stack.append(iter(sorted_entries(Path(entry.path))))
