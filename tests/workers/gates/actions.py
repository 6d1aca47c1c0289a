"""Actions and contexts shared by the gate tests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from shared.actions import (
    DelegateAction,
    GateDecision,
    ProposedAction,
    RespondAction,
    TerminateAction,
    ToolCallAction,
)
from workers.gates.base import GateContext, ReasoningPolicyGate

__all__ = ["ALL_KINDS", "context", "decide", "delegate", "respond", "terminate", "tool"]


def tool(
    name: str, arguments: dict[str, Any] | None = None, call_id: str = "call-1"
) -> ToolCallAction:
    """A tool call with JSON-encoded arguments."""
    return ToolCallAction(call_id=call_id, name=name, arguments=json.dumps(arguments or {}))


def delegate(target: str = "reviewer", message: str = "please review") -> DelegateAction:
    """A delegation."""
    return DelegateAction(call_id="call-d", target=target, message=message)


def respond(content: str = "done") -> RespondAction:
    """A final answer."""
    return RespondAction(content=content)


def terminate(reason: str = "finished") -> TerminateAction:
    """A termination."""
    return TerminateAction(reason=reason, output="out")


ALL_KINDS: tuple[ProposedAction, ...] = (
    tool("search", {"q": "x"}),
    delegate(),
    respond(),
    terminate(),
)


def context(workspace: Path | None = None, **fields: Any) -> GateContext:
    """A gate context for agent ``agent-1``."""
    return GateContext(agent_id="agent-1", workspace=workspace, **fields)


def decide(
    gate: ReasoningPolicyGate, action: ProposedAction, ctx: GateContext | None = None
) -> GateDecision:
    """Run the gate on one action, synchronously."""
    return asyncio.run(gate.evaluate_action(action, ctx or context()))
