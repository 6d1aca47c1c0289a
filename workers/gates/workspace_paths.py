"""Where a path lands relative to the workspace, for the default gate's containment rules.

With a workspace, paths are joined to the current directory and resolved on the real file
system (symlinks followed, ``..`` collapsed), then compared with the resolved workspace.
Without one, nothing can be resolved: a relative path must not climb above its start, and an
absolute path is outside by definition.
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from workers.tools.errors import WorkspacePathError
from workers.tools.workspace import real_path, real_workspace

__all__ = ["WorkspaceScope"]

_VIRTUAL_ROOT = Path("/<workspace>")


def _real_root(workspace: Path) -> Path:
    """``workspace.resolve()``, through the resolutions the file tools then reuse
    (:func:`~workers.tools.workspace.resolving_once`): its real path, and RuntimeError for a
    workspace that is a symbolic-link loop (as ``Path.resolve`` raises)."""
    root = real_workspace(workspace)
    try:
        root.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RuntimeError(f"Symlink loop from {exc.filename!r}") from exc
    return root


class WorkspaceScope:
    """The workspace (and any extra allowed roots) that paths must stay inside."""

    def __init__(self, workspace: Path | None, extra_roots: Iterable[Path] = ()) -> None:
        self._real = workspace is not None
        self._root = _real_root(workspace) if workspace is not None else _VIRTUAL_ROOT
        self._extra_roots = tuple(root.resolve() for root in extra_roots)

    @property
    def root(self) -> Path:
        """The resolved workspace (a placeholder path when no workspace is set)."""
        return self._root

    def locate(self, raw: str, base: Path | None = None) -> Path:
        """Where ``raw`` lands from ``base`` (the workspace by default).

        Raises OSError, ValueError or RuntimeError when the path cannot be resolved (a NUL
        byte, a symlink loop).
        """
        joined = (base or self._root) / raw
        if self._real:
            # The file tools' own resolution: realpath repeated, so a symlink loop such as
            # ``loop/../link_out`` cannot hide a link that points out of the workspace.
            return real_path(joined, raw)
        return Path(posixpath.normpath(str(joined)))

    def escape(self, raw: str, base: Path | None = None) -> str | None:
        """None when ``raw`` stays inside; otherwise why it does not (for a denial reason)."""
        try:
            located = self.locate(raw, base)
        except (OSError, ValueError, RuntimeError, WorkspacePathError) as exc:
            return f"cannot be resolved ({exc})"
        if self.contains(located):
            return None
        if not self._real:
            return self._explain_without_workspace(raw)
        return f"resolves to {located}, outside the workspace {self._root}"

    def contains(self, path: Path) -> bool:
        """Whether a located path is the workspace, inside it, or inside an extra root."""
        return any(path.is_relative_to(root) for root in (self._root, *self._extra_roots))

    @staticmethod
    def _explain_without_workspace(raw: str) -> str:
        if PurePosixPath(raw).is_absolute():
            return "is an absolute path, and no workspace is set to check it against"
        return "climbs out of the working directory"
