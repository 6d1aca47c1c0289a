"""The ``delegate`` tool as the workers see it: offered to the model, never run by a worker.

Its definition (:func:`shared.delegation.delegate_tool_definition`) is in every worker's
registry, so the allow-list, tool profiles, the schema check and the ``OfferedToolsGate`` treat
it like any tool. The coordinator decides an approved call (a child task); a reasoning worker
neither chains it to a tool worker nor runs it inline. Should a tool worker be handed one all
the same, it answers with an error instead of doing anything.
"""

from __future__ import annotations

from typing import Any

from shared.delegation import delegate_tool_definition
from shared.inference import ToolDefinition
from workers.tools.base import ToolContext, ToolOutput

__all__ = ["DELEGATE_DEFINITION", "DelegateTool"]

DELEGATE_DEFINITION = delegate_tool_definition()


class DelegateTool:
    """The ``delegate`` definition; running it is the coordinator's business."""

    @property
    def definition(self) -> ToolDefinition:
        """Name, description and JSON Schema of the arguments."""
        return DELEGATE_DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Refuse: a worker never creates a sub-agent."""
        return ToolOutput(
            content=(
                "delegate is decided by the coordinator, which creates the sub-agent's task; "
                "a tool worker cannot run it (this call reached one by mistake)"
            ),
            is_error=True,
            metadata={"kind": "other"},
        )
