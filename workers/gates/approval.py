"""``require_approval`` rules of the default gate: which tool calls a human approves first.

A rule is ``<tool>:<glob>``:

- ``<tool>`` selects the tool: a glob over the tool's name (``run_command``, ``file_*``,
  ``github__*``), or the kind ``mcp``, which selects every MCP tool: those named
  ``<server>__<tool>`` (a double underscore), whatever their server;
- ``<glob>`` (``fnmatch`` syntax, case-sensitive, ``*`` crosses spaces and slashes) is matched
  against the call's *canonical argument string*:

  - a command tool (``run_command``): the command as the deny-list reads it (whitespace
    collapsed, quotes removed: :func:`~workers.gates.command_rules.normalise_command`), and also
    each simple command of it (split at ``;``, ``&&``, ``||``, ``|``, ``&`` and newlines), so
    ``run_command:git push*`` asks about ``cd repo && git push origin main`` too;
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

__all__ = ["APPROVAL_RULE", "MCP_KIND", "ApprovalRule", "ApprovalRules", "canonical_arguments"]

APPROVAL_RULE = "require-approval"
MCP_KIND = "mcp"
_SEPARATORS = re.compile(r"\|\||&&|[;|&\n]")
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
            parts = [" ".join(p.split()) for p in _SEPARATORS.split(whole)]
            return [whole, *(p for p in parts if p and p != whole)]
    if name in file_tools:
        for key in ("path", "file_path", "directory"):
            value = arguments.get(key)
            if isinstance(value, str):
                return [value]
    return [json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)]


def _show(value: str) -> str:
    shown = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"
    return f"'{shown}'"
