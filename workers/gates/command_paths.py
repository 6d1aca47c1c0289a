"""Best-effort check that a shell command stays in the workspace: ``cd`` and write targets.

The command (already passed through :func:`~workers.gates.command_rules.normalise_command`) is
split into simple commands, read in order. ``cd``/``pushd`` move a tracked working directory;
``>``, ``>>``, ``&>`` redirections and ``tee`` arguments are write targets, resolved from that
directory. A target under ``~`` or ``$HOME`` is outside; a target holding another variable, a
glob or a command substitution cannot be known and is not judged. ``/dev/null``,
``/dev/stdout``, ``/dev/stderr``, ``/dev/tty`` and ``/dev/fd/N`` are always fine as targets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from workers.gates.workspace_paths import WorkspaceScope

__all__ = ["CommandEscape", "find_command_escape"]

_SEGMENT_SPLIT = re.compile(r"&&|\|\||\$\(|[;&|(){}`]")
_REDIRECT = re.compile(r"(?<![<>])(?:\d+|&)?>{1,2}(?![&(])\s*(?P<target>[^\s;&|()<>{}`]+)")
_HARMLESS_TARGET = re.compile(r"/dev/(?:null|stdout|stderr|tty|fd/\d+)")
_HOME = re.compile(r"(?:~|\$HOME\b|\$\{HOME\})")
_UNKNOWABLE = re.compile(r"[$`*?\[]")
_PREFIX_WORDS = frozenset({"sudo", "doas", "builtin", "command", "exec", "nohup", "time"})
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


@dataclass(frozen=True, slots=True)
class CommandEscape:
    """A target outside the workspace: what the command does with it, and why it is outside."""

    action: str
    target: str
    explanation: str


def find_command_escape(
    normalised_command: str, scope: WorkspaceScope, start: Path | None = None
) -> CommandEscape | None:
    """The first ``cd`` or write target outside the scope, or None.

    ``start`` is the directory the command runs in (the workspace by default).
    """
    cwd = start or scope.root
    for segment in _SEGMENT_SPLIT.split(normalised_command):
        words = _command_words(segment)
        if words and words[0] in ("cd", "pushd"):
            target = _cd_target(words)
            escape = _judge(target, cwd, scope, "changes directory to")
            if escape is not None:
                return escape
            if not _UNKNOWABLE.search(target) and target != "-":
                cwd = scope.locate(target, cwd)
        for target in _write_targets(segment, words):
            escape = _judge(target, cwd, scope, "writes to")
            if escape is not None:
                return escape
    return None


def _command_words(segment: str) -> list[str]:
    """The words of a simple command, without leading ``sudo``-like words and assignments."""
    words = segment.split()
    while words and (words[0] in _PREFIX_WORDS or _ASSIGNMENT.match(words[0])):
        words.pop(0)
    return words


def _cd_target(words: list[str]) -> str:
    operands = [w for w in words[1:] if not w.startswith("-") or w == "-"]
    return operands[0] if operands else "~"


def _write_targets(segment: str, words: list[str]) -> list[str]:
    targets = [m.group("target") for m in _REDIRECT.finditer(segment)]
    if words and words[0] == "tee":
        targets += [w for w in words[1:] if not w.startswith("-") and ">" not in w]
    return targets


def _judge(target: str, cwd: Path, scope: WorkspaceScope, action: str) -> CommandEscape | None:
    if target == "-" or _HARMLESS_TARGET.fullmatch(target):
        return None
    if _HOME.match(target):
        return CommandEscape(action, target, "is in the home directory, outside the workspace")
    if _UNKNOWABLE.search(target):
        return None
    explanation = scope.escape(target, cwd)
    return None if explanation is None else CommandEscape(action, target, explanation)
