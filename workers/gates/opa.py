"""A policy gate that asks an OPA server through its REST data API.

For each action the gate sends ``POST {url}/v1/data/{path}`` with ``{"input": ...}`` (``path``
defaults to ``orga/allow``, as ``PolicySpec.opa_path`` does; ``orga.allow`` and
``data.orga.allow`` are accepted too). The input is Symbiont's action shape plus who and where
(:func:`opa_input`)::

    {"type": "tool_call", "call_id": "c1", "tool_name": "run_command",
     "arguments": {"command": "ls"},                  # the parsed object, not JSON text
     # an MCP tool (tool_name "notes__search") adds "mcp_server": "notes", "mcp_tool": "search"
     "agent_id": "coder", "task_id": "t1", "step_id": "s1", "iteration": 3,
     "delegation_depth": 0, "workspace": "/work/t1", "attributes": {}}
    {"type": "delegate", "call_id": "c2", "target": "reviewer", "message_length": 120, ...}
    {"type": "respond", "content_length": 42, ...}
    {"type": "terminate", "reason": "done", ...}

The decision document at ``path`` may be

- a boolean: ``{"result": true}`` allows, ``{"result": false}`` denies;
- an object ``{"allow": bool, "reason": str, "modified_arguments": {...}, "ask": bool}``:
  ``reason`` (optional) is the text the model sees on a denial; ``modified_arguments``
  (optional, tool calls only) turns an allow into a Modify of the call's arguments; ``ask``
  (optional, tool calls only) turns an allow into an :class:`~shared.actions.Ask`: the call
  (with its modified arguments, if any) is held for a reviewer, ``reason`` saying why.

Everything else fails closed, with the reason: an undefined decision (``{}``, the policy is not
loaded or no rule matched without a default), an unexpected shape, a 4xx status or a non-JSON
body. A server that cannot be asked (unreachable, timed out, a 5xx) made no decision: the gate
raises :class:`~shared.errors.PolicyUnavailableError` instead of denying, and the worker reports
an outage of the policy engine (``policy_unavailable``): the coordinator holds the call and asks
again later, the model never sees a denial that is not a policy's. ``examples/policies/orga.rego``
is a policy written against this contract.

The HTTP client: pass ``client`` to share a connection pool (its owner closes it); without
one, each evaluation opens and closes its own client (sharing one TLS context), which is safe
across event loops (a Celery task that calls ``asyncio.run`` per message).
"""

from __future__ import annotations

import functools
import json
import re
import ssl
from collections.abc import Mapping
from typing import Any, assert_never

import httpx

from shared.actions import (
    Allow,
    Ask,
    DelegateAction,
    Deny,
    GateDecision,
    Modify,
    ProposedAction,
    RespondAction,
    TerminateAction,
    ToolCallAction,
)
from shared.errors import ConfigError, PolicyUnavailableError
from workers.gates.base import GateContext, mcp_fields

__all__ = [
    "DEFAULT_OPA_PATH",
    "DEFAULT_OPA_TIMEOUT_S",
    "OpaGate",
    "normalise_opa_path",
    "opa_input",
]

DEFAULT_OPA_PATH = "orga/allow"
DEFAULT_OPA_TIMEOUT_S = 5.0
_PATH_SEGMENT = re.compile(r"[A-Za-z_][\w-]*")
_SNIPPET_CHARS = 300


class _OpaQueryError(Exception):
    """The query did not produce a decision document; the message is the denial reason."""


class OpaGate:
    """Allow, deny or modify as the OPA decision at ``path`` says; deny when OPA's answer is
    no decision, raise :class:`PolicyUnavailableError` when OPA cannot be asked."""

    def __init__(
        self,
        url: str,
        path: str = DEFAULT_OPA_PATH,
        *,
        timeout_s: float = DEFAULT_OPA_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._url = _check_url(url)
        self._path = normalise_opa_path(path)
        if timeout_s <= 0:
            raise ConfigError(f"OPA timeout_s must be positive, got {timeout_s}; use e.g. 2.0")
        self._timeout_s = timeout_s
        self._client = client
        self._headers = dict(headers or {})

    @property
    def service(self) -> str:
        """What an outage report names: ``opa at URL``."""
        return f"opa at {self._url}"

    @property
    def endpoint(self) -> str:
        """The URL the gate posts to."""
        return f"{self._url}/v1/data/{self._path}"

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """OPA's decision for the action (fail closed)."""
        try:
            payload = {"input": opa_input(action, context)}
        except ValueError as exc:
            return Deny(reason=f"OPA input could not be built: {exc}")
        try:
            body = await self._query(payload)
        except _OpaQueryError as failure:
            return Deny(reason=str(failure))
        return self._decision(body, action, context)

    # -- the HTTP exchange -----------------------------------------------------------------

    async def _query(self, payload: dict[str, Any]) -> Any:
        if self._client is not None:
            return await self._post(self._client, payload)
        async with httpx.AsyncClient(verify=_ssl_context()) as client:
            return await self._post(client, payload)

    async def _post(self, client: httpx.AsyncClient, payload: dict[str, Any]) -> Any:
        try:
            response = await client.post(
                self.endpoint, json=payload, headers=self._headers, timeout=self._timeout_s
            )
        except httpx.TimeoutException as exc:
            raise PolicyUnavailableError(
                f"OPA timed out after {self._timeout_s}s at {self.endpoint}; check the OPA "
                "server (or raise the policy's timeout_s)",
                service=self.service,
            ) from exc
        except httpx.TransportError as exc:
            raise PolicyUnavailableError(
                f"OPA unreachable at {self._url}: {_error_text(exc)}; check that the OPA server "
                "runs and the policy's url",
                service=self.service,
            ) from exc
        if response.status_code >= 500:
            raise PolicyUnavailableError(
                f"OPA answered HTTP {response.status_code} for {self.endpoint}: "
                f"{_snippet(response.text)}",
                service=self.service,
            )
        if response.status_code >= 400:
            raise _OpaQueryError(
                f"OPA answered HTTP {response.status_code} for {self.endpoint}: "
                f"{_snippet(response.text)}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise _OpaQueryError(
                f"OPA answered a non-JSON body for {self.endpoint}: {_snippet(response.text)}"
            ) from exc

    # -- reading the decision --------------------------------------------------------------

    def _decision(self, body: Any, action: ProposedAction, context: GateContext) -> GateDecision:
        if not isinstance(body, dict) or "result" not in body:
            return Deny(reason=f"OPA returned no decision for {self._path} (is the policy loaded?)")
        result = body["result"]
        if isinstance(result, bool):
            return Allow() if result else Deny(reason=self._default_reason(action, context))
        if isinstance(result, dict) and isinstance(result.get("allow"), bool):
            return self._object_decision(result, action, context)
        return Deny(
            reason=f"OPA returned an unexpected decision for {self._path}: "
            f"{_snippet(json.dumps(result))}; expected true/false or "
            '{"allow": bool, "reason": str, "modified_arguments": {...}}'
        )

    def _object_decision(
        self, result: dict[str, Any], action: ProposedAction, context: GateContext
    ) -> GateDecision:
        given = result.get("reason")
        reason = given if isinstance(given, str) and given else None
        if not result["allow"]:
            return Deny(reason=reason or self._default_reason(action, context))
        modified = result.get("modified_arguments")
        ask = result.get("ask", False)
        if ask is not False:
            return self._ask(action, ask, modified, reason)
        if modified is None:
            return Allow()
        if not isinstance(action, ToolCallAction):
            return Deny(
                reason=f"OPA returned modified_arguments for a {action.kind} action at "
                f"{self._path}; only tool calls can be modified"
            )
        if not isinstance(modified, dict):
            return Deny(
                reason=f"OPA returned modified_arguments that are not an object at "
                f"{self._path}: {_snippet(json.dumps(modified))}"
            )
        changed = action.model_copy(update={"arguments": json.dumps(modified)})
        return Modify(action=changed, reason=reason or f"arguments modified by OPA {self._path}")

    def _ask(
        self, action: ProposedAction, ask: Any, modified: Any, reason: str | None
    ) -> GateDecision:
        """Hold a tool call (with OPA's modified arguments, when given) for a reviewer."""
        if ask is not True:
            return Deny(
                reason=f"OPA returned a non-boolean 'ask' at {self._path}: "
                f"{_snippet(json.dumps(ask))}; expected true or false"
            )
        if not isinstance(action, ToolCallAction):
            return Deny(
                reason=f"OPA asked for approval of a {action.kind} action at {self._path}; "
                "only tool calls can be held for a reviewer"
            )
        if modified is not None and not isinstance(modified, dict):
            return Deny(
                reason=f"OPA returned modified_arguments that are not an object at "
                f"{self._path}: {_snippet(json.dumps(modified))}"
            )
        held = None
        if modified is not None:
            held = action.model_copy(update={"arguments": json.dumps(modified)})
        why = reason or f"OPA policy {self._path} asks for approval"
        return Ask(reason=f"{why} ({_describe(action)})", action=held)

    def _default_reason(self, action: ProposedAction, context: GateContext) -> str:
        return f"OPA policy {self._path} denied {_describe(action)} for agent '{context.agent_id}'"


def opa_input(action: ProposedAction, context: GateContext) -> dict[str, Any]:
    """The ``input`` document for an action; raises ValueError when the arguments are not JSON."""
    document = _action_input(action)
    document |= {
        "agent_id": context.agent_id,
        "task_id": context.task_id,
        "step_id": context.step_id,
        "iteration": context.iteration,
        "delegation_depth": context.delegation_depth,
        "workspace": str(context.workspace) if context.workspace is not None else None,
        "attributes": json.loads(json.dumps(dict(context.attributes), default=str)),
    }
    return document


def _action_input(action: ProposedAction) -> dict[str, Any]:
    if isinstance(action, ToolCallAction):
        return {
            "type": "tool_call",
            "call_id": action.call_id,
            "tool_name": action.name,
            "arguments": action.parsed_arguments(),
            **mcp_fields(action.name),
        }
    if isinstance(action, DelegateAction):
        return {
            "type": "delegate",
            "call_id": action.call_id,
            "target": action.target,
            "message_length": len(action.message),
        }
    if isinstance(action, RespondAction):
        return {"type": "respond", "content_length": len(action.content)}
    if isinstance(action, TerminateAction):
        return {"type": "terminate", "reason": action.reason}
    assert_never(action)


def normalise_opa_path(path: str) -> str:
    """``orga/allow`` from that, ``orga.allow``, ``/orga/allow/`` or ``data.orga.allow``."""
    cleaned = path.strip().strip("/").replace(".", "/")
    cleaned = cleaned.removeprefix("data/")
    segments = cleaned.split("/")
    if not all(_PATH_SEGMENT.fullmatch(segment) for segment in segments):
        raise ConfigError(
            f"OPA path {path!r} is not a rule path; write it like 'orga/allow' "
            "(package path and rule name, slash- or dot-separated)"
        )
    return cleaned


def _check_url(url: str) -> str:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"OPA url {url!r} is not a URL ({exc}); use http://host:8181") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"OPA url {url!r} must be http(s)://host[:port]; e.g. http://opa:8181")
    return url.rstrip("/")


def _describe(action: ProposedAction) -> str:
    if isinstance(action, ToolCallAction):
        return f"tool_call '{action.name}'"
    if isinstance(action, DelegateAction):
        return f"delegate to '{action.target}'"
    return action.kind


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once: building it costs ~20 ms per client."""
    return httpx.create_ssl_context()


def _error_text(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "…"
