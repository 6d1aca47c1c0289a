"""A gate that only lets through calls to the tools the model was offered.

Tool profiles, a task's ``tools`` allow-list and a task without a ``knowledge`` block hide
tools from the model; a model (or text injected into its context) can still name a hidden tool.
``OfferedToolsGate`` wraps the task's gate and denies such a call before the gate sees it, the
way pydantic-ai's ``FilteredToolset`` wraps a toolset. A name no worker knows is left to the
executor, which answers ``Unknown tool``.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.actions import Deny, GateDecision, ProposedAction, ToolCallAction
from workers.gates.base import GateContext, ReasoningPolicyGate

__all__ = ["OfferedToolsGate"]


class OfferedToolsGate:
    """Denies calls to ``known`` tools that are not ``offered``; asks ``inner`` otherwise."""

    def __init__(
        self, inner: ReasoningPolicyGate, offered: Iterable[str], known: Iterable[str]
    ) -> None:
        self._inner = inner
        self._offered = frozenset(offered)
        self._hidden = frozenset(known) - self._offered

    async def evaluate_action(self, action: ProposedAction, context: GateContext) -> GateDecision:
        """Deny a hidden tool by name, with the tools this task does offer."""
        if isinstance(action, ToolCallAction) and action.name in self._hidden:
            offered = ", ".join(sorted(self._offered)) or "none"
            return Deny(
                reason=f"tool {action.name!r} is not offered in this task (its tools: {offered})"
            )
        return await self._inner.evaluate_action(action, context)
