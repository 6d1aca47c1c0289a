"""A gate that lets through only the tools of an allow-list (Symbiont's ToolFilterPolicyGate)."""

from __future__ import annotations

from collections.abc import Iterable

from shared.actions import Allow, Deny, GateDecision, ProposedAction, ToolCallAction
from workers.gates.base import GateContext

__all__ = ["ToolFilterGate", "tool_not_allowed_reason"]


def tool_not_allowed_reason(name: str) -> str:
    """The denial reason for a tool outside the allow-list (Symbiont's exact text)."""
    return f"Tool '{name}' not in allowed list"


class ToolFilterGate:
    """Allows a tool call iff its name is in the set (exact, case-sensitive).

    Every other action (respond, terminate, delegate) is allowed. ``allowed=None`` allows every
    tool: that is :meth:`allow_all`.
    """

    def __init__(self, allowed: frozenset[str] | None) -> None:
        self._allowed = allowed

    @classmethod
    def allow(cls, names: Iterable[str]) -> ToolFilterGate:
        """A gate allowing exactly these tools; an empty list allows no tool."""
        return cls(frozenset(names))

    @classmethod
    def allow_all(cls) -> ToolFilterGate:
        """A gate allowing every tool."""
        return cls(None)

    @property
    def allowed(self) -> frozenset[str] | None:
        """The allowed tool names, or None when every tool is allowed."""
        return self._allowed

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """Deny a tool call outside the allow-list; allow everything else."""
        allowed = self._allowed
        if (
            isinstance(action, ToolCallAction)
            and allowed is not None
            and action.name not in allowed
        ):
            return Deny(reason=tool_not_allowed_reason(action.name))
        return Allow()
