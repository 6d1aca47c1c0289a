"""What a shell command line does, read from its text: a read, a write or another command.

``run_command`` reports every call as ``kind=command``, whatever the line does. The detector
needs to know more: ``find / -name x`` that prints nothing is an empty search (information-free),
while ``cat <<'EOF' > fix.py`` that prints nothing is a write (pending its outcome). The first
word of the line (after leading ``cd X &&`` and ``VAR=x`` prefixes, outside heredoc bodies)
decides, with these rules, the same the trajectory replay uses (``docs/stagnation.md``):

- a **write** anywhere outside heredoc bodies: ``sed -i``, a ``>``/``>>`` redirect to a file (not
  ``/dev/null``, not ``2>&1``), ``tee``, ``rm``, ``mv``, ``cp``, ``mkdir``, ``touch``, ``patch``,
  ``chmod``, ``ln``, ``ed``, ``git apply|checkout|reset|stash|mv|rm``; the path is the redirect
  target if there is one;
- a **read**: ``ls``, ``cat``, ``grep``, ``rg``, ``find``, ``head``, ``tail``, ``pwd``, ``which``,
  ``printenv``, ``env``, ``locate``, ``apt-cache``, ``wc``, ``tree``, ``less``, ``more``, ``nl``,
  ``diff``, ``file``, ``stat``, ``sed`` (without ``-i``), ``awk``,
  ``git status|diff|log|show|grep|blame|ls-files``;
- an empty line is **other**; anything else (``pytest``, ``make``, ``python x.py``) a
  **command**.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.stagnation.events import ToolEvent, ToolKind

__all__ = ["SHELL_READS", "as_shell_event", "first_word", "shell_kind", "strip_heredocs"]

_HEREDOC = re.compile(r"(<<-?\s*(['\"]?)(\w+)\2[^\n]*)\n.*?\n\s*\3[ \t]*(?=\n|$)", re.S)
_PREFIX = re.compile(r"^\s*(?:(?:cd\s+[^\s;&|]+|[A-Z_][A-Z0-9_]*=\S+)\s*(?:&&|;|\n)?\s*)+")
_SHELL_WRITE = (
    re.compile(r"\bsed\s+(?:-[a-zA-Z]*i\b|--in-place)"),
    re.compile(r"(?<![0-9&<>])>{1,2}\s*(?!&|/dev/null)[^\s|;&<>]+"),
    re.compile(r"\btee\b"),
    re.compile(r"(?:^|&&|;|\|\||\n)\s*(?:rm|mv|cp|mkdir|touch|patch|chmod|ln|ed)\b"),
    re.compile(r"\bgit\s+(?:apply|checkout|reset|stash|mv|rm)\b"),
)
_REDIRECT_TARGET = re.compile(r"(?<![0-9&<>])>{1,2}\s*(?!&|/dev/null)([^\s|;&<>]+)")
SHELL_READS = frozenset(
    (
        *("ls", "cat", "grep", "rg", "find", "head", "tail", "pwd", "which", "printenv", "env"),
        *("locate", "apt-cache", "wc", "tree", "less", "more", "nl", "diff", "file", "stat"),
        *("sed", "awk"),
    )
)
_READ_GIT = re.compile(r"^git\s+(?:status|diff|log|show|grep|blame|ls-files)\b")


def strip_heredocs(command: str) -> str:
    """The command line with the bodies of its heredocs left out (their ``<<EOF`` kept)."""
    return _HEREDOC.sub(r"\1", command)


def first_word(command: str) -> str:
    """The program the line runs, after ``cd X &&`` and ``VAR=x`` prefixes ("" if none)."""
    words = _PREFIX.sub("", command, count=1).split()
    return words[0] if words else ""


def shell_kind(
    command: str, *, reads: Iterable[str] = SHELL_READS, others: Iterable[str] = ()
) -> tuple[ToolKind, str | None]:
    """read / write / command / other for one shell command line, and the written path.

    ``reads`` and ``others`` name the first words that read and that are *other* (a harness's
    own commands, such as SWE-agent's ``submit``).
    """
    outside = strip_heredocs(command)
    word = first_word(outside)
    if any(pattern.search(outside) for pattern in _SHELL_WRITE):
        target = _REDIRECT_TARGET.search(outside)
        return ToolKind.WRITE, target.group(1) if target else None
    if not word or word in others:
        return ToolKind.OTHER, None
    if word in reads or _READ_GIT.match(_PREFIX.sub("", outside, count=1).strip()):
        return ToolKind.READ, None
    return ToolKind.COMMAND, None


# ``git checkout -b``/``-B``/``--orphan`` makes a branch and ``git stash list``/``show`` reads:
# neither puts a file back.
_RESTORE = re.compile(
    r"\bgit\s+(?:checkout(?!\s+(?:-[bB]|--orphan)\b)|restore|stash(?!\s+(?:list|show)\b)|reset)\b"
)


def is_restore(command: str) -> bool:
    """Whether a shell line puts files back as git has them (``git checkout|restore|stash|
    reset``): a revert, whatever bytes the host saw come back."""
    return _RESTORE.search(strip_heredocs(command)) is not None


def as_shell_event(event: ToolEvent) -> ToolEvent:
    """A ``kind=command`` event of a shell line, re-kinded by what the line does.

    Only events that report the generic ``command`` kind and carry a ``command`` string argument
    (``run_command``'s) are touched: a read stays a command's output judged as a read, a write
    becomes a write whose after-state is what was written and what came back.
    """
    line = event.arguments.get("command")
    if event.kind is not ToolKind.COMMAND or not isinstance(line, str):
        return event
    kind, path = shell_kind(line)
    if kind is ToolKind.READ:
        return event.model_copy(update={"kind": ToolKind.READ})
    if kind is ToolKind.WRITE:
        return event.model_copy(update={"kind": ToolKind.WRITE, "path": path or event.path})
    return event
