"""What the model proposes, what the gate decides, and what the tools observe (Symbiont §2)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.conversation import ConversationMessage

__all__ = [
    "Allow",
    "Ask",
    "DelegateAction",
    "Deny",
    "GateDecision",
    "GateModification",
    "Modify",
    "Observation",
    "ProposedAction",
    "RespondAction",
    "TerminateAction",
    "ToolCallAction",
]


class ToolCallAction(BaseModel):
    """Call a tool; ``arguments`` is the JSON text the model produced."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: str = "{}"

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises ValueError when they are not a JSON object."""
        value = json.loads(self.arguments) if self.arguments.strip() else {}
        if not isinstance(value, dict):
            raise ValueError(
                f"tool {self.name!r} arguments must be a JSON object, got {type(value).__name__}"
            )
        return value


class DelegateAction(BaseModel):
    """Hand a sub-task to another agent."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["delegate"] = "delegate"
    call_id: str
    target: str
    message: str


class RespondAction(BaseModel):
    """Answer with text: the final output of the loop."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["respond"] = "respond"
    content: str


class TerminateAction(BaseModel):
    """Stop the loop with an output and a reason."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["terminate"] = "terminate"
    reason: str
    output: str = ""


ProposedAction = Annotated[
    ToolCallAction | DelegateAction | RespondAction | TerminateAction,
    Field(discriminator="kind"),
]


class Allow(BaseModel):
    """The gate lets the action through unchanged."""

    model_config = ConfigDict(frozen=True)
    decision: Literal["allow"] = "allow"


class Deny(BaseModel):
    """The gate refuses the action; the model sees ``[Policy denied] <reason>``."""

    model_config = ConfigDict(frozen=True)
    decision: Literal["deny"] = "deny"
    reason: str


class Modify(BaseModel):
    """The gate replaces the action by another one."""

    model_config = ConfigDict(frozen=True)
    decision: Literal["modify"] = "modify"
    action: ProposedAction
    reason: str


class Ask(BaseModel):
    """The gate holds a tool call for a human: a reviewer approves it, edits its arguments or
    rejects it with a message the model reads (the rest of the turn's calls run meanwhile).

    ``action`` is the call to review when an earlier gate of a composite modified it (None:
    the proposed one). A gate asks only about tool calls; an ``Ask`` for any other action is
    read as a denial naming it."""

    model_config = ConfigDict(frozen=True)
    decision: Literal["ask"] = "ask"
    reason: str
    action: ProposedAction | None = None


GateDecision = Annotated[Allow | Deny | Modify | Ask, Field(discriminator="decision")]


class GateModification(BaseModel):
    """A gate's Modify as it was applied: the action proposed, the one that runs instead (with
    the proposed call's id kept), and the gate's reason; journaled as ``GateModified``."""

    model_config = ConfigDict(frozen=True)
    before: ProposedAction
    after: ProposedAction
    reason: str


class Observation(BaseModel):
    """The result of one action, as the model will see it.

    ``metadata`` carries what the stagnation detector needs (``kind``, ``path``,
    ``content_hash``, ``before_hash``, ``after_hash``, ``exit_code``) and error types
    (``error_type``: ``timeout``, ``circuit_open``, ``policy_denied``, ``schema``).
    """

    model_config = ConfigDict(frozen=True)

    source: str
    content: str
    is_error: bool = False
    call_id: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def tool_result(cls, name: str, content: str) -> Observation:
        """A successful tool result."""
        return cls(source=name, content=content)

    @classmethod
    def tool_error(cls, name: str, error: str) -> Observation:
        """A failed tool call."""
        return cls(source=name, content=error, is_error=True)

    @classmethod
    def policy_denial(cls, reason: str) -> Observation:
        """An action refused by the policy gate."""
        return cls(source="policy_gate", content=reason, is_error=True)

    def with_call_id(self, call_id: str) -> Observation:
        """A copy bound to the call it answers."""
        return self.model_copy(update={"call_id": call_id})

    def with_metadata(self, **values: str) -> Observation:
        """A copy with extra metadata."""
        return self.model_copy(update={"metadata": {**self.metadata, **values}})

    def as_tool_message(self) -> ConversationMessage:
        """The tool message the model sees: errors prefixed ``[Error] ``, paired by call id."""
        content = f"[Error] {self.content}" if self.is_error else self.content
        name = self.metadata.get("tool_name", self.source)
        return ConversationMessage.tool_result(self.call_id or self.source, name, content)
