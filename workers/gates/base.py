"""The policy gate seam (Symbiont's ``ReasoningPolicyGate``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from shared.actions import GateDecision, ProposedAction
from shared.mcp import is_mcp_tool, split_tool_name

__all__ = ["GateContext", "ReasoningPolicyGate", "mcp_fields"]


class GateContext(BaseModel):
    """What a gate may look at besides the action: who, where, and which step.

    ``delegation_depth`` is how many delegations led to this agent (0 for a top-level task);
    gates that bound delegation compare it with their limit.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    agent_id: str
    workspace: Path | None = None
    task_id: str | None = None
    step_id: str | None = None
    iteration: int = 0
    allowed_tools: frozenset[str] | None = None
    delegation_depth: int = Field(default=0, ge=0)
    attributes: Mapping[str, Any] = Field(default_factory=dict)


@runtime_checkable
class ReasoningPolicyGate(Protocol):
    """Decides, for one proposed action, Allow, Deny(reason) or Modify(action, reason)."""

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """The decision for ``action``."""
        ...


def mcp_fields(tool_name: str) -> dict[str, str]:
    """For a call of an MCP tool (``<server>__<tool>``), what a policy sees of it besides the
    tool name: ``mcp_server`` and ``mcp_tool`` (the tool's offered name without the server);
    nothing for other tools. OPA's input and Cedar's context carry them."""
    if not is_mcp_tool(tool_name):
        return {}
    server, tool = split_tool_name(tool_name)
    return {"mcp_server": server, "mcp_tool": tool}
