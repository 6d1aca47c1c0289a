"""The machine's side of approving one call: a held call's review opened beside the turn's
other calls, decided approve / edit / reject / abort, its deadline default, and the record kept
through a restart (a JSON round trip)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.state import AwaitKind, TaskRecord, TaskStatus
from shared.actions import Observation, ToolCallAction
from shared.approval import ArgumentsError, HeldCall
from shared.conversation import ConversationMessage
from shared.events import JOURNAL_TEXT_CHARS, CallDecided, CallHeld
from shared.inference import ToolCall, Usage
from shared.protocol import ReasonedMessage, ToolObservedMessage
from shared.redaction import REDACTED, Redactor
from shared.task_spec import parse_task

SETTINGS = MachineSettings(observation_deadline_s=10.0, workspace_root="/ws")
SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
    "required": ["command"],
}
PUSH = ToolCallAction(call_id="c1", name="run_command", arguments='{"command":"git push"}')
LIST = ToolCallAction(call_id="c2", name="file_list", arguments="{}")


def _apply(record: TaskRecord, now: float, step: Any) -> Effects:
    effects: Effects = step(TaskMachine(record, now, SETTINGS))
    return effects


def _held_turn(default: str = "abort") -> tuple[TaskRecord, Effects]:
    """A started task whose model proposed a push (held) and a listing (approved)."""
    spec = parse_task(
        {
            "goal": "ship it",
            "steps": [{"id": "ship", "instruction": "push the branch"}],
            "review": {"deadline": "60s", "default_decision": default},
        }
    )
    record = TaskRecord(task_id="t1", spec=spec, created_at=0.0, updated_at=0.0)
    _apply(record, 1.0, lambda m: m.start())
    assert record.awaiting is not None
    calls = [PUSH, LIST]
    message = ReasonedMessage(
        fence=record.awaiting.fence,
        usage=Usage(total_tokens=10),
        new_messages=[
            ConversationMessage.assistant_tool_calls(
                [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls]
            )
        ],
        actions=calls,
        approved_calls=[LIST],
        held_calls=[HeldCall(call=PUSH, reason="rule says ask", input_schema=SCHEMA)],
    )
    return record, _apply(record, 2.0, lambda m: m.on_reasoned(message))


def _observe(record: TaskRecord, call_id: str, content: str, now: float = 3.0) -> Effects:
    assert record.awaiting is not None
    observation = Observation(source="tool", content=content, call_id=call_id)
    message = ToolObservedMessage(
        fence=record.awaiting.fence.for_call(call_id), observation=observation
    )
    return _apply(record, now, lambda m: m.on_tool_observed(message))


def _review_id(record: TaskRecord) -> str:
    assert record.review is not None and record.review.source == "call"
    return record.review.review_id


def test_held_call_opens_a_review_while_the_other_runs() -> None:
    """The push is held under a call review; the listing is dispatched at once."""
    record, effects = _held_turn()
    assert [d.action.call_id for d in effects.tool_dispatches] == ["c2"]
    assert record.status is TaskStatus.AWAITING_REVIEW
    assert [r.source for r in effects.reviews] == ["call"]
    item = effects.reviews[0]
    assert item.call == PUSH and item.input_schema == SCHEMA
    assert item.snapshot["call"] == {
        "tool": "run_command",
        "call_id": "c1",
        "arguments": {"command": "git push"},
    }
    types = [e.event.type for e in effects.journal]
    assert "CallHeld" in types and "Escalated" in types
    assert [e["event"] for e in effects.events] == ["escalated"]
    # The listing answers while the push waits: the iteration is not observed yet.
    _observe(record, "c2", "a.txt")
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.TOOLS
    assert record.status is TaskStatus.AWAITING_REVIEW


def test_approved_call_is_dispatched_then_the_turn_observed() -> None:
    """Approve: the held call goes out as proposed; both results join the conversation."""
    record, _ = _held_turn()
    _observe(record, "c2", "a.txt")
    effects = _apply(
        record, 4.0, lambda m: m.on_review_decision(_review_id(record), "approve", None, "ann")
    )
    assert [d.action for d in effects.tool_dispatches] == [PUSH]
    assert record.status is TaskStatus.RUNNING and record.review is None
    assert effects.events[0]["event"] == "review_decided"
    decided = [e.event for e in effects.journal if e.event.type == "CallDecided"]
    assert decided[0].model_dump(include={"decision", "decided_by", "arguments_after"}) == {
        "decision": "approve",
        "decided_by": "ann",
        "arguments_after": None,
    }
    effects = _observe(record, "c1", "pushed", now=5.0)
    assert effects.reason_dispatches  # the next iteration
    tool_results = [m.content for m in record.conversation.messages if m.role.value == "tool"]
    assert tool_results == ["pushed", "a.txt"]


def test_edited_call_runs_with_the_new_arguments() -> None:
    """Edit: checked against the schema; the call runs with the reviewer's arguments, the
    journal has both versions."""
    record, _ = _held_turn()
    edited = '{"command":"git push origin review"}'
    effects = _apply(
        record, 4.0, lambda m: m.on_review_decision(_review_id(record), "edit", None, "ann", edited)
    )
    assert [json.loads(d.action.arguments) for d in effects.tool_dispatches] == [
        {"command": "git push origin review"}
    ]
    assert [d.edited_by for d in effects.tool_dispatches] == ["ann"]  # gated again
    (decided,) = [e.event for e in effects.journal if e.event.type == "CallDecided"]
    assert decided.arguments_before == '{"command":"git push"}'  # type: ignore[union-attr]
    assert json.loads(decided.arguments_after or "") == {"command": "git push origin review"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ('{"command": 3}', "at 'command': 3 is not of type 'string'"),
        ('{"timeout_s": 1}', "'command' is a required property"),
        ("[1]", "must be a JSON object"),
        ("{oops", "are not JSON"),
    ],
)
def test_bad_edit_is_refused_and_nothing_changes(arguments: str, error: str) -> None:
    """A bad edit raises naming the field; the call stays held, nothing is dispatched."""
    record, _ = _held_turn()
    review_id = _review_id(record)
    before = record.model_dump_json()
    with pytest.raises(ValueError, match=error):
        _apply(
            record, 4.0, lambda m: m.on_review_decision(review_id, "edit", None, "ann", arguments)
        )
    assert record.model_dump_json() == before


def test_schema_error_is_an_arguments_error() -> None:
    """The edit's refusal is an ArgumentsError (a ValueError the service reports)."""
    record, _ = _held_turn()
    with pytest.raises(ArgumentsError):
        _apply(
            record, 4.0, lambda m: m.on_review_decision(_review_id(record), "edit", None, "a", "{}")
        )


def test_rejected_call_result_is_the_reviewers_message() -> None:
    """Reject: nothing runs; the model reads the message as the call's result."""
    record, _ = _held_turn()
    _observe(record, "c2", "a.txt")
    effects = _apply(
        record,
        4.0,
        lambda m: m.on_review_decision(_review_id(record), "reject", "push to a branch", "ann"),
    )
    assert not effects.tool_dispatches and effects.reason_dispatches
    results = {
        m.tool_call_id: m.content for m in record.conversation.messages if m.role.value == "tool"
    }
    assert results["c1"] == "[Error] [Rejected by reviewer ann] push to a branch"


def test_step_decisions_do_not_apply_to_a_held_call() -> None:
    """retry/skip/revise are refused for a call review; edit/reject for a step review."""
    record, _ = _held_turn()
    with pytest.raises(ValueError, match="holds one tool call"):
        _apply(record, 4.0, lambda m: m.on_review_decision(_review_id(record), "retry", None, "a"))


def test_abort_ends_the_task_and_closes_the_review() -> None:
    """Abort: the task ends aborted; the running call's result is not waited for."""
    record, _ = _held_turn()
    _apply(record, 4.0, lambda m: m.on_review_decision(_review_id(record), "abort", None, "a"))
    assert record.status is TaskStatus.ABORTED and record.review is None


def test_deadline_rejects_unless_the_default_aborts() -> None:
    """At the deadline a held call is rejected (default retry/skip) or the task aborted
    (default abort); a call is never run without a human."""
    record, _ = _held_turn(default="skip")
    _observe(record, "c2", "a.txt")
    assert record.next_deadline() == pytest.approx(62.0)
    assert not _apply(record, 30.0, lambda m: m.on_tick()).changed
    effects = _apply(record, 62.5, lambda m: m.on_tick())
    assert not effects.tool_dispatches and effects.reason_dispatches
    results = [m.content for m in record.conversation.messages if m.role.value == "tool"]
    assert "no reviewer decided on this call before its deadline" in results[0]
    (decided,) = [e.event for e in effects.journal if e.event.type == "CallDecided"]
    assert decided.decided_by == "deadline"  # type: ignore[union-attr]
    record, _ = _held_turn(default="abort")
    _apply(record, 62.5, lambda m: m.on_tick())
    assert record.status is TaskStatus.ABORTED


def test_held_call_survives_a_restart() -> None:
    """The record (stored as JSON) keeps the held call and its review: a decision applied to
    the record read back works as on the original."""
    record, _ = _held_turn()
    restored = TaskRecord.model_validate_json(record.model_dump_json())
    restored.conversation = record.conversation
    review_id = _review_id(restored)
    effects = _apply(restored, 4.0, lambda m: m.on_review_decision(review_id, "approve", None, "a"))
    assert [d.action for d in effects.tool_dispatches] == [PUSH]


def test_cancel_closes_the_held_review() -> None:
    """A cancelled task closes its held calls' reviews (the open-review list drops them)."""
    record, _ = _held_turn()
    review_id = _review_id(record)
    effects = _apply(record, 4.0, lambda m: m.cancel("stop"))
    assert {"event": "review_closed", "review_id": review_id}.items() <= next(
        e for e in effects.events if e["event"] == "review_closed"
    ).items()


def test_held_and_decided_call_arguments_are_redacted_and_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CallHeld and CallDecided journal a call's arguments, the reason, the reviewer's
    arguments and message: a secret in any of them is redacted, and each is capped at
    JOURNAL_TEXT_CHARS (as GateModified and a tool's result are)."""
    secret = "sk-held-call-secret-0123456789abcdef"
    settings = MachineSettings(
        observation_deadline_s=10.0, workspace_root="/ws", journal_redactor=Redactor([secret])
    )
    monkeypatch.setattr(sys.modules[__name__], "SETTINGS", settings)
    long_push = ToolCallAction(
        call_id="c1",
        name="run_command",
        arguments=json.dumps({"command": f"curl -H 'x: {secret}' " + "x" * 5000}),
    )
    monkeypatch.setattr(sys.modules[__name__], "PUSH", long_push)
    record, effects = _held_turn()
    (held,) = [e.event for e in effects.journal if isinstance(e.event, CallHeld)]
    assert secret not in held.arguments and REDACTED in held.arguments
    assert len(held.arguments) == JOURNAL_TEXT_CHARS
    edited = json.dumps({"command": f"echo {secret}"})
    effects = _apply(
        record,
        4.0,
        lambda m: m.on_review_decision(_review_id(record), "edit", f"use {secret}", "ann", edited),
    )
    (decided,) = [e.event for e in effects.journal if isinstance(e.event, CallDecided)]
    texts = [decided.arguments_before, decided.arguments_after or "", decided.message or ""]
    assert all(secret not in text for text in texts), texts
    assert len(decided.arguments_before) == JOURNAL_TEXT_CHARS
    assert decided.arguments_after is not None and REDACTED in decided.arguments_after
