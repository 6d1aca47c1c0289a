"""The coordinator's pure task state machine: fences, steps, verification, limits, reviews."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from coordinator.liveness import Liveness
from coordinator.machine import Effects, MachineSettings, TaskMachine, parse_plan
from coordinator.machine import task as task_module
from coordinator.machine.task import decide
from coordinator.state import AwaitKind, StepStatus, TaskRecord, TaskStatus
from shared.actions import Observation, RespondAction, ToolCallAction
from shared.conversation import ConversationMessage
from shared.inference import ToolCall, Usage
from shared.protocol import ActMode, ReasonedMessage, ToolObservedMessage, WorkerFailedMessage
from shared.task_spec import parse_task
from shared.tracing import task_traceparent

SETTINGS = MachineSettings(observation_deadline_s=10.0, max_redeliveries=2, workspace_root="/ws")


def _record(**spec: Any) -> TaskRecord:
    data: dict[str, Any] = {
        "goal": "fix the bug",
        "steps": [
            {"id": "reproduce", "instruction": "run the tests", "done_when": "false"},
            {"id": "fix", "instruction": "fix it"},
        ],
    }
    data.update(spec)
    return TaskRecord(task_id="t1", spec=parse_task(data), created_at=0.0, updated_at=0.0)


def _apply(record: TaskRecord, now: float, step: Any) -> Effects:
    machine = TaskMachine(record, now, SETTINGS)
    effects: Effects = step(machine)
    return effects


def _start(record: TaskRecord) -> Effects:
    return _apply(record, 1.0, lambda m: m.start())


def _reasoned(record: TaskRecord, **fields: Any) -> ReasonedMessage:
    assert record.awaiting is not None
    return ReasonedMessage(fence=record.awaiting.fence, usage=Usage(total_tokens=10), **fields)


def _call(call_id: str, name: str = "file_read", **arguments: Any) -> ToolCallAction:
    return ToolCallAction(call_id=call_id, name=name, arguments=json.dumps(arguments))


def _tool_turn(record: TaskRecord, *calls: ToolCallAction, **fields: Any) -> Effects:
    message = _reasoned(
        record,
        new_messages=[
            ConversationMessage.assistant_tool_calls(
                [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls]
            )
        ],
        actions=list(calls),
        approved_calls=list(calls),
        **fields,
    )
    return _apply(record, 2.0, lambda m: m.on_reasoned(message))


def _observed(
    record: TaskRecord, call_id: str, content: str, **metadata: str
) -> ToolObservedMessage:
    assert record.awaiting is not None
    observation = Observation(
        source="tool", content=content, call_id=call_id, metadata={"tool_name": "tool", **metadata}
    )
    return ToolObservedMessage(
        fence=record.awaiting.fence.for_call(call_id), observation=observation
    )


def _answer(record: TaskRecord, text: str, now: float = 3.0) -> Effects:
    message = _reasoned(
        record,
        new_messages=[ConversationMessage.assistant(text)],
        actions=[RespondAction(content=text)],
        terminal_output=text,
    )
    return _apply(record, now, lambda m: m.on_reasoned(message))


def _verify_result(record: TaskRecord, exit_code: int, now: float = 4.0) -> Effects:
    assert record.awaiting is not None
    assert record.awaiting.kind is AwaitKind.VERIFY
    call_id = record.awaiting.calls[0].call_id
    message = _observed(record, call_id, f"exit code: {exit_code}", exit_code=str(exit_code))
    return _apply(record, now, lambda m: m.on_tool_observed(message))


def test_start_dispatches_the_first_reasoning_iteration() -> None:
    """A new task with steps starts its first step and waits on a fenced reasoning dispatch."""
    record = _record()
    effects = _start(record)
    assert record.status is TaskStatus.RUNNING
    assert record.steps[0].status is StepStatus.RUNNING
    assert record.awaiting is not None
    assert record.awaiting.kind is AwaitKind.REASON
    assert [r.fence.token() for r in effects.reason_dispatches] == ["t1/reproduce/0/1"]
    assert effects.journal[0].event.type == "Started"
    assert record.conversation.messages[-1].content.startswith("Step 1 of 2 (reproduce)")


def test_tool_calls_are_dispatched_and_observations_applied_once() -> None:
    """Each approved call goes to the tools queue; a duplicate observation changes nothing."""
    record = _record()
    _start(record)
    effects = _tool_turn(record, _call("c1", path="a.py"), _call("c2", path="b.py"))
    assert [r.fence.call_id for r in effects.tool_dispatches] == ["c1", "c2"]
    first = _observed(record, "c1", "content of a", kind="read", content_hash="h1")
    assert _apply(record, 2.5, lambda m: m.on_tool_observed(first)).changed
    assert not _apply(record, 2.6, lambda m: m.on_tool_observed(first)).changed
    second = _observed(record, "c2", "content of b", kind="read", content_hash="h2")
    effects = _apply(record, 2.7, lambda m: m.on_tool_observed(second))
    assert [m.tool_call_id for m in record.conversation.messages[-2:]] == ["c1", "c2"]
    assert len(effects.reason_dispatches) == 1
    assert record.iteration == 1


def test_stale_fence_is_ignored() -> None:
    """An observation for another attempt or iteration is not applied."""
    record = _record()
    _start(record)
    assert record.awaiting is not None
    stale = ReasonedMessage(
        fence=record.awaiting.fence.model_copy(update={"attempt": 7}), terminal_output="done"
    )
    effects = _apply(record, 2.0, lambda m: m.on_reasoned(stale))
    assert not effects.changed
    assert record.awaiting.kind is AwaitKind.REASON


@pytest.mark.parametrize(
    "stale",
    [{"attempt": 7}, {"attempt": 0}, {"iteration": 0}, {"iteration": 2}, {"step_id": "fix"}],
)
def test_stale_fence_of_a_tool_observation_is_ignored(stale: dict[str, Any]) -> None:
    """A tool result for an awaited call id but another attempt, iteration or step (a late
    answer of an earlier dispatch) is not applied; the current one still is."""
    record = _record()
    _start(record)
    _tool_turn(record, _call("c1", path="a.py"))
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.TOOLS
    current = _observed(record, "c1", "current content")
    old = current.model_copy(update={"fence": current.fence.model_copy(update=stale)})
    assert old.fence != current.fence
    effects = _apply(record, 2.5, lambda m: m.on_tool_observed(old))
    assert not effects.changed and not effects.reason_dispatches
    assert record.awaiting.results == {}
    effects = _apply(record, 2.6, lambda m: m.on_tool_observed(current))
    assert len(effects.reason_dispatches) == 1
    assert record.conversation.messages[-1].content == "current content"


def test_journal_sequences_have_no_gap() -> None:
    """Journal entries across transitions carry consecutive sequence numbers."""
    record = _record()
    sequences = [e.sequence for e in _start(record).journal]
    sequences += [e.sequence for e in _tool_turn(record, _call("c1", path="a")).journal]
    message = _observed(record, "c1", "x", kind="read", content_hash="h")
    sequences += [
        e.sequence for e in _apply(record, 3, lambda m: m.on_tool_observed(message)).journal
    ]
    assert sequences == list(range(len(sequences)))
    assert record.journal_seq == len(sequences)


def test_done_when_makes_a_verified_milestone() -> None:
    """An answer runs the step's check; exit code as expected completes the step, verified."""
    record = _record()
    _start(record)
    effects = _answer(record, "reproduced")
    assert record.awaiting is not None
    assert record.awaiting.kind is AwaitKind.VERIFY
    check = effects.tool_dispatches[0]
    assert check.purpose == "verify"
    assert check.action.name == "run_command"
    assert json.loads(check.action.arguments)["command"] == "false"
    _verify_result(record, exit_code=0)
    assert record.steps[0].status is StepStatus.COMPLETED
    assert record.steps[0].verified
    assert record.milestones == ["step:reproduce"]
    assert record.steps[1].status is StepStatus.RUNNING


def test_task_completes_after_the_last_step() -> None:
    """A step without done_when completes on the answer; the task output is the last answer."""
    record = _record()
    _start(record)
    _answer(record, "reproduced")
    _verify_result(record, exit_code=0)
    effects = _answer(record, "fixed it")
    assert record.status is TaskStatus.COMPLETED
    assert record.output == "fixed it"
    assert record.steps[1].verified is False
    assert any(e["event"] == "completed" for e in effects.events)
    assert record.awaiting is None


def test_failed_verification_is_fed_back_and_retried() -> None:
    """A failing check tells the model why and counts an attempt."""
    record = _record(step_iteration={"max_reattempts_per_step": 3})
    _start(record)
    _answer(record, "reproduced")
    effects = _verify_result(record, exit_code=1)
    assert record.steps[0].attempts == 1
    assert "[Verification failed]" in record.conversation.messages[-2].content
    assert len(effects.reason_dispatches) == 1
    events = [e.event for e in effects.journal]
    assert [e.type for e in events] == ["VerificationRun", "AttemptFailed"]
    run, failed = events
    assert (run.command, run.exit_code, run.expected, run.passed) == ("false", 1, 0, False)  # type: ignore[union-attr]
    assert failed.attempt == 1 and "exited with 1" in failed.error  # type: ignore[union-attr]


def test_repeated_identical_failures_skip_the_step() -> None:
    """The tracker stops a step whose consecutive errors are the same: the default skips it."""
    record = _record(step_iteration={"max_reattempts_per_step": 10})
    _start(record)
    _answer(record, "reproduced")
    _verify_result(record, exit_code=1)
    _answer(record, "reproduced again", now=5.0)
    effects = _verify_result(record, exit_code=1, now=6.0)
    assert record.steps[0].status is StepStatus.SKIPPED
    assert "appears stuck" in (record.steps[0].note or "")
    assert any(e.event.type == "StepLimitReached" for e in effects.journal)
    assert record.steps[1].status is StepStatus.RUNNING


def test_limit_action_escalate_opens_a_review_and_retry_hint_reaches_the_model() -> None:
    """on_limit_reached=escalate waits for a human; --retry with a hint resumes the step."""
    record = _record(step_iteration={"max_reattempts_per_step": 1, "on_limit_reached": "Escalate"})
    _start(record)
    _answer(record, "reproduced")
    effects = _verify_result(record, exit_code=1)
    assert record.status is TaskStatus.AWAITING_REVIEW
    review = effects.reviews[0]
    assert review.source == "tracker"
    assert review.snapshot["goal"] == "fix the bug"
    effects = _apply(
        record, 7.0, lambda m: m.on_review_decision(review.review_id, "retry", "try X", "alice")
    )
    assert record.status is TaskStatus.RUNNING
    assert record.conversation.messages[-1].content == "[Human reviewer] try X"
    assert len(effects.reason_dispatches) == 1


def test_abort_decision_keeps_milestones() -> None:
    """Aborting from review ends the task but keeps the verified milestones reached."""
    record = _record(
        steps=[
            {"id": "a", "instruction": "one", "done_when": "true"},
            {"id": "b", "instruction": "two", "done_when": "true"},
        ],
        step_iteration={"max_reattempts_per_step": 1, "on_limit_reached": "escalate"},
    )
    _start(record)
    _answer(record, "a done")
    _verify_result(record, exit_code=0)
    _answer(record, "b done", now=5.0)
    effects = _verify_result(record, exit_code=3, now=6.0)
    review_id = effects.reviews[0].review_id
    _apply(record, 7.0, lambda m: m.on_review_decision(review_id, "abort", None, "bob"))
    assert record.status is TaskStatus.ABORTED
    assert record.milestones == ["step:a"]
    assert record.result()["steps"][0]["verified"] is True


def test_undecided_review_takes_its_default_at_the_deadline() -> None:
    """An escalation nobody decides takes the configured default decision."""
    record = _record(
        step_iteration={"max_reattempts_per_step": 1, "on_limit_reached": "escalate"},
        review={"deadline": "30s", "default_decision": "skip"},
    )
    _start(record)
    _answer(record, "reproduced")
    _verify_result(record, exit_code=1)
    assert not _apply(record, 20.0, lambda m: m.on_tick()).changed
    _apply(record, 40.0, lambda m: m.on_tick())
    assert record.steps[0].status is StepStatus.SKIPPED
    assert record.status is TaskStatus.RUNNING


def test_deadline_redispatches_with_a_new_attempt_then_dead_letters() -> None:
    """A late observation is re-dispatched with attempt+1; after the limit it is dead-lettered."""
    record = _record(step_iteration={"max_reattempts_per_step": 5})
    _start(record)
    first = record.awaiting.fence.attempt  # type: ignore[union-attr]
    effects = _apply(record, 12.0, lambda m: m.on_tick())
    assert [r.fence.attempt for r in effects.reason_dispatches] == [first + 1]
    effects = _apply(record, 23.0, lambda m: m.on_tick())
    assert [r.fence.attempt for r in effects.reason_dispatches] == [first + 2]
    effects = _apply(record, 34.0, lambda m: m.on_tick())
    assert effects.dead_letters
    assert "no observation after 3 dispatches" in effects.dead_letters[0]["error"]
    assert record.steps[0].attempts == 1


def test_worker_failure_is_redispatched() -> None:
    """A retryable worker failure re-dispatches at once with a new attempt."""
    record = _record()
    _start(record)
    assert record.awaiting is not None
    failed = WorkerFailedMessage(fence=record.awaiting.fence, error="boom")
    effects = _apply(record, 2.0, lambda m: m.on_worker_failed(failed))
    assert [r.fence.attempt for r in effects.reason_dispatches] == [failed.fence.attempt + 1]
    journaled = effects.journal[0].event
    assert journaled.type == "DispatchFailed" and journaled.retried  # type: ignore[union-attr]
    assert journaled.error == "boom"  # type: ignore[union-attr]
    assert not _apply(record, 2.1, lambda m: m.on_worker_failed(failed)).changed


def test_inference_termination_counts_as_a_failed_attempt() -> None:
    """A reasoning iteration that ended the loop (e.g. inference failed) is a failed attempt."""
    record = _record(step_iteration={"max_reattempts_per_step": 1})
    _start(record)
    message = _reasoned(record, termination={"kind": "error", "message": "Inference failed: 500"})
    effects = _apply(record, 2.0, lambda m: m.on_reasoned(message))
    assert record.steps[0].status is StepStatus.SKIPPED
    failed = next(e.event for e in effects.journal if e.event.type == "AttemptFailed")
    assert "Inference failed: 500" in failed.error  # type: ignore[union-attr]


def test_wandering_escalates_to_review_through_the_detector() -> None:
    """Reads that bring nothing new raise the detector's level until it asks a human."""
    record = _record(
        steps=[{"id": "explore", "instruction": "find the bug"}],
        limits={"max_iterations": 200},
    )
    _start(record)
    events: list[Effects] = []
    for index in range(60):
        if record.status is not TaskStatus.RUNNING:
            break
        call = _call(f"c{index}", path="same.py", start_line=index)
        _tool_turn(record, call)
        seen = _observed(record, call.call_id, "same content", kind="read", content_hash="same")
        events.append(_apply(record, 10.0 + index, lambda m, s=seen: m.on_tool_observed(s)))
    assert record.status is TaskStatus.AWAITING_REVIEW
    assert record.review is not None
    assert record.review.source == "detector"
    kinds = [e.event.type for effects in events for e in effects.journal]
    assert "StagnationDetected" in kinds
    nudges = [m.content for m in record.conversation.messages if m.role.value == "user"]
    assert any("REPLAN" in text.upper() or "plan" in text.lower() for text in nudges[2:])


def test_planning_without_steps() -> None:
    """A task without steps asks the model for a plan, falling back to one step."""
    record = _record(steps=[])
    effects = _start(record)
    assert record.status is TaskStatus.PLANNING
    assert effects.reason_dispatches[0].purpose == "plan"
    plan = '{"steps": [{"id": "s1", "instruction": "do a"}, {"id": "s2", "instruction": "do b"}]}'
    message = _reasoned(record, terminal_output=plan)
    _apply(record, 2.0, lambda m: m.on_reasoned(message))
    assert [s.spec.id for s in record.steps] == ["s1", "s2"]
    assert record.status is TaskStatus.RUNNING


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"steps": [{"id": "a", "instruction": "x"}]}', ["a"]),
        ('Here is the plan: [{"id": "a", "instruction": "x"}]', []),
        ('```json\n{"steps": [{"id": "b", "instruction": "y"}]}\n```', ["b"]),
        ("no plan at all", []),
        ('{"steps": [{"id": "a", "instruction": "x"}, {"id": "a", "instruction": "y"}]}', []),
    ],
)
def test_parse_plan(text: str, expected: list[str]) -> None:
    """Plans are read from JSON; anything unusable gives no steps (the caller falls back)."""
    assert [s.id for s in parse_plan(text)] == expected


def test_record_round_trips_through_json() -> None:
    """The record (tracker and detector state) survives a JSON round trip; its conversation
    is not in it (the store keeps it apart, append-only)."""
    record = _record()
    _start(record)
    _tool_turn(record, _call("c1", path="a"))
    restored = TaskRecord.model_validate_json(record.model_dump_json())
    assert len(restored.conversation) == 0 < len(record.conversation)
    restored.conversation = record.conversation
    assert restored == record


def test_escalate_recovery_strategy_opens_a_review() -> None:
    """A tool call whose Escalate recovery fired turns into a review item (source recovery)."""
    record = _record()
    _start(record)
    _tool_turn(record, _call("c1", name="web_fetch", url="https://example.com"))
    message = _observed(record, "c1", "fetch failed", kind="other").model_copy(
        update={"escalation_reason": "web_fetch: connection refused"}
    )
    effects = _apply(record, 3.0, lambda m: m.on_tool_observed(message))
    assert record.status is TaskStatus.AWAITING_REVIEW
    assert effects.reviews[0].source == "recovery"
    assert effects.reviews[0].reason == "web_fetch: connection refused"


def test_pre_hydration_dispatches_gated_resolutions() -> None:
    """References in the goal are resolved through the tools queue (gated) before reasoning."""
    record = _record(
        goal="fix ./calc.py as described in https://example.com/issue",
        pre_hydration={"resolution_tools": {"file": "file_read"}},
    )
    effects = _start(record)
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.PREHYDRATE
    (request,) = effects.tool_dispatches
    assert request.gated and request.purpose == "prehydrate"
    assert json.loads(request.action.arguments) == {"input": "./calc.py"}
    message = _observed(record, request.action.call_id, "def add(a, b): ...")
    effects = _apply(record, 2.0, lambda m: m.on_tool_observed(message))
    context = record.conversation.messages[-1]
    assert context.content.startswith("[PRE_HYDRATED_CONTEXT]")
    assert "(1 reference could not be resolved)" in context.content
    assert [e.event.type for e in effects.journal] == ["PreHydrationComplete"]
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.REASON


def test_inline_act_observes_in_the_same_transition() -> None:
    """With tool_dispatch: inline the reasoned message carries the outcomes: no tool dispatch."""
    record = _record(tool_dispatch="inline")
    effects = _start(record)
    assert effects.reason_dispatches[0].act is ActMode.INLINE
    call = _call("c1", path="a.py")
    acted = ToolObservedMessage(
        fence=record.awaiting.fence.for_call("c1"),  # type: ignore[union-attr]
        observation=Observation(source="file_read", content="x", call_id="c1"),
    )
    message = _reasoned(
        record,
        new_messages=[
            ConversationMessage.assistant_tool_calls([ToolCall(id="c1", name="file_read")])
        ],
        actions=[call],
        approved_calls=[call],
        acted=[acted],
    )
    effects = _apply(record, 2.0, lambda m: m.on_reasoned(message))
    assert not effects.tool_dispatches
    assert len(effects.reason_dispatches) == 1
    assert record.conversation.messages[-1].tool_call_id == "c1"
    kinds = [e.event.type for e in effects.journal]
    assert kinds == [
        "ReasoningComplete",
        "PolicyEvaluated",
        "ToolsDispatched",
        "ObservationsCollected",
    ]


def test_tool_dispatch_is_bounded_by_max_concurrent_tools() -> None:
    """At most max_concurrent_tools calls are in flight; the next goes out when one answers."""
    record = _record(limits={"max_concurrent_tools": 2})
    _start(record)
    calls = [_call(f"c{i}", path=f"f{i}") for i in range(5)]
    effects = _tool_turn(record, *calls)
    assert [r.fence.call_id for r in effects.tool_dispatches] == ["c0", "c1"]
    first = _observed(record, "c0", "zero", kind="read", content_hash="h0")
    effects = _apply(record, 2.5, lambda m: m.on_tool_observed(first))
    assert [r.fence.call_id for r in effects.tool_dispatches] == ["c2"]


def test_a_task_whose_every_step_was_skipped_failed() -> None:
    """Skipping every step is not a success: the task ends failed, with the reason."""
    record = _record(
        steps=[{"id": "only", "instruction": "x", "done_when": "false"}],
        step_iteration={"max_reattempts_per_step": 1},
    )
    _start(record)
    _answer(record, "done?")
    _verify_result(record, exit_code=1)
    assert record.status is TaskStatus.FAILED
    assert "all 1 were skipped" in (record.error or "")


def test_cancel_while_waiting_for_review_closes_the_review() -> None:
    """Cancelling an escalated task aborts it and closes its open review."""
    record = _record(step_iteration={"max_reattempts_per_step": 1, "on_limit_reached": "escalate"})
    _start(record)
    _answer(record, "reproduced")
    review_id = _verify_result(record, exit_code=1).reviews[0].review_id
    effects = _apply(record, 9.0, lambda m: m.cancel("operator said so"))
    assert record.status is TaskStatus.ABORTED and record.review is None
    assert {"event": "review_closed", "review_id": review_id} == {
        k: v for k, v in effects.events[0].items() if k in ("event", "review_id")
    }


def test_the_plan_fence_cannot_collide_with_a_step() -> None:
    """The planning call's fence uses a step id no real step can have."""
    record = _record(steps=[])
    effects = _start(record)
    fence_step = effects.reason_dispatches[0].fence.step_id
    with pytest.raises(ValueError, match=r"steps\.0\.id"):
        parse_task({"goal": "g", "steps": [{"id": fence_step, "instruction": "x"}]})


def test_operators_can_refuse_inline_tools() -> None:
    """With allow_inline_tools off, a task's tool_dispatch: inline goes to the tools queue."""
    record = _record(tool_dispatch="inline")
    settings = MachineSettings(workspace_root="/ws", allow_inline_tools=False)
    effects = TaskMachine(record, 1.0, settings).start()
    assert effects.reason_dispatches[0].act is ActMode.CHAIN


def test_cancelling_an_ended_task_changes_nothing() -> None:
    """A cancel that arrives after the end is ignored (no new version, no event)."""
    record = _record()
    _start(record)
    _apply(record, 2.0, lambda m: m.cancel("first"))
    assert not _apply(record, 3.0, lambda m: m.cancel("again")).changed


def test_pre_hydration_resolutions_go_out_in_one_dispatch() -> None:
    """All of a task's resolutions travel together, to run concurrently in one worker."""
    record = _record(
        goal="see ./a.py and ./b.py",
        pre_hydration={"resolution_tools": {"file": "file_read"}},
    )
    (request,) = _start(record).tool_dispatches
    assert [request.action.call_id, *[c.call_id for c in request.also]] == [
        "prehydrate_0",
        "prehydrate_1",
    ]
    first = _observed(record, "prehydrate_0", "a")
    assert not _apply(record, 2.0, lambda m: m.on_tool_observed(first)).tool_dispatches
    second = _observed(record, "prehydrate_1", "b")
    effects = _apply(record, 2.1, lambda m: m.on_tool_observed(second))
    assert effects.reason_dispatches


def _chained_turn(record: TaskRecord, chained: list[str], *calls: ToolCallAction) -> Effects:
    return _tool_turn(record, *calls, chained=chained)


def _early(record: TaskRecord, call_id: str, content: str) -> ToolObservedMessage:
    """What a tool worker sends for a chained call, before the ``reasoned`` message is applied."""
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.REASON
    observation = Observation(source="tool", content=content, call_id=call_id)
    fence = record.awaiting.fence.acting().for_call(call_id)
    return ToolObservedMessage(fence=fence, observation=observation)


def test_reasoning_dispatches_ask_the_worker_to_chain_the_tool_calls() -> None:
    """By default the reasoning worker runs read-only calls and sends the others on
    (``auto``); in queue mode it sends them all on; never for a plan, nor inline, nor when the
    coordinator is configured not to."""
    default = _record()
    (request,) = _start(default).reason_dispatches
    assert request.act is ActMode.AUTO and default.awaiting is not None
    assert default.awaiting.chained

    reads_off = TaskMachine(
        _record(), 1.0, MachineSettings(workspace_root="/ws", inline_read_tools=False)
    )
    (request,) = reads_off.start().reason_dispatches
    assert request.act is ActMode.CHAIN

    record = _record(tool_dispatch="queue")
    (request,) = _start(record).reason_dispatches
    assert request.act is ActMode.CHAIN and record.awaiting is not None and record.awaiting.chained
    call = _call("c1", path="a.py")
    assert request.tool_request(call).fence == request.fence.acting().for_call("c1")
    assert request.tool_request(call).fence.iteration == request.fence.iteration + 1

    inline = _record(tool_dispatch="inline")
    (request,) = _start(inline).reason_dispatches
    assert request.act is ActMode.INLINE

    planned = _record(steps=[])
    (request,) = _start(planned).reason_dispatches
    assert request.purpose == "plan" and request.act is ActMode.COORDINATOR

    off = TaskMachine(_record(), 1.0, MachineSettings(workspace_root="/ws", chain_tools=False))
    (request,) = off.start().reason_dispatches
    assert request.act is ActMode.COORDINATOR


def test_chained_calls_are_not_dispatched_again_and_their_results_apply() -> None:
    """The coordinator awaits the calls the worker sent, under the fence they carry."""
    record = _record()
    _start(record)
    asked = record.awaiting
    assert asked is not None
    effects = _chained_turn(record, ["c1"], _call("c1", path="a.py"))
    assert effects.tool_dispatches == []
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.TOOLS
    assert record.awaiting.fence == asked.fence.acting()
    assert record.awaiting.dispatched == ["c1"]
    effects = _apply(
        record, 2.5, lambda m: m.on_tool_observed(_observed(record, "c1", "content of a"))
    )
    assert len(effects.reason_dispatches) == 1
    assert [m.content for m in record.conversation.messages if m.tool_call_id] == ["content of a"]


def test_calls_beyond_the_concurrency_limit_are_dispatched_by_the_coordinator() -> None:
    """The worker chains at most max_concurrent_tools; the rest follow as results come in."""
    record = _record(limits={"max_concurrent_tools": 1})
    _start(record)
    calls = [_call("c1", path="a.py"), _call("c2", path="b.py")]
    effects = _chained_turn(record, ["c1"], *calls)
    assert effects.tool_dispatches == []
    effects = _apply(record, 2.5, lambda m: m.on_tool_observed(_observed(record, "c1", "a")))
    assert [r.fence.call_id for r in effects.tool_dispatches] == ["c2"]
    assert record.awaiting is not None
    assert effects.tool_dispatches[0].fence == record.awaiting.fence.for_call("c2")


def test_a_result_that_overtakes_its_reasoned_message_is_kept_until_it_applies() -> None:
    """Another coordinator may apply the tool result first: it waits, then counts."""
    record = _record()
    _start(record)
    early = _early(record, "c1", "content of a")
    effects = _apply(record, 1.5, lambda m: m.on_tool_observed(early))
    assert effects.changed and effects.reason_dispatches == []
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.REASON
    assert not _apply(record, 1.6, lambda m: m.on_tool_observed(early)).changed

    effects = _chained_turn(record, ["c1"], _call("c1", path="a.py"))
    assert len(effects.reason_dispatches) == 1, "all results were in: next iteration at once"
    assert [m.content for m in record.conversation.messages if m.tool_call_id] == ["content of a"]


def test_results_of_an_abandoned_reasoning_dispatch_are_ignored() -> None:
    """After a re-dispatch the old chain's results no longer match the awaited fence."""
    record = _record()
    _start(record)
    early = _early(record, "c1", "stale")
    _apply(record, 20.0, lambda m: m.on_tick())  # deadline: re-dispatched under a new attempt
    assert not _apply(record, 20.5, lambda m: m.on_tool_observed(early)).changed
    failed = WorkerFailedMessage(fence=early.fence, error="boom")
    assert not _apply(record, 20.6, lambda m: m.on_worker_failed(failed)).changed


def test_a_chained_result_for_a_call_the_model_did_not_make_is_dropped() -> None:
    """An early result is checked against the iteration's calls when they are known."""
    record = _record()
    _start(record)
    _apply(record, 1.5, lambda m: m.on_tool_observed(_early(record, "zz", "forged")))
    effects = _chained_turn(record, ["c1"], _call("c1", path="a.py"))
    assert effects.reason_dispatches == []
    assert record.awaiting is not None and list(record.awaiting.results) == []


def test_a_reasoning_answered_with_its_chained_call_is_observed_at_once() -> None:
    """A lone chained call comes back inside its ``reasoned`` message (``acted``)."""
    record = _record()
    _start(record)
    assert record.awaiting is not None and record.awaiting.chained
    call = _call("c1", path="a.py")
    observed = ToolObservedMessage(
        fence=record.awaiting.fence.acting().for_call("c1"),
        observation=Observation(source="tool", content="content of a", call_id="c1"),
    )
    effects = _tool_turn(record, call, acted=[observed])
    assert effects.tool_dispatches == [] and len(effects.reason_dispatches) == 1
    assert [m.content for m in record.conversation.messages if m.tool_call_id] == ["content of a"]


def test_a_result_kept_for_an_abandoned_reasoning_is_dropped_with_it() -> None:
    """A result that arrived early for a reasoning dispatch that was then re-sent does not
    answer the new reasoning's call of the same id."""
    record = _record()
    _start(record)
    _apply(record, 1.5, lambda m: m.on_tool_observed(_early(record, "c1", "stale")))
    _apply(record, 20.0, lambda m: m.on_tick())  # deadline: the reasoning is re-sent
    assert record.awaiting is not None and record.awaiting.results == {}
    effects = _chained_turn(record, ["c1"], _call("c1", path="a.py"))
    assert effects.reason_dispatches == [], "c1 is awaited, not answered by the stale result"
    assert record.awaiting is not None and record.awaiting.missing_calls()


def _live(record: TaskRecord, score: float | None, depth: int = 0, drain: float = 0.0) -> Liveness:
    ids = TaskMachine(record, 0.0, SETTINGS).liveness_ids()
    return Liveness(
        scores=dict.fromkeys(ids, score),
        queue="orga.reasoning",
        queue_depth=depth,
        drain_per_s=drain,
    )


def test_a_running_dispatch_is_not_re_sent_at_its_deadline() -> None:
    """Past the deadline with a fresh heartbeat: the deadline moves on, nothing is re-sent."""
    record = _start_and_get(_record())
    fence = record.awaiting.fence  # type: ignore[union-attr]
    effects = _apply(record, 12.0, lambda m: m.on_tick(_live(record, 11.0)))
    assert effects.changed and effects.reason_dispatches == []
    assert record.awaiting is not None and record.awaiting.fence == fence
    assert record.awaiting.deadline == 11.0 + SETTINGS.liveness.heartbeat_timeout_s


def test_a_queued_dispatch_is_not_re_sent_while_its_queue_drains() -> None:
    """Not started, queue deep and moving: wait for the queue, re-send nothing."""
    record = _start_and_get(_record())
    effects = _apply(record, 12.0, lambda m: m.on_tick(_live(record, None, depth=500, drain=5.0)))
    assert effects.reason_dispatches == []
    assert record.awaiting is not None and record.awaiting.deadline == 12.0 + 200.0


def test_a_dispatch_whose_worker_stopped_heartbeating_is_re_sent_once() -> None:
    """A stale heartbeat: re-sent with a new attempt, and a dispatch_lost event says why."""
    record = _start_and_get(_record())
    first = record.awaiting.fence.attempt  # type: ignore[union-attr]
    effects = _apply(record, 100.0, lambda m: m.on_tick(_live(record, 2.0)))
    assert [r.fence.attempt for r in effects.reason_dispatches] == [first + 1]
    assert any(e["event"] == "dispatch_lost" for e in effects.events)


def test_a_reasoning_request_carries_the_look_its_dispatch_set() -> None:
    """The first look at a reasoning dispatch travels with it (a worker that starts it before
    then leaves the task's look alone), on the first dispatch and on a re-send."""
    record = _record()
    first = _start(record).reason_dispatches[0]
    assert record.awaiting is not None
    assert first.look_at == record.awaiting.deadline == 1.0 + SETTINGS.observation_deadline_s
    again = _apply(record, 100.0, lambda m: m.on_tick(_live(record, 2.0))).reason_dispatches[0]
    assert again.fence != first.fence
    assert again.look_at == record.awaiting.deadline == 100.0 + SETTINGS.observation_deadline_s


def test_a_look_a_started_worker_brought_forward_is_taken() -> None:
    """Queued behind a long queue (next look at 212 s), then started: the worker brought the
    task's look to one timeout after its start, and that tick looks (a fresh beat: the next
    look one timeout after it; a stale one: re-sent), instead of waiting for 212 s."""
    record = _start_and_get(_record())
    _apply(record, 12.0, lambda m: m.on_tick(_live(record, None, depth=500, drain=5.0)))
    assert record.awaiting is not None and record.awaiting.deadline == 212.0
    timeout = SETTINGS.liveness.heartbeat_timeout_s
    effects = _apply(record, 20.0 + timeout, lambda m: m.on_tick(_live(record, 48.0)))
    assert effects.changed and effects.reason_dispatches == []
    assert record.awaiting.deadline == 48.0 + timeout
    fence = record.awaiting.fence
    effects = _apply(record, 48.0 + timeout, lambda m: m.on_tick(_live(record, 48.0)))
    assert [r.fence.attempt for r in effects.reason_dispatches] == [fence.attempt + 1]
    assert any(e["event"] == "dispatch_lost" for e in effects.events)


def test_an_early_tick_of_a_dispatch_not_started_changes_nothing() -> None:
    """Due before its record's look with no beat of its own (another fence's start moved
    the task's look): nothing is judged, no unstarted look is counted."""
    record = _start_and_get(_record())
    _apply(record, 12.0, lambda m: m.on_tick(_live(record, None, depth=500, drain=5.0)))
    effects = _apply(record, 50.0, lambda m: m.on_tick(_live(record, None, depth=0)))
    assert not effects.changed
    assert record.awaiting is not None and record.awaiting.deadline == 212.0
    assert record.awaiting.unstarted_looks == 0


def _start_and_get(record: TaskRecord) -> TaskRecord:
    _start(record)
    return record


def test_a_record_of_the_old_escalation_layout_still_loads() -> None:
    """An awaited dispatch stored with its escalation inside ``results`` keeps it, typed."""
    from coordinator.state import Awaiting

    old = {
        "kind": "tools",
        "fence": {"task_id": "t", "step_id": "s", "iteration": 1, "attempt": 1},
        "deadline": 1.0,
        "results": {
            "c1": {"source": "file_read", "content": "ok"},
            "__escalation__:c1": {"source": "recovery", "content": "disk full", "is_error": True},
        },
    }
    awaiting = Awaiting.model_validate(old)
    assert list(awaiting.results) == ["c1"]
    assert awaiting.escalations == {"c1": "disk full"}


def test_the_live_detector_is_handed_on_only_while_the_record_holds_its_snapshot() -> None:
    """The next input of a record gets the detector whose snapshot the record holds (no
    restore); a record parsed again, or an input that took it and did not finish, restores
    from the snapshot; the live detector's state is the snapshot's."""
    record = _record()
    _start(record)
    first = TaskMachine(record, 1.0, SETTINGS)
    live = first.detector
    first.done()
    second = TaskMachine(record, 2.0, SETTINGS)
    assert second.detector is live
    assert live.to_state() == record.detector
    third = TaskMachine(record, 3.0, SETTINGS)
    assert third.detector is not live  # taken by `second`, which never finished
    third.done()
    reparsed = TaskRecord.model_validate_json(record.model_dump_json())
    fourth = TaskMachine(reparsed, 4.0, SETTINGS)
    assert fourth.detector is not third.detector
    assert fourth.detector.to_state() == third.detector.to_state()


def _decided(record: TaskRecord, now: float, step: Any, settings: MachineSettings) -> Effects:
    return decide(TaskMachine(record, now, settings), step)


def test_every_dispatch_is_built_carrying_the_deciding_spans_traceparent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reasoning and tool requests leave ``decide`` with the traceparent of the span that
    decided them: the task root's without an SDK, the ``orga.decide`` span's with one."""
    record = _record()
    root = task_traceparent("t1")
    assert root is not None
    effects = _decided(record, 1.0, lambda m: m.start(), SETTINGS)
    assert [r.trace_parent for r in effects.reason_dispatches] == [root]
    monkeypatch.setattr(task_module, "tracing_installed", lambda: True)
    monkeypatch.setattr(task_module, "traceparent", lambda span: "00-decide-span-01")
    calls = [_call("c1", path="a.py"), _call("c2", path="b.py")]
    message = _reasoned(
        record,
        new_messages=[
            ConversationMessage.assistant_tool_calls(
                [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls]
            )
        ],
        actions=calls,
        approved_calls=calls,
    )
    effects = _decided(record, 2.0, lambda m: m.on_reasoned(message), SETTINGS)
    assert [t.trace_parent for t in effects.tool_dispatches] == ["00-decide-span-01"] * 2


def test_a_request_by_reference_is_built_with_the_epoch_and_copied_only_when_it_moves() -> None:
    """A reasoning request that reads the stored conversation names the record's epoch when
    built; ``stamped`` leaves it as it is when the commit keeps that epoch, and names the new
    one (a copy) when the commit moved it."""
    record = _record()
    record.conversation_epoch = 3
    settings = replace(SETTINGS, conversation_by_reference=True)
    effects = _decided(record, 1.0, lambda m: m.start(), settings)
    (request,) = effects.reason_dispatches
    assert request.conversation_ref is not None and request.conversation_ref.epoch == 3
    effects.stamped(3)
    assert effects.reason_dispatches[0] is request
    effects.stamped(4)
    (moved,) = effects.reason_dispatches
    assert moved.conversation_ref is not None and moved.conversation_ref.epoch == 4
    assert moved.model_dump(exclude={"conversation_ref"}) == request.model_dump(
        exclude={"conversation_ref"}
    )


def test_a_request_by_reference_carries_the_conversation_from_the_last_assistant_turn() -> None:
    """The tail a reasoning request carries: the messages from the last assistant turn on
    (where a worker that ran the previous turn stopped reading), all of them before the first
    turn, none when those take more than TAIL_MAX_BYTES in the Celery message."""
    from coordinator.machine.reasoning import TAIL_MAX_BYTES, conversation_tail

    system, user = ConversationMessage.system("s"), ConversationMessage.user("goal")
    turn = ConversationMessage.assistant_tool_calls([ToolCall(id="c1", name="file_read")])
    result = ConversationMessage.tool_result("c1", "file_read", "text")
    assert conversation_tail([system, user]) == [system, user]
    assert conversation_tail([ConversationMessage.user("x" * TAIL_MAX_BYTES), user]) == []
    assert conversation_tail([system, user, turn, result]) == [turn, result]
    again = ConversationMessage.assistant("done")
    assert conversation_tail([system, user, turn, result, again]) == [again]
    big = ConversationMessage.tool_result("c1", "file_read", "x" * TAIL_MAX_BYTES)
    assert conversation_tail([system, user, turn, big]) == []
    record = _record()
    settings = replace(SETTINGS, conversation_by_reference=True)
    _decided(record, 1.0, lambda m: m.start(), settings)
    record.conversation.push(turn)
    record.conversation.push(result)
    machine = TaskMachine(record, 2.0, settings)
    request = machine.reasoning.request(machine.fence(), record.conversation, purpose="act")
    ref = request.conversation_ref
    assert ref is not None and ref.tail == [turn, result]
    assert ref.tail_start == ref.length - 2


def _tail_wire_bytes(messages: list[ConversationMessage]) -> int:
    """The tail's bytes in the Celery message the relay sends (the request's JSON is the one
    argument of the task, serialized again by kombu's JSON)."""
    from coordinator.machine.reasoning import conversation_tail
    from shared.protocol import ConversationRef

    tail = conversation_tail(messages)
    ref = ConversationRef(length=len(messages), tail=tail)
    return len(json.dumps([ref.model_dump_json()]).encode())


@pytest.mark.parametrize("text", ["é" * 16_000, "😀" * 16_000])
def test_a_tail_of_non_ascii_text_stays_within_16_kib(text: str) -> None:
    """Review of branch ``worker``: docs/protocol.md and docs/performance.md say the tail is
    bounded to 16 KiB. 16,000 characters of non-ASCII text are 32 or 64 KB of UTF-8, and 96 or
    192 KB once the request is a task argument: the tail should not be carried then."""
    from coordinator.machine.reasoning import TAIL_MAX_BYTES

    messages = [
        ConversationMessage.user("goal"),
        ConversationMessage.assistant("reading"),
        ConversationMessage.tool_result("call_1", "file_read", text),
    ]
    assert _tail_wire_bytes(messages) <= 2 * TAIL_MAX_BYTES


def test_a_tail_of_many_empty_results_stays_within_16_kib() -> None:
    """Review of branch ``worker``: empty contents count nothing in a bound on characters: a
    turn of 2,000 calls whose results are empty is a 220 KB tail, carried whole."""
    from coordinator.machine.reasoning import TAIL_MAX_BYTES

    calls = [
        ConversationMessage.tool_result(f"call_{i:04d}", "file_write", "") for i in range(2_000)
    ]
    messages = [ConversationMessage.user("goal"), ConversationMessage.assistant("writing"), *calls]
    assert _tail_wire_bytes(messages) <= 2 * TAIL_MAX_BYTES


def test_a_tail_s_size_is_what_its_messages_take_in_the_celery_message() -> None:
    """``tail_wire_bytes`` is a message's share of the task's argument as kombu sends it (its
    JSON, escaped again, and a comma after it: the last one's is a byte over), so a tail that
    fits is carried however its text is written, and one a byte over is not."""
    from coordinator.machine.reasoning import TAIL_MAX_BYTES, conversation_tail, tail_wire_bytes
    from shared.protocol import ConversationRef

    turn = ConversationMessage.assistant('say "é😀"\n\x01\\ \u2028\x7f')
    results = [
        ConversationMessage.tool_result(f"c{i}", "file_read", 'é😀"\t中\\' * i) for i in range(3)
    ]
    for message in [turn, *results]:
        assert tail_wire_bytes(message) == len(json.dumps(message.model_dump_json())) - 1
    tail = [turn, *results]
    empty = len(json.dumps([ConversationRef(length=4).model_dump_json()]))
    carried = len(json.dumps([ConversationRef(length=4, tail=tail).model_dump_json()]))
    assert carried - empty == sum(tail_wire_bytes(m) for m in tail) - 1  # no comma after the last
    assert conversation_tail(tail) == tail
    pad = ConversationMessage.tool_result("c9", "file_read", "")
    fill = TAIL_MAX_BYTES - sum(tail_wire_bytes(m) for m in tail) - tail_wire_bytes(pad)
    fits = pad.model_copy(update={"content": "x" * fill})
    assert sum(tail_wire_bytes(m) for m in [*tail, fits]) == TAIL_MAX_BYTES
    assert conversation_tail([*tail, fits]) == [*tail, fits]
    over = pad.model_copy(update={"content": "x" * (fill - 1) + "é"})
    assert conversation_tail([*tail, over]) == []
