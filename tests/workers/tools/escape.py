"""A workspace with a canary beside it, for the tests of file tools that must not escape it."""

from __future__ import annotations

from pathlib import Path

CANARY = "CANARY-outside-the-workspace"


def escape_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace with ``sub/secret.txt``, and beside it ``outside/secret.txt`` (the canary):
    ``(workspace, outside)``."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text(CANARY + "\n")
    (workspace / "sub" / "secret.txt").write_text("inside\n")
    return workspace, outside
