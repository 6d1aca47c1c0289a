"""The machine's Critics section: the critic's dispatch, its verdicts and replies, the review
decisions on a step's result, redelivery and the deadline default of a critic review."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.state import AwaitKind, StepStatus, TaskRecord, TaskStatus
from shared.actions import RespondAction
from shared.conversation import ConversationMessage
from shared.inference import Usage
from shared.protocol import ReasonedMessage, WorkerFailedMessage
from shared.task_spec import parse_task

SETTINGS = MachineSettings(observation_deadline_s=10.0, max_redeliveries=1, workspace_root="/ws")
CRITIC_PROVIDER = {"kind": "scripted", "replies": ["{}"]}
APPROVE = json.dumps({"verdict": "approve", "reason": "good"})


def _record(**critic: Any) -> TaskRecord:
    reviewer = {"human": True} if critic.pop("human", False) else {"agent": "rev"}
    if "agent" in reviewer:
        reviewer |= {"provider": CRITIC_PROVIDER, "system_prompt": "judge strictly"}
    data = {
        "goal": "write notes",
        "steps": [
            {
                "id": "notes",
                "instruction": "write notes",
                "critic": {**reviewer, "rubric": "names the file", **critic},
            }
        ],
        "review": {"default_decision": "retry"},
    }
    return TaskRecord(task_id="t1", spec=parse_task(data), created_at=0.0, updated_at=0.0)


def _apply(record: TaskRecord, now: float, step: Any) -> Effects:
    effects: Effects = step(TaskMachine(record, now, SETTINGS))
    return effects


def _reply(record: TaskRecord, text: str, now: float = 2.0) -> Effects:
    """The awaited model call (the worker's or the critic's) answers ``text``."""
    assert record.awaiting is not None
    message = ReasonedMessage(
        fence=record.awaiting.fence,
        new_messages=[ConversationMessage.assistant(text)],
        actions=[RespondAction(content=text)],
        terminal_output=text,
        usage=Usage(prompt_tokens=8, completion_tokens=2, total_tokens=10),
    )
    return _apply(record, now, lambda m: m.on_reasoned(message))


def _answered(**critic: Any) -> tuple[TaskRecord, Effects]:
    record = _record(**critic)
    _apply(record, 1.0, lambda m: m.start())
    return record, _reply(record, "I wrote notes.txt")


def test_the_worker_s_answer_goes_to_the_critic_model() -> None:
    """The step's answer is not complete: a critic call goes out with the critic's provider,
    system prompt and the payload, under a fence of its own, counting its own calls."""
    record, effects = _answered()
    assert record.steps[0].status is StepStatus.RUNNING
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.CRITIC
    (request,) = effects.reason_dispatches
    assert request.purpose == "critic"
    assert request.provider.replies == ["{}"]
    assert request.model_calls == 0  # the critic's own script, from its start
    assert request.config.max_iterations > request.fence.iteration  # room for the call
    system, question = request.conversation.messages
    assert system.content == "judge strictly"
    assert "names the file" in question.content and "I wrote notes.txt" in question.content
    assert [e.event.type for e in effects.journal][-1] == "CriticRequested"


def test_approval_completes_the_step_and_counts_the_critic_s_tokens() -> None:
    """An approve verdict completes the step with the worker's result; the critic's usage is
    the task's and the step's."""
    record, _ = _answered()
    effects = _reply(record, APPROVE)
    assert record.status is TaskStatus.COMPLETED
    assert record.output == "I wrote notes.txt"
    assert record.usage.total_tokens == 20 and record.steps[0].usage.total_tokens == 20
    assert record.model_calls == 1 and record.critic_calls == 1
    verdict = next(e.event for e in effects.journal if e.event.type == "CriticVerdict")
    assert verdict.verdict == "approve" and verdict.usage.total_tokens == 10  # type: ignore[union-attr]


def test_a_revision_goes_back_to_the_worker_and_past_max_rounds_escalates() -> None:
    """Revise pushes the reason to the worker; a revise beyond max_rounds escalates with the
    worker's result and the critic's reasons in the review's context."""
    record, _ = _answered(max_rounds=1)
    effects = _reply(record, json.dumps({"verdict": "revise", "reason": "name it"}))
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.REASON
    assert record.conversation.messages[-1].content.endswith("(revision 1 of at most 1): name it")
    assert effects.reason_dispatches[0].purpose == "act"
    _reply(record, "notes.txt, named")
    _reply(record, json.dumps({"verdict": "revise", "reason": "still vague"}))
    assert record.status is TaskStatus.AWAITING_REVIEW
    review = record.review
    assert review is not None and review.source == "critic_escalation"
    payload = review.snapshot["critic"]
    assert payload["result"] == "notes.txt, named"
    assert [v["reason"] for v in payload["verdicts"]] == ["name it", "still vague"]


def test_a_malformed_reply_is_retried_once_with_the_rejection_then_escalates() -> None:
    """The first malformed reply asks the critic again, telling it what was wrong; the second
    escalates; neither crashes nor hangs."""
    record, _ = _answered()
    effects = _reply(record, "fine by me")
    (again,) = effects.reason_dispatches
    assert again.purpose == "critic" and again.model_calls == 1
    assert again.conversation.messages[-1].content.startswith(
        "[Coordinator] Your last reply was rejected: the critic's reply is not a JSON object: "
        "'fine by me'"
    )
    _reply(record, json.dumps({"verdict": "approve"}))
    assert record.status is TaskStatus.AWAITING_REVIEW
    assert record.review is not None and "gave no valid verdict" in record.review.reason
    assert "reason: Field required" in record.review.reason


def test_a_failed_critic_call_is_redispatched_then_escalates_when_dead_lettered() -> None:
    """A worker failure re-sends the same critic request; past the redeliveries, the step
    escalates instead of failing the worker's attempt."""
    record, first = _answered()
    assert record.awaiting is not None
    failed = WorkerFailedMessage(fence=record.awaiting.fence, error="boom")
    effects = _apply(record, 3.0, lambda m: m.on_worker_failed(failed))
    (again,) = effects.reason_dispatches
    assert again.purpose == "critic"
    assert again.conversation == first.reason_dispatches[0].conversation
    assert record.awaiting is not None
    failed = WorkerFailedMessage(fence=record.awaiting.fence, error="boom again")
    _apply(record, 4.0, lambda m: m.on_worker_failed(failed))
    assert record.status is TaskStatus.AWAITING_REVIEW
    assert record.review is not None and record.review.source == "critic_escalation"


def test_a_human_critic_reviews_on_the_queue() -> None:
    """A human critic's review carries the payload; approve completes, revise needs a reason,
    and approve or revise on a review that is not about a result are refused."""
    record, effects = _answered(human=True)
    review = record.review
    assert review is not None and review.source == "critic"
    assert effects.reviews == [review]
    assert review.snapshot["critic"]["critic"] == "human"
    with pytest.raises(ValueError, match="needs its reason"):
        _apply(record, 3.0, lambda m: m.on_review_decision(review.review_id, "revise", " ", "ann"))
    _apply(record, 3.0, lambda m: m.on_review_decision(review.review_id, "approve", None, "ann"))
    assert record.status is TaskStatus.COMPLETED


def test_a_tracker_escalation_after_a_revision_is_not_a_review_of_the_result() -> None:
    """The worker's attempts ran out after a revision: the escalation is the tracker's, with
    no critic payload, and approve is refused on it."""
    record, _ = _answered()
    _reply(record, json.dumps({"verdict": "revise", "reason": "name it"}))

    def stuck(machine: TaskMachine) -> Effects:
        machine.reviews.escalate("tracker", "attempts ran out")
        return machine.done()

    _apply(record, 3.0, stuck)
    review = record.review
    assert review is not None and "critic" not in review.snapshot
    with pytest.raises(ValueError, match="is not about a step's result"):
        _apply(record, 4.0, lambda m: m.on_review_decision(review.review_id, "approve", None, "a"))


def test_approve_is_refused_on_a_review_that_is_not_about_a_result() -> None:
    """A tracker escalation takes retry, skip or abort; approve says so and changes nothing."""
    data = {"goal": "g", "steps": [{"id": "s", "instruction": "x"}]}
    record = TaskRecord(task_id="t1", spec=parse_task(data), created_at=0.0, updated_at=0.0)
    _apply(record, 1.0, lambda m: m.start())

    def stuck(machine: TaskMachine) -> Effects:
        machine.reviews.escalate("tracker", "stuck")
        return machine.done()

    _apply(record, 2.0, stuck)
    review = record.review
    assert review is not None
    before = record.model_dump_json()
    with pytest.raises(ValueError, match="is not about a step's result"):
        _apply(record, 2.0, lambda m: m.on_review_decision(review.review_id, "approve", None, "a"))
    assert record.model_dump_json() == before


def test_the_deadline_default_of_a_human_critic_review_retries_the_step() -> None:
    """Nobody decided: the task's default (retry here) applies, as for any review; the step
    starts a new attempt whose result goes to the critic afresh."""
    record, _ = _answered(human=True)
    review = record.review
    assert review is not None
    _apply(record, review.deadline + 1, lambda m: m.on_tick(liveness=None))
    assert record.status is TaskStatus.RUNNING
    assert record.steps[0].critique is None
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.REASON
