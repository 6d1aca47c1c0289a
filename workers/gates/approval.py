"""``require_approval`` rules of the default gate: which tool calls a human approves first.

A rule is ``<tool>:<glob>``:

- ``<tool>`` selects the tool: a glob over the tool's name (``run_command``, ``file_*``,
  ``github__*``), or the kind ``mcp``, which selects every MCP tool: those named
  ``<server>__<tool>`` (a double underscore), whatever their server;
- ``<glob>`` (``fnmatch`` syntax, case-sensitive, ``*`` crosses spaces and slashes) is matched
  against the call's *canonical argument string*:

  - a command tool (``run_command``): the command as the deny-list reads it (whitespace
    collapsed, quotes removed: :func:`~workers.gates.command_rules.normalise_command`), and also
    each simple command of it, split at ``;``, ``&&``, ``||``, ``|``, ``&``, newlines, subshells
    ``( … )``, groups ``{ …; }``, ``$( … )`` and backticks, and each *normalised*
    (:func:`simple_command`): leading wrappers dropped (``sudo [opts]``, ``env [opts] [VAR=x]``,
    ``VAR=x``, ``command``, ``exec``, ``nice``, ``nohup``, ``timeout N``, ``time``, ``doas``,
    ``stdbuf``, ``ionice``), the program's path reduced to its base name (``/usr/bin/git`` is
    ``git``), ``sh|bash|zsh|dash|ksh -c "…"`` read as the code it runs, and git's global options
    before the subcommand dropped (``-C dir``, ``-c k=v``, ``--git-dir=…``, ``--work-tree=…``).
    So ``run_command:git push*`` asks about ``cd repo && git push origin main``,
    ``sudo git push``, ``bash -c "git push"``, ``$(git push)`` and ``git -C repo push`` too.
    This is a guard rail against an agent's mistakes, not a sandbox boundary: a command the
    line does not spell out (a script file that runs ``git push``, an alias, ``eval $X``,
    ``python -c``) is not seen;
  - a file tool (``file_read``, ``file_write``, ``file_list``, ``grep``): its path argument;
  - any other tool: its arguments as compact JSON with sorted keys
    (``{"owner":"me","repo":"x"}``).

  ``*`` alone matches every call of the tool (also one with no arguments).

The first rule that matches gives the :class:`~shared.actions.Ask` reason, naming the rule.
Rules are checked after the deny rules: a call a deny rule refuses is refused, not asked about.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shared.actions import ToolCallAction
from workers.gates.command_rules import normalise_command

__all__ = [
    "APPROVAL_RULE",
    "MCP_KIND",
    "ApprovalRule",
    "ApprovalRules",
    "canonical_arguments",
    "simple_command",
]

APPROVAL_RULE = "require-approval"
MCP_KIND = "mcp"
_SEPARATORS = re.compile(r"\|\||&&|\$\(|[;|&\n(){}`]")
# Wrappers that run the rest of the line as a command, with the options that take a value.
_WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset(("-u", "-g", "-C", "-h", "-p", "-U", "-r", "-t", "-D", "-R", "-T")),
    "doas": frozenset(("-u", "-C")),
    "env": frozenset(("-u", "-C", "-S", "--unset", "--chdir", "--split-string")),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset(("-a",)),
    "nice": frozenset(("-n", "--adjustment")),
    "nohup": frozenset(),
    "time": frozenset(("-f", "-o", "--format", "--output")),
    "timeout": frozenset(("-s", "-k", "--signal", "--kill-after")),
    "stdbuf": frozenset(("-i", "-o", "-e")),
    "ionice": frozenset(("-c", "-n", "-p", "-P", "-u")),
}
_TAKES_DURATION = frozenset(("timeout",))
_SHELLS = frozenset(("sh", "bash", "zsh", "dash", "ksh", "ash", "fish"))
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_GIT_OPTIONS_WITH_VALUE = frozenset(("-C", "-c", "--git-dir", "--work-tree", "--namespace"))
_SHOWN_CHARS = 200


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """One ``<tool>:<glob>`` rule."""

    text: str
    tool: str
    glob: str

    @classmethod
    def parse(cls, text: str) -> ApprovalRule:
        """The rule written ``<tool>:<glob>`` (the policy's validator checked the form)."""
        tool, _, glob = text.partition(":")
        return cls(text=text, tool=tool.strip(), glob=glob)

    def selects(self, name: str) -> bool:
        """The rule is about the tool ``name``."""
        if self.tool == MCP_KIND:
            return "__" in name.strip("_")
        return fnmatch.fnmatchcase(name, self.tool)

    def matches(self, candidates: Iterable[str]) -> bool:
        """One of the call's canonical argument strings matches the glob."""
        return any(fnmatch.fnmatchcase(text, self.glob) for text in candidates)


class ApprovalRules:
    """The ``require_approval`` rules of a gate, checked in order."""

    def __init__(
        self, rules: Iterable[str], command_tools: Iterable[str], file_tools: Iterable[str]
    ) -> None:
        self._rules = tuple(ApprovalRule.parse(text) for text in rules)
        self._command_tools = frozenset(command_tools)
        self._file_tools = frozenset(file_tools)

    def __bool__(self) -> bool:
        return bool(self._rules)

    def reason(self, action: ToolCallAction) -> str | None:
        """Why the call needs a human's approval (the first rule that matches), or None."""
        selecting = [rule for rule in self._rules if rule.selects(action.name)]
        if not selecting:
            return None
        candidates = self.canonical(action)
        for rule in selecting:
            if rule.matches(candidates):
                shown = _show(candidates[0])
                return (
                    f"rule '{APPROVAL_RULE}' ({rule.text!r}) holds {action.name} {shown} "
                    "for a reviewer's approval"
                )
        return None

    def canonical(self, action: ToolCallAction) -> list[str]:
        """The call's canonical argument strings: the whole first, then its parts."""
        try:
            arguments = action.parsed_arguments()
        except ValueError:
            return [action.arguments]
        return canonical_arguments(action.name, arguments, self._command_tools, self._file_tools)


def canonical_arguments(
    name: str,
    arguments: dict[str, Any],
    command_tools: Iterable[str] = ("run_command",),
    file_tools: Iterable[str] = ("file_read", "file_write", "file_list", "grep"),
) -> list[str]:
    """The strings a rule's glob is matched against (see the module's docstring)."""
    if name in command_tools:
        command = arguments.get("command")
        if isinstance(command, list) and all(isinstance(p, str) for p in command):
            command = shlex.join(command)
        if isinstance(command, str):
            whole = " ".join(normalise_command(command).split())
            parts: list[str] = []
            for part in _SEPARATORS.split(whole):
                for simple in (" ".join(part.split()), simple_command(part)):
                    if simple and simple != whole and simple not in parts:
                        parts.append(simple)
            return [whole, *parts]
    if name in file_tools:
        for key in ("path", "file_path", "directory"):
            value = arguments.get(key)
            if isinstance(value, str):
                return [value]
    return [json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)]


def simple_command(text: str) -> str:
    """One simple command (no separators left) as a rule reads it: wrappers dropped, the program
    by its base name, ``sh -c`` read as its code, git's global options dropped."""
    words = text.split()
    while words:
        program = words[0].rsplit("/", 1)[-1] or words[0]
        if _ASSIGNMENT.match(words[0]):
            words = words[1:]
        elif program in _WRAPPERS:
            words = _after_wrapper(program, words[1:])
        elif program in _SHELLS and _shell_code(words[1:]) is not None:
            words = _shell_code(words[1:]) or []
        else:
            words = [program, *words[1:]]
            break
    if words and words[0] == "git":
        words = ["git", *_after_git_options(words[1:])]
    return " ".join(words)


def _after_wrapper(wrapper: str, words: list[str]) -> list[str]:
    """The words after a wrapper's own options (and ``timeout``'s duration)."""
    takes_value = _WRAPPERS[wrapper]
    while words and words[0].startswith("-") and words[0] != "-":
        option = words[0]
        words = words[1:]
        if option == "--":
            break
        if option in takes_value and words:
            words = words[1:]
    if wrapper in _TAKES_DURATION and words:
        words = words[1:]
    return words


def _shell_code(words: list[str]) -> list[str] | None:
    """The words after ``-c`` (or ``-xc``) of a shell's options; None when it runs no ``-c``."""
    for index, word in enumerate(words):
        if not word.startswith("-"):
            return None
        if word.startswith("-") and not word.startswith("--") and "c" in word[1:]:
            return words[index + 1 :]
    return None


def _after_git_options(words: list[str]) -> list[str]:
    """git's arguments from the subcommand on (``-C dir``, ``-c k=v``, ``--git-dir=…`` dropped)."""
    while words and words[0].startswith("-"):
        option = words[0]
        words = words[1:]
        if option in _GIT_OPTIONS_WITH_VALUE and words:
            words = words[1:]
    return words


def _show(value: str) -> str:
    shown = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"
    return f"'{shown}'"
