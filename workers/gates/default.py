"""The default policy gate: sensible rules instead of Symbiont's deny-everything.

Rules, in the order they are checked (the first that fires gives the denial reason, which
names the rule and the offending value):

- ``tool-allow-list``: a tool outside the task's allow-list (``GateContext.allowed_tools``).
- ``workspace-paths``: a path argument of a file tool (``file_read``, ``file_write``,
  ``file_list``, ``grep``) or of a command tool (``cwd``) that lands outside the workspace:
  ``..`` climbing out, an absolute path elsewhere, a symlink pointing out (resolved when a
  workspace is set; without one, absolute paths and climbing paths are refused).
- the command deny-list (:data:`~workers.gates.command_rules.BUILTIN_COMMAND_RULES`, plus
  configured extra patterns) on ``run_command``'s ``command``.
- ``network-upload``: a command that sends local files or its input over the network
  (``curl -d @file``, ``-F x=@file``, ``-T``, ``wget --post-file``, ``nc``, ``socat``,
  ``scp``/``rsync`` to a remote, ``/dev/tcp``, a file piped or redirected into a network
  command); network commands themselves (downloads, installs) are allowed
  (:mod:`workers.gates.network_upload`).
- ``command-workspace-escape``: a command that ``cd``s or writes (``>``, ``>>``, ``tee``)
  outside the workspace, best effort (:mod:`workers.gates.command_paths`).
- ``delegation-depth``: a delegation that would go deeper than ``max_delegation_depth``.

A call no rule denies may still be held for a human: ``require_approval`` rules
(:mod:`workers.gates.approval`, e.g. ``run_command:git push*``, ``mcp:*``) turn it into an
:class:`~shared.actions.Ask`.

Respond and terminate are always allowed. Any rule but the allow-list can be turned off with
``disabled_rules``; ``extra_write_roots`` adds directories (a shared cache, say) that paths
and commands may also use.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from shared.actions import (
    Allow,
    Ask,
    DelegateAction,
    Deny,
    GateDecision,
    ProposedAction,
    ToolCallAction,
)
from workers.gates.approval import ApprovalRules
from workers.gates.base import GateContext
from workers.gates.command_paths import find_command_escape
from workers.gates.command_rules import CommandRule, build_command_rules, normalise_command
from workers.gates.network_upload import NETWORK_UPLOAD, find_upload
from workers.gates.tool_filter import tool_not_allowed_reason
from workers.gates.workspace_paths import WorkspaceScope

__all__ = [
    "COMMAND_TOOLS",
    "DEFAULT_MAX_DELEGATION_DEPTH",
    "FILE_TOOLS",
    "PATH_ARGUMENTS",
    "DefaultPolicyGate",
]

FILE_TOOLS = frozenset({"file_read", "file_write", "file_list", "grep"})
COMMAND_TOOLS = frozenset({"run_command"})
PATH_ARGUMENTS = frozenset(
    {"path", "paths", "file", "files", "file_path", "filename", "directory", "dir", "cwd"}
)
DEFAULT_MAX_DELEGATION_DEPTH = 3

_WORKSPACE_PATHS = "workspace-paths"
_COMMAND_ESCAPE = "command-workspace-escape"
_DELEGATION_DEPTH = "delegation-depth"
_NON_COMMAND_RULES = (_WORKSPACE_PATHS, NETWORK_UPLOAD, _COMMAND_ESCAPE, _DELEGATION_DEPTH)
_SHOWN_CHARS = 200


class DefaultPolicyGate:
    """Allows an agent's normal work in its workspace; denies the destructive and the escaping."""

    def __init__(
        self,
        *,
        extra_deny_patterns: Mapping[str, str] | Iterable[str] = (),
        disabled_rules: Iterable[str] = (),
        max_delegation_depth: int | None = DEFAULT_MAX_DELEGATION_DEPTH,
        extra_write_roots: Iterable[Path] = (),
        file_tools: Iterable[str] = FILE_TOOLS,
        command_tools: Iterable[str] = COMMAND_TOOLS,
        path_arguments: Iterable[str] = PATH_ARGUMENTS,
        require_approval: Iterable[str] = (),
    ) -> None:
        disabled = frozenset(disabled_rules)
        self._rules: tuple[CommandRule, ...] = build_command_rules(
            extra_deny_patterns, disabled, other_rule_names=_NON_COMMAND_RULES
        )
        self._disabled = disabled
        self._max_delegation_depth = max_delegation_depth
        self._extra_roots = tuple(extra_write_roots)
        self._file_tools = frozenset(file_tools)
        self._command_tools = frozenset(command_tools)
        self._path_arguments = frozenset(path_arguments)
        self._approval = ApprovalRules(require_approval, self._command_tools, self._file_tools)

    @property
    def command_rules(self) -> tuple[CommandRule, ...]:
        """The command rules in force (built-in minus disabled, plus extra patterns)."""
        return self._rules

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """Deny with the first rule that fires; otherwise ask when a ``require_approval`` rule
        matches the tool call; otherwise allow."""
        reason = self.denial_reason(action, context)
        if reason is not None:
            return Deny(reason=reason)
        if self._approval and isinstance(action, ToolCallAction):
            asked = self._approval.reason(action)
            if asked is not None:
                return Ask(reason=asked)
        return Allow()

    def denial_reason(self, action: ProposedAction, context: GateContext) -> str | None:
        """Why the action is denied, or None when it is allowed (the synchronous core)."""
        if isinstance(action, ToolCallAction):
            return self._check_tool_call(action, context)
        if isinstance(action, DelegateAction):
            return self._check_delegation(action, context)
        return None

    # -- tool calls ------------------------------------------------------------------------

    def _check_tool_call(self, action: ToolCallAction, context: GateContext) -> str | None:
        allowed = context.allowed_tools
        if allowed is not None and action.name not in allowed:
            listed = ", ".join(sorted(allowed)) or "none"
            return f"{tool_not_allowed_reason(action.name)} (allowed: {listed})"
        is_file_tool = action.name in self._file_tools
        is_command_tool = action.name in self._command_tools
        if not (is_file_tool or is_command_tool):
            return None
        try:
            arguments = action.parsed_arguments()
        except ValueError as exc:
            return f"tool '{action.name}' arguments cannot be checked: {exc}"
        scope = WorkspaceScope(context.workspace, self._extra_roots)
        reason = self._check_path_arguments(action.name, arguments, scope)
        if reason is None and is_command_tool:
            start = _start_directory(arguments, scope)
            reason = self._check_command(action.name, arguments.get("command"), scope, start)
        return reason

    def _check_path_arguments(
        self, tool: str, arguments: dict[str, Any], scope: WorkspaceScope
    ) -> str | None:
        if _WORKSPACE_PATHS in self._disabled:
            return None
        for key, raw in _path_values(arguments, self._path_arguments):
            explanation = scope.escape(raw)
            if explanation is not None:
                return (
                    f"rule '{_WORKSPACE_PATHS}': {tool} argument '{key}'={_show(raw)} {explanation}"
                )
        return None

    def _check_command(
        self, tool: str, command: Any, scope: WorkspaceScope, start: Path
    ) -> str | None:
        text = _command_text(command)
        if text is None:
            return None
        normalised = normalise_command(text)
        for rule in self._rules:
            if rule.matches(normalised):
                return f"rule '{rule.name}' ({rule.description}) denied {tool}: {_show(text)}"
        upload = None if NETWORK_UPLOAD in self._disabled else _upload_reason(tool, text)
        if upload is not None:
            return upload
        if _COMMAND_ESCAPE in self._disabled:
            return None
        escape = find_command_escape(normalised, scope, start)
        if escape is None:
            return None
        return (
            f"rule '{_COMMAND_ESCAPE}': {tool} {escape.action} {_show(escape.target)}, which "
            f"{escape.explanation} (command: {_show(text)})"
        )

    # -- delegation ------------------------------------------------------------------------

    def _check_delegation(self, action: DelegateAction, context: GateContext) -> str | None:
        limit = self._max_delegation_depth
        if limit is None or _DELEGATION_DEPTH in self._disabled:
            return None
        depth = context.delegation_depth + 1
        if depth <= limit:
            return None
        return (
            f"rule '{_DELEGATION_DEPTH}': delegating to {_show(action.target)} would reach "
            f"depth {depth}, over the limit of {limit}"
        )


def _upload_reason(tool: str, text: str) -> str | None:
    """The ``network-upload`` denial of a command that sends local data out, or None."""
    upload = find_upload(text)
    if upload is None:
        return None
    return (
        f"rule '{NETWORK_UPLOAD}': {tool} runs {upload.program}, which {upload.explanation} "
        f"(command: {_show(text)}); the default gate refuses sending local data over the "
        f"network: a task that must upload lists the rule in its policy "
        f"(disabled_rules: [{NETWORK_UPLOAD}])"
    )


def _path_values(arguments: dict[str, Any], keys: frozenset[str]) -> list[tuple[str, str]]:
    """The (key, path) pairs among the arguments; list values give one pair per string."""
    pairs: list[tuple[str, str]] = []
    for key, value in arguments.items():
        if key not in keys:
            continue
        values = value if isinstance(value, list) else [value]
        pairs += [(key, v) for v in values if isinstance(v, str) and v]
    return pairs


def _start_directory(arguments: dict[str, Any], scope: WorkspaceScope) -> Path:
    """Where the command runs: its ``cwd`` argument (already checked) or the workspace."""
    cwd = arguments.get("cwd")
    if isinstance(cwd, str) and cwd and scope.escape(cwd) is None:
        return scope.locate(cwd)
    return scope.root


def _command_text(command: Any) -> str | None:
    """The command as one string: a string as is, an argv list shell-quoted and joined."""
    if isinstance(command, str):
        return command
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        return shlex.join(command)
    return None


def _show(value: str) -> str:
    """A value quoted for a reason, cut to a readable length."""
    shown = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"
    return f"'{shown}'"
