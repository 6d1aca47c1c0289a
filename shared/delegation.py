"""Sub-agents: the ``delegate`` tool's arguments and schema, and the link a child task keeps to
the call that created it.

The model delegates by calling the ``delegate`` tool (``agent``, ``goal``, optional ``steps``,
optional ``budget``). It is offered like any tool (allow-lists, tool profiles and the
``OfferedToolsGate`` apply), checked against :data:`DELEGATE_PARAMETERS` by the schema check,
and never run by a worker: the coordinator turns an approved call into a child task submitted
through the intake (:mod:`coordinator.machine.delegation`), and the child's end comes back as
that call's result (:class:`shared.protocol.ChildFinishedMessage`). This module is pure data.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.inference import ToolDefinition

__all__ = [
    "DELEGATE_PARAMETERS",
    "DELEGATE_TOOL",
    "DelegateArguments",
    "DelegatedStep",
    "DelegationBudget",
    "ParentLink",
    "WorkspaceMode",
    "child_idempotency_key",
    "child_task_id",
    "delegate_tool_definition",
    "is_delegate",
    "parent_link",
]

DELEGATE_TOOL = "delegate"
"""The tool name the model calls to hand a sub-task to another agent."""

WorkspaceMode = Literal["subfolder", "copy"]
"""Where a child works: a subfolder of its parent's workspace (it sees and adds to the parent's
files), or a copy of the parent's workspace taken when the child starts."""

_AGENT = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_STEP_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def is_delegate(name: str) -> bool:
    """Whether a tool call of this name delegates (the coordinator runs it, no worker)."""
    return name == DELEGATE_TOOL


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DelegatedStep(_Strict):
    """One step the parent gives its child: an id, an instruction, an optional check."""

    id: str = Field(pattern=_STEP_ID)
    instruction: str = Field(min_length=1)
    done_when: str | None = None


class DelegationBudget(_Strict):
    """What the child may spend per step; capped by what the parent's step has left after its
    running siblings' reservations."""

    iterations: int | None = Field(default=None, ge=1)
    tokens: int | None = Field(default=None, ge=1)
    cost_usd: float | None = Field(default=None, gt=0)
    """US dollars, out of what the parent task has left of its ``limits.max_cost_usd``."""


class DelegateArguments(_Strict):
    """The ``delegate`` tool's arguments, as the model sends them."""

    agent: str = Field(pattern=_AGENT)
    goal: str = Field(min_length=1, max_length=20_000)
    steps: list[DelegatedStep] | None = Field(default=None, max_length=50)
    budget: DelegationBudget | None = None


DELEGATE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "agent": {
            "type": "string",
            "pattern": _AGENT,
            "description": "The registered agent that does the sub-task.",
        },
        "goal": {
            "type": "string",
            "minLength": 1,
            "maxLength": 20_000,
            "description": "What the sub-agent must achieve, self-contained.",
        },
        "steps": {
            "type": "array",
            "maxItems": 50,
            "description": "Optional explicit steps; without them the sub-agent plans its own.",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "pattern": _STEP_ID},
                    "instruction": {"type": "string", "minLength": 1},
                    "done_when": {
                        "type": "string",
                        "description": "A shell command that must exit 0 for the step to count.",
                    },
                },
                "required": ["id", "instruction"],
                "additionalProperties": False,
            },
        },
        "budget": {
            "type": "object",
            "description": "Optional limits per step of the sub-agent, within what this step "
            "has left after the budgets of the other sub-agents; without it, an even share of "
            "that among this turn's delegations. cost_usd: US dollars for the whole sub-agent, "
            "out of the money this task has left (when it has a limit).",
            "properties": {
                "iterations": {"type": "integer", "minimum": 1},
                "tokens": {"type": "integer", "minimum": 1},
                "cost_usd": {"type": "number", "exclusiveMinimum": 0},
            },
            "additionalProperties": False,
        },
    },
    "required": ["agent", "goal"],
    "additionalProperties": False,
}


def delegate_tool_definition() -> ToolDefinition:
    """The ``delegate`` tool as the model sees it."""
    return ToolDefinition(
        name=DELEGATE_TOOL,
        description=(
            "Hand a sub-task to another registered agent, which works in its own task and "
            "workspace (a subfolder or a copy of yours). Its final answer, status and "
            "milestones come back as this call's result. Several delegate calls in one turn "
            "run in parallel."
        ),
        parameters=DELEGATE_PARAMETERS,
    )


class ParentLink(_Strict):
    """Set by the runtime on a child task: the parent's call it answers, and what a reviewer
    of the child sees of its parent. A submitted task cannot claim a parent it was not created
    by: the intake refuses a task whose parent did not record it for that call, and the parent
    only takes the result of the child id it recorded for that call."""

    task_id: str = Field(min_length=1)
    step_id: str = Field(min_length=1)
    iteration: int = Field(ge=0)
    call_id: str = Field(min_length=1)
    attempt: int = Field(default=0, ge=0)
    goal: str = ""
    step_instruction: str = ""
    depth: int = Field(default=1, ge=1)
    """The child's depth: 1 for a task's own children, 2 for their children..."""
    workspace: str = ""
    """The parent's workspace: a ``subfolder`` child works under it."""
    workspace_base: str | None = None
    """The workspace of the delegation tree's root when the parent itself works in a subfolder
    of it (None: the parent's workspace is its own). A ``subfolder`` child's workspace is
    checked, folder by folder, from there (:attr:`shared.protocol.ToolRequest.workspace_base`)."""
    copy_from: str | None = None
    """What a ``copy`` child's workspace starts from: the parent's workspace once a tool has
    used it, else the parent's own template (None: an empty folder)."""
    max_iterations: int | None = Field(default=None, ge=0)
    max_total_tokens: int | None = Field(default=None, ge=0)
    """The child's per-step limits are capped by these: what the parent's step had left
    (and the ``budget`` the parent asked for) when the child was created."""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """The money the child may spend (USD), reserved out of what its parent task had left of
    its ``max_cost_usd`` (None: the parent has no money limit)."""


def child_idempotency_key(parent_task_id: str, step_id: str, iteration: int, call_id: str) -> str:
    """The intake's idempotency key of the child created by one ``delegate`` call: the same
    for every application of that call (a redelivery, a coordinator restart)."""
    key = f"delegate:{parent_task_id}:{step_id}:{iteration}:{call_id}"
    if len(key) <= 200:
        return key
    return f"delegate:{hashlib.sha256(key.encode()).hexdigest()}"


def child_task_id(parent_task_id: str, number: int) -> str:
    """The id of a task's ``number``-th child: ``{parent}.{number}``, shortened with a digest
    of the parent's id when that would pass the 128 characters of a task id."""
    task_id = f"{parent_task_id}.{number}"
    if len(task_id) <= 128:
        return task_id
    digest = hashlib.sha256(parent_task_id.encode()).hexdigest()[:16]
    return f"{parent_task_id[:100]}-{digest}.{number}"


def parent_link(task_text: str) -> ParentLink | None:
    """The parent link of a submitted task's text, when it has a valid one (read even when the
    task itself is invalid, so that the intake can tell the parent why its child was refused)."""
    if '"delegation"' not in task_text:  # the runtime writes children as JSON
        return None
    try:
        data = json.loads(task_text)
        raw = data.get("delegation") if isinstance(data, dict) else None
        return ParentLink.model_validate(raw) if isinstance(raw, dict) else None
    except (ValueError, RecursionError):  # not JSON (or nested too deeply), or not a link
        return None
