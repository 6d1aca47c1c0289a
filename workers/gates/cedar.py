"""A policy gate that asks Cedar (through ``cedarpy``), with policies loaded from files.

Each action becomes one Cedar request:

==============  ==============================  =====================================
action          Cedar action                    resource
==============  ==============================  =====================================
tool call       ``Action::"tool_call"``         ``Tool::"<tool name>"``
delegation      ``Action::"delegate"``          ``Agent::"<target>"``
respond         ``Action::"respond"``           ``Response::"respond"``
terminate       ``Action::"terminate"``         ``Response::"terminate"``
==============  ==============================  =====================================

The principal is always ``Agent::"<agent_id>"``. The context holds the same fields as the OPA
input (:func:`workers.gates.opa.opa_input`) minus those already in the request: ``call_id``
and ``arguments`` (the parsed arguments object) for a tool call; ``call_id`` and
``message_length`` for a delegation; ``content_length`` for respond; ``reason`` for terminate;
plus ``task_id`` and ``step_id`` when known, ``iteration``, ``delegation_depth`` and
``attributes`` (``GateContext.attributes``). A call of an MCP tool (``Tool::"notes__search"``)
adds ``mcp_server`` (``"notes"``) and ``mcp_tool`` (``"search"``) to the context.

Cedar values are not JSON: there is no null and no float. JSON nulls are left out (test them
with ``has``), floats and integers outside 64 bits are passed as their decimal text. A key
named ``__entity``, ``__extn`` or ``__expr`` would be read by Cedar as an escape (an entity
reference, say), so such arguments are denied rather than passed.

A permit policy annotated ``@ask("why")`` holds the calls it permits for a human: when Cedar
allows a request and one of the permit policies that allowed it (Cedar's diagnostics reasons)
carries ``@ask``, the decision is :class:`~shared.actions.Ask` with that text and the policy's
label; the reviewer approves, edits or rejects the call (:mod:`shared.approval`). A ``forbid``
still wins over it, as over any permit::

    @id("push-needs-a-human") @ask("pushing leaves the workspace")
    permit(principal, action == Action::"tool_call", resource == Tool::"run_command")
    when { context.arguments has command && context.arguments.command like "git push*" };

The gate fails closed: a request Cedar cannot evaluate, or *any* policy evaluation error, is a
denial, even when Cedar's own answer is Allow, because an erroring ``forbid`` may be the one
that should have fired. Guard attribute access with ``has``
(``context.arguments has command && context.arguments.command like "*rm -rf*"``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never

import cedarpy

from shared.actions import (
    Allow,
    Ask,
    DelegateAction,
    Deny,
    GateDecision,
    ProposedAction,
    RespondAction,
    TerminateAction,
    ToolCallAction,
)
from shared.errors import ConfigError
from workers.gates.base import GateContext, mcp_fields

__all__ = ["CedarGate", "cedar_request"]

_RESERVED_KEYS = frozenset({"__entity", "__extn", "__expr"})
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_POLICY_ID = re.compile(r"`(policy\d+)`")


@dataclass(frozen=True, slots=True)
class _LoadedPolicies:
    policy_set: cedarpy.PolicySet
    labels: dict[str, str]
    asks: dict[str, str]
    """Policy id -> the text of its ``@ask`` annotation."""


class CedarGate:
    """Allow iff the Cedar policies permit the request and no forbid or error stands in the way."""

    def __init__(self, policy_files: Path | Iterable[Path]) -> None:
        files = [policy_files] if isinstance(policy_files, Path) else list(policy_files)
        if not files:
            raise ConfigError(
                "CedarGate needs at least one policy file; pass policy_files=[Path('x.cedar')]"
            )
        self._files = tuple(files)
        self._loaded = _load_policies(self._files)

    @property
    def policy_files(self) -> tuple[Path, ...]:
        """The policy files, in load order."""
        return self._files

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """Cedar's decision on the request built from the action (fail closed)."""
        try:
            request = cedar_request(action, context)
        except ValueError as exc:
            return Deny(reason=f"Cedar request could not be built: {exc}")
        try:
            result = cedarpy.is_authorized(request, self._loaded.policy_set, [])
        except Exception as exc:  # cedarpy raises several types; any of them means deny
            return Deny(reason=f"Cedar evaluation error for {_describe(request)}: {exc}")
        return self._decision(result, request)

    def _decision(self, result: cedarpy.AuthzResult, request: dict[str, Any]) -> GateDecision:
        diagnostics = result.diagnostics
        errors = [self._relabel(str(error)) for error in diagnostics.errors]
        if result.decision == cedarpy.Decision.Allow and not errors:
            return self._allow_or_ask(diagnostics.reasons, request)
        what = _describe(request)
        if result.decision == cedarpy.Decision.Deny and diagnostics.reasons:
            labels = ", ".join(self._label(pid) for pid in diagnostics.reasons)
            reason = f"Cedar denied {what}: forbidden by {labels}"
        elif errors:
            reason = f"Cedar evaluation error for {what} (failing closed)"
        else:
            reason = f"Cedar denied {what}: no permit policy matched"
        if errors:
            reason += f"; errors: {'; '.join(errors)}"
        return Deny(reason=reason)

    def _allow_or_ask(self, reasons: list[str], request: dict[str, Any]) -> GateDecision:
        asking = [pid for pid in reasons if pid in self._loaded.asks]
        if not asking:
            return Allow()
        said = "; ".join(
            f"{self._label(pid)}: {self._loaded.asks[pid] or 'approval required'}" for pid in asking
        )
        return Ask(reason=f"Cedar holds {_describe(request)} for a reviewer's approval ({said})")

    def _label(self, policy_id: str) -> str:
        return self._loaded.labels.get(policy_id, policy_id)

    def _relabel(self, error: str) -> str:
        return _POLICY_ID.sub(lambda m: f"`{self._label(m.group(1))}`", error)


# -- loading ---------------------------------------------------------------------------------


def _load_policies(files: Iterable[Path]) -> _LoadedPolicies:
    """One policy set from every file, with a readable label for each policy id."""
    policy_set = cedarpy.PolicySet.from_str("")
    labels: dict[str, str] = {}
    asks: dict[str, str] = {}
    for path in files:
        text = _read_policy_file(path)
        part, annotations = _parse_policy_file(path, text)
        offset = len(policy_set)
        for local in range(len(part)):
            found = annotations.get(f"policy{local}", {})
            annotation = found.get("id", "")
            name = f"'{annotation}'" if annotation else f"policy #{local + 1}"
            labels[f"policy{offset + local}"] = f"{name} ({path.name})"
            if "ask" in found:
                asks[f"policy{offset + local}"] = found["ask"]
        policy_set = policy_set.with_added_str(text)
    return _LoadedPolicies(policy_set=policy_set, labels=labels, asks=asks)


def _read_policy_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            f"Cedar policy file {path} does not exist; fix the path in policy_files"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cedar policy file {path} cannot be read: {exc}") from exc


def _parse_policy_file(
    path: Path, text: str
) -> tuple[cedarpy.PolicySet, dict[str, dict[str, str]]]:
    """The parsed policies and their annotations (``@id``, ``@ask``) by per-file policy id."""
    try:
        part = cedarpy.PolicySet.from_str(text)
        as_json = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as exc:
        raise ConfigError(
            f"Cedar policy file {path} does not parse: {exc}; fix the policy syntax"
        ) from exc
    static = as_json.get("staticPolicies", {})
    annotations = {
        pid: {str(k): str(v or "") for k, v in (body.get("annotations") or {}).items()}
        for pid, body in static.items()
    }
    return part, annotations


# -- requests --------------------------------------------------------------------------------


def cedar_request(action: ProposedAction, context: GateContext) -> dict[str, Any]:
    """The Cedar request for an action; raises ValueError when it cannot be expressed."""
    action_id, resource, fields = _action_parts(action)
    fields |= {
        "task_id": context.task_id,
        "step_id": context.step_id,
        "iteration": context.iteration,
        "delegation_depth": context.delegation_depth,
        "attributes": dict(context.attributes),
    }
    return {
        "principal": {"type": "Agent", "id": context.agent_id},
        "action": {"type": "Action", "id": action_id},
        "resource": resource,
        "context": _cedar_record(fields),
    }


def _action_parts(action: ProposedAction) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The Cedar action id, the resource and the action's own context fields."""
    fields: dict[str, Any]
    if isinstance(action, ToolCallAction):
        fields = {"call_id": action.call_id, "arguments": action.parsed_arguments()}
        fields |= mcp_fields(action.name)
        return "tool_call", {"type": "Tool", "id": action.name}, fields
    if isinstance(action, DelegateAction):
        fields = {"call_id": action.call_id, "message_length": len(action.message)}
        return "delegate", {"type": "Agent", "id": action.target}, fields
    if isinstance(action, RespondAction):
        fields = {"content_length": len(action.content)}
        return "respond", {"type": "Response", "id": "respond"}, fields
    if isinstance(action, TerminateAction):
        return "terminate", {"type": "Response", "id": "terminate"}, {"reason": action.reason}
    assert_never(action)


def _cedar_record(value: Mapping[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, item in value.items():
        if key in _RESERVED_KEYS:
            raise ValueError(f"key {key!r} is reserved by Cedar's JSON format and cannot be passed")
        if item is not None:
            record[str(key)] = _cedar_value(item)
    return record


def _cedar_value(value: Any) -> Any:
    """A JSON value as Cedar accepts it: nulls dropped, floats and huge integers as text."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if _I64_MIN <= value <= _I64_MAX else str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return _cedar_record(value)
    if isinstance(value, list | tuple):
        return [_cedar_value(item) for item in value if item is not None]
    raise ValueError(f"value of type {type(value).__name__} cannot be passed to Cedar")


def _describe(request: dict[str, Any]) -> str:
    def uid(entity: dict[str, str]) -> str:
        return f"{entity['type']}::{json.dumps(entity['id'])}"

    return f"{uid(request['action'])} on {uid(request['resource'])} for {uid(request['principal'])}"
