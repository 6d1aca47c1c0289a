"""The state machine's answers to what operators meet: configuration errors, the workspace a
task keeps, and the journal entries of escalations and review decisions."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.state import StepStatus, TaskRecord, TaskStatus
from shared.loop_types import TerminationReason
from shared.protocol import ReasonedMessage, WorkerFailedMessage
from shared.task_spec import parse_task

SETTINGS = MachineSettings(observation_deadline_s=10.0, max_redeliveries=2, workspace_root="/ws")


def _record(**spec: Any) -> TaskRecord:
    data: dict[str, Any] = {"goal": "g", "steps": [{"id": "s", "instruction": "do it"}]}
    data.update(spec)
    return TaskRecord(task_id="t1", spec=parse_task(data), created_at=0.0, updated_at=0.0)


def _apply(
    record: TaskRecord, now: float, step: Any, settings: MachineSettings = SETTINGS
) -> Effects:
    effects: Effects = step(TaskMachine(record, now, settings))
    return effects


def _failed(record: TaskRecord, error: str, **fields: Any) -> WorkerFailedMessage:
    assert record.awaiting is not None
    return WorkerFailedMessage(fence=record.awaiting.fence, error=error, **fields)


def test_a_config_failure_fails_the_task_at_once_with_its_message() -> None:
    """A worker's `config` failure ends the task failed, with the worker's message as the
    task's error, in the step's note and in the journal; no retry and no attempt counted."""
    record = _record(step_iteration={"max_reattempts_per_step": 5})
    _apply(record, 1.0, lambda m: m.start())
    error = "AuthenticationError: openai rejected the API key (HTTP 401); set ORGA_API_KEY"
    message = _failed(record, error, retryable=False, error_kind="config")
    effects = _apply(record, 2.0, lambda m: m.on_worker_failed(message))
    assert record.status is TaskStatus.FAILED
    assert record.error == f"configuration error: {error}"
    assert record.steps[0].status is StepStatus.FAILED
    assert record.steps[0].note == record.error
    assert record.steps[0].attempts == 0
    assert effects.reason_dispatches == []
    terminated = [e.event for e in effects.journal if e.event.type == "Terminated"]
    assert terminated and error in str(terminated[0].model_dump())
    assert [e["event"] for e in effects.events] == ["config_error", "failed"]
    assert "similar" not in (record.error or "")


def test_a_config_failure_of_the_plan_fails_the_task() -> None:
    """A task without steps whose planning call fails on configuration fails at once too."""
    record = _record(steps=[])
    _apply(record, 1.0, lambda m: m.start())
    message = _failed(record, "ScriptError: cannot read the script", error_kind="config")
    _apply(record, 2.0, lambda m: m.on_worker_failed(message))
    assert record.status is TaskStatus.FAILED
    assert record.error == "configuration error: ScriptError: cannot read the script"


def test_an_internal_failure_is_still_redispatched() -> None:
    """Only `config` failures end the task: an internal one is re-sent as before."""
    record = _record()
    _apply(record, 1.0, lambda m: m.start())
    message = _failed(record, "RuntimeError: boom")
    effects = _apply(record, 2.0, lambda m: m.on_worker_failed(message))
    assert record.status is TaskStatus.RUNNING
    assert len(effects.reason_dispatches) == 1


def _escalated(record: TaskRecord) -> Effects:
    """Start the task and fail its only attempt, so that the tracker escalates it."""
    _apply(record, 1.0, lambda m: m.start())
    assert record.awaiting is not None
    failed = ReasonedMessage(
        fence=record.awaiting.fence, termination=TerminationReason.error("tests still fail")
    )
    effects = _apply(record, 2.0, lambda m: m.on_reasoned(failed))
    assert record.status is TaskStatus.AWAITING_REVIEW
    return effects


ESCALATING = {"step_iteration": {"max_reattempts_per_step": 1, "on_limit_reached": "escalate"}}


@pytest.mark.parametrize(
    "elsewhere",
    [MachineSettings(workspace_root="/elsewhere"), MachineSettings()],
    ids=["another root", "the default root"],
)
def test_the_workspace_is_fixed_at_the_start_and_kept_by_a_later_decision(
    elsewhere: MachineSettings,
) -> None:
    """The workspace is recorded when the task starts; a retry decided by a coordinator with
    another workspace root (or the default one) dispatches to the recorded folder."""
    record = _record(**ESCALATING)
    _escalated(record)
    assert record.workspace == "/ws/t1"
    assert record.review is not None
    effects = _apply(
        record,
        3.0,
        lambda m: m.on_review_decision(record.review.review_id, "retry", "look", "alice"),
        settings=elsewhere,
    )
    assert [r.workspace for r in effects.reason_dispatches] == ["/ws/t1"]
    assert record.workspace == "/ws/t1"


def test_a_task_workspace_of_its_own_is_recorded_as_given() -> None:
    """A task that names its workspace keeps that one."""
    record = _record(workspace="/data/mine")
    effects = _apply(record, 1.0, lambda m: m.start())
    assert record.workspace == "/data/mine"
    assert effects.reason_dispatches[0].workspace == "/data/mine"


def test_escalation_and_decision_are_journaled() -> None:
    """The journal gets an Escalated entry (review, source, reason, deadline, default) and a
    ReviewDecided entry (review, decision, who, the hint)."""
    record = _record(**ESCALATING)
    effects = _escalated(record)
    escalated = [e.event for e in effects.journal if e.event.type == "Escalated"]
    assert len(escalated) == 1
    review = record.review
    assert review is not None
    assert escalated[0].model_dump(include={"review_id", "source", "default_decision"}) == {
        "review_id": review.review_id,
        "source": "tracker",
        "default_decision": "abort",
    }
    assert "tests still fail" in escalated[0].reason
    decided = _apply(
        record, 3.0, lambda m: m.on_review_decision(review.review_id, "retry", "try X", "alice")
    )
    entries = [e.event for e in decided.journal if e.event.type == "ReviewDecided"]
    assert [e.model_dump(exclude={"type"}) for e in entries] == [
        {"review_id": review.review_id, "decision": "retry", "decided_by": "alice", "hint": "try X"}
    ]


def test_a_default_decision_at_the_deadline_is_journaled_as_decided_by_the_deadline() -> None:
    """A review left undecided past its deadline gets its default, journaled as decided by
    `deadline`."""
    record = _record(**ESCALATING)
    _escalated(record)
    assert record.review is not None
    late = record.review.deadline + 1
    effects = _apply(record, late, lambda m: m.on_tick())
    decided = [e.event for e in effects.journal if e.event.type == "ReviewDecided"]
    assert [(e.decision, e.decided_by, e.hint) for e in decided] == [("abort", "deadline", None)]
    assert record.status is TaskStatus.ABORTED
