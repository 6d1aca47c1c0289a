"""Money budgets in the coordinator's machine: every model call's request carries what the
task has left; a call the worker did not send for want of money ends the step ``budget
exhausted`` with the milestones kept, or escalates; sub-agents reserve money from their
parent as they do iterations."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.machine.delegation import child_result
from coordinator.state import TaskRecord, TaskStatus
from shared.actions import RespondAction, ToolCallAction
from shared.conversation import ConversationMessage
from shared.delegation import ParentLink
from shared.inference import ToolCall, Usage
from shared.loop_types import TerminationKind, TerminationReason
from shared.protocol import ReasonedMessage
from shared.task_spec import TaskSpec, parse_task

SETTINGS = MachineSettings(
    observation_deadline_s=10.0, workspace_root="/ws", max_delegation_depth=3,
    max_children_per_task=3,
)  # fmt: skip

PRICED = {"kind": "scripted", "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}
EXHAUSTED = TerminationReason(
    kind=TerminationKind.BUDGET_EXHAUSTED,
    message="budget exhausted: the next model call could cost up to $0.2000",
)


def _started(**limits: Any) -> TaskRecord:
    data = {
        "goal": "ship",
        "provider": PRICED,
        "steps": [
            {"id": "one", "instruction": "first"},
            {"id": "two", "instruction": "second"},
        ],
        "limits": {"max_cost_usd": 1.0, **limits},
    }
    record = TaskRecord(task_id="p", spec=parse_task(data), created_at=0.0, updated_at=0.0)
    _apply(record, lambda m: m.start(), now=1.0)
    return record


def _apply(record: TaskRecord, step: Any, now: float = 2.0) -> Effects:
    effects: Effects = step(TaskMachine(record, now, SETTINGS))
    return effects


def _answer(record: TaskRecord, cost: float) -> Effects:
    assert record.awaiting is not None
    message = ReasonedMessage(
        fence=record.awaiting.fence,
        new_messages=[ConversationMessage.assistant("done")],
        actions=[RespondAction(content="done")],
        terminal_output="done",
        usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15, cost_usd=cost),
    )
    return _apply(record, lambda m: m.on_reasoned(message))


def _not_sent(record: TaskRecord) -> Effects:
    assert record.awaiting is not None
    message = ReasonedMessage(fence=record.awaiting.fence, termination=EXHAUSTED)
    return _apply(record, lambda m: m.on_reasoned(message))


def test_each_request_carries_the_money_left() -> None:
    """The first call may spend the whole dollar; after a $0.35 call, the next gets $0.65."""
    steps = [{"id": "s", "instruction": "i"}, {"id": "t", "instruction": "j"}]
    data = {"goal": "g", "provider": PRICED, "limits": {"max_cost_usd": 1.0}, "steps": steps}
    fresh = TaskRecord(task_id="f", spec=parse_task(data), created_at=0.0, updated_at=0.0)
    (start,) = _apply(fresh, lambda m: m.start(), now=1.0).reason_dispatches
    assert start.config.max_cost_usd == pytest.approx(1.0)
    record = _started()
    effects = _answer(record, 0.35)
    assert record.usage.cost_usd == pytest.approx(0.35)
    (request,) = effects.reason_dispatches
    assert request.config.max_cost_usd == pytest.approx(0.65)


def test_no_money_limit_no_money_in_the_request() -> None:
    """A task without ``max_cost_usd`` sends requests without one (nothing checked)."""
    data = {"goal": "g", "steps": [{"id": "s", "instruction": "i"}]}
    record = TaskRecord(task_id="t", spec=parse_task(data), created_at=0.0, updated_at=0.0)
    effects = _apply(record, lambda m: m.start(), now=1.0)
    (request,) = effects.reason_dispatches
    assert request.config.max_cost_usd is None


def test_a_call_not_sent_for_want_of_money_fails_the_task_keeping_milestones() -> None:
    """Step one completed (its milestone kept); step two's call was not sent: the task fails
    with ``budget exhausted`` as its reason, and step two's loop ends budget_exhausted."""
    record = _started()
    _answer(record, 0.5)
    assert record.current == 1
    record.milestones.append("step:one")
    effects = _not_sent(record)
    assert record.status is TaskStatus.FAILED
    assert record.error is not None and record.error.startswith("budget exhausted")
    assert record.milestones == ["step:one"]
    assert not effects.reason_dispatches  # no other attempt is made
    kinds = [e.event.reason.kind for e in effects.journal if e.event.type == "Terminated"]
    assert kinds[0] is TerminationKind.BUDGET_EXHAUSTED
    assert any(e["event"] == "budget_exhausted" for e in effects.events)


def test_on_budget_exhausted_escalate_asks_a_human() -> None:
    """``on_budget_exhausted: escalate``: the step waits for a review (source ``budget``)."""
    record = _started(on_budget_exhausted="escalate")
    effects = _not_sent(record)
    assert record.status is TaskStatus.AWAITING_REVIEW
    assert record.review is not None and record.review.source == "budget"
    assert record.review.reason.startswith("budget exhausted")
    assert effects.reviews


def _delegate(call_id: str, **extra: Any) -> ToolCallAction:
    arguments = {"agent": "alpha", "goal": f"sub-task {call_id}", **extra}
    return ToolCallAction(call_id=call_id, name="delegate", arguments=json.dumps(arguments))


def _turn(record: TaskRecord, *calls: ToolCallAction, cost: float = 0.0) -> Effects:
    assert record.awaiting is not None
    message = ReasonedMessage(
        fence=record.awaiting.fence,
        usage=Usage(total_tokens=100, cost_usd=cost),
        new_messages=[
            ConversationMessage.assistant_tool_calls(
                [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls]
            )
        ],
        actions=list(calls),
        approved_calls=list(calls),
    )
    return _apply(record, lambda m: m.on_reasoned(message))


def _link(effects: Effects, index: int) -> ParentLink:
    return ParentLink.model_validate(json.loads(effects.children[index].task)["delegation"])


def test_children_reserve_money_from_what_the_parent_has_left() -> None:
    """$1 limit, $0.20 spent by the delegating call: one child asks for $0.30, the other
    takes the rest ($0.50); while they run the parent has nothing left; a child's actual
    spending then replaces its reservation."""
    record = _started()
    effects = _turn(record, _delegate("c1", budget={"cost_usd": 0.3}), _delegate("c2"), cost=0.2)
    first, second = _link(effects, 0), _link(effects, 1)
    assert first.max_cost_usd == pytest.approx(0.3)
    assert second.max_cost_usd == pytest.approx(0.5)
    assert [c.reserved_cost_usd for c in record.children] == pytest.approx([0.3, 0.5])
    assert TaskMachine(record, 3.0, SETTINGS).budget.left() == pytest.approx(0.0)
    child = TaskSpec.model_validate({**json.loads(effects.children[0].task), "provider": PRICED})
    assert child.max_cost_usd == pytest.approx(0.3)
    ended = TaskRecord(
        task_id="p.1", spec=child, created_at=0.0, updated_at=0.0,
        status=TaskStatus.COMPLETED, usage=Usage(total_tokens=40, cost_usd=0.1),
    )  # fmt: skip
    done = child_result("p.1", ended, TaskStatus.COMPLETED, None)
    _apply(record, lambda m: m.on_child_finished(done), now=3.0)
    # spent 0.2 + 0.1 (the child's), 0.5 still held by the other child
    assert TaskMachine(record, 3.0, SETTINGS).budget.left() == pytest.approx(0.2)


def test_a_parent_with_no_money_left_refuses_to_delegate() -> None:
    """All of the dollar spent: a delegate call is answered with the refusal, no child."""
    record = _started()
    effects = _turn(record, _delegate("c1"), cost=1.0)
    assert not effects.children
    assert record.awaiting is not None
    result = next(iter(record.awaiting.results.values()), None)
    # the refusal is the call's result, or, once observed, the conversation's last message
    text = record.conversation.messages[-1].content if result is None else result.content
    assert "no money left" in text


def test_a_critics_call_carries_the_money_left_and_its_exhaustion_ends_the_step() -> None:
    """The step's answer goes to its critic with what the task has left after the worker's
    $0.60; a critic call not sent for want of money fails the task like the worker's."""
    critic = {"agent": "rev", "rubric": "r", "provider": PRICED, "system_prompt": "judge"}
    data = {
        "goal": "g",
        "provider": PRICED,
        "steps": [{"id": "s", "instruction": "i", "critic": critic}],
        "limits": {"max_cost_usd": 1.0},
    }
    record = TaskRecord(task_id="c", spec=parse_task(data), created_at=0.0, updated_at=0.0)
    _apply(record, lambda m: m.start(), now=1.0)
    effects = _answer(record, 0.6)
    (request,) = effects.reason_dispatches
    assert request.purpose == "critic"
    assert request.config.max_cost_usd == pytest.approx(0.4)
    _not_sent(record)
    assert record.status is TaskStatus.FAILED
    assert record.error is not None and record.error.startswith("budget exhausted")
