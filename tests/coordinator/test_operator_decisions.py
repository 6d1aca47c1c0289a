"""The state machine's answers to what operators meet: configuration errors, the workspace a
task keeps, and the journal entries of escalations and review decisions."""

from __future__ import annotations

from typing import Any

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.state import StepStatus, TaskRecord, TaskStatus
from shared.protocol import WorkerFailedMessage
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
