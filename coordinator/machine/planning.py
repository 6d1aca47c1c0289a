"""Planning: a task without steps asks the model to break its goal into steps."""

from __future__ import annotations

import json

from coordinator.machine.core import Section
from coordinator.state import AwaitKind, StepRecord, TaskStatus
from shared import ids
from shared.conversation import Conversation, ConversationMessage
from shared.protocol import Fence, ReasonedMessage
from shared.task_spec import StepSpec

__all__ = ["PLAN_FENCE_STEP", "PLAN_PROMPT", "Planning", "parse_plan"]

PLAN_FENCE_STEP = "__plan__"
"""The fence step of the planning call: not a valid step id, so it never collides with one."""

PLAN_PROMPT = (
    "Break the goal into a short list of concrete steps. Answer with JSON only: "
    '{"steps": [{"id": "short-id", "instruction": "what to do", '
    '"done_when": "optional shell command that exits 0 when the step is done"}]}'
)


class Planning(Section):
    """Ask for a plan, and start the steps it gives (one step, the goal, when it gives none)."""

    def conversation(self) -> Conversation:
        """The planning call's own conversation (not the task's)."""
        conversation = Conversation.with_system(PLAN_PROMPT)
        conversation.push(ConversationMessage.user(f"Goal: {self.record.spec.goal}"))
        return conversation

    def dispatch(self) -> None:
        record = self.record
        record.dispatches += 1
        fence = Fence(
            task_id=record.task_id,
            step_id=PLAN_FENCE_STEP,
            iteration=0,
            attempt=record.dispatches,
            nonce=ids.uuid4().hex[:12],
        )
        self.m.await_(AwaitKind.PLAN, fence)
        self.m.effects.reason_dispatches.append(
            self.m.reasoning.request(fence, self.conversation(), purpose="plan")
        )

    def apply(self, message: ReasonedMessage) -> None:
        record = self.record
        record.usage = record.usage + message.usage
        if self.m.budget.is_exhausted(message):
            self.m.budget.exhausted(message)
            return
        steps = parse_plan(message.terminal_output or "") or [
            StepSpec(id="main", instruction=record.spec.goal)
        ]
        record.steps = [StepRecord(spec=s) for s in steps]
        record.status = TaskStatus.RUNNING
        self.m.event("planned", steps=",".join(s.id for s in steps))
        self.m.steps.start(0)


def parse_plan(text: str) -> list[StepSpec]:
    """Steps from a model's plan (``{"steps": [...]}`` or a bare list); [] when unusable."""
    start, end = text.find("{"), text.rfind("}")
    candidates = [text]
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        items = data.get("steps") if isinstance(data, dict) else data
        if not isinstance(items, list) or not items:
            continue
        try:
            steps = [StepSpec.model_validate(item) for item in items[:20]]
        except (ValueError, OverflowError, RecursionError):
            continue
        if len({s.id for s in steps}) == len(steps):
            return steps
    return []
