"""Review of ``plan_unanswered`` (branch stag37) through the coordinator's machine.

The path the branch's docs name: the model answers "I am stuck" with no call, gets its NUDGE,
and replies with a plan and a call. The coordinator shows that turn to the detector before the
call runs, and what answered the report (the NUDGE it injected, the end of a step) is invisible
to the detector. Both tests pass on main.
"""

from __future__ import annotations

from coordinator.state import StepStatus, TaskRecord, TaskStatus
from shared.actions import RespondAction
from shared.conversation import ConversationMessage
from shared.inference import ToolCall
from tests.coordinator.test_machine import _apply, _call, _observed, _reasoned, _record, _start


def _turn(record: TaskRecord, text: str, index: int | None = None) -> None:
    """One model response: ``text``, with one read of a new file when ``index`` is given."""
    calls = [] if index is None else [_call(f"c{index}", path=f"src/module_{index}.py")]
    message = _reasoned(
        record,
        new_messages=[
            ConversationMessage.assistant_tool_calls(
                [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls],
                content=text,
            )
            if calls
            else ConversationMessage.assistant(text)
        ],
        actions=list(calls),
        approved_calls=list(calls),
    )
    _apply(record, 2.0, lambda m: m.on_reasoned(message))
    if index is not None:
        words = " ".join(f"{w}{index}q" for w in ("alpha", "bravo", "delta", "kilo", "oscar"))
        content = f"def handler_{index}():\n    # {words}\n    return configure({index})"
        seen = _observed(record, f"c{index}", content, kind="read")
        _apply(record, 3.0 + index, lambda m: m.on_tool_observed(seen))


def _injected(record: TaskRecord, prefix: str) -> int:
    return sum(
        1
        for m in record.conversation.messages
        if m.role.value == "user" and m.content.startswith(prefix)
    )


def test_a_plan_that_answers_the_nudge_and_brings_news_gets_no_replan() -> None:
    """Two reports with no call reach NUDGE ("state which result you expect"); the model does
    that and its call brings news. The branch counts the second report once more at that
    plan (``note_turn``, before the call runs): "[replan required]" for obeying the NUDGE."""
    record = _record(
        steps=[{"id": "explore", "instruction": "find where the timeout is set"}],
        limits={"max_iterations": 200},
    )
    _start(record)
    for index in range(5):
        _turn(record, f"Reading module {index} to see where the handler is configured.", index)
    _turn(record, "I have tried every option in the loader and I am stuck.")
    _turn(record, "We are going round in circles.")
    assert _injected(record, "[progress check]") == 1
    _turn(
        record,
        "I expect module 99 to show the default timeout that the loader reads; reading it.",
        99,
    )
    assert record.status is TaskStatus.RUNNING
    assert _injected(record, "[replan required]") == 0, record.conversation.messages[-1].content


def test_a_report_in_a_finished_steps_answer_does_not_stand_at_the_next_steps_plan() -> None:
    """Step one ends (unverified: no milestone) with an answer that says the model went round
    in circles; the coordinator completes it and starts step two, whose first plan says
    nothing of step one. The branch counts step one's report once more at that plan (nothing
    came back between): the new step opens with a NUDGE quoting two stuck messages."""
    record = _record(
        steps=[
            {"id": "explore", "instruction": "find where the timeout is set"},
            {"id": "fix", "instruction": "raise the timeout"},
        ],
        limits={"max_iterations": 200},
    )
    _start(record)
    for index in range(5):
        _turn(record, f"Reading module {index} to see where the handler is configured.", index)
    text = "We are going round in circles, so here is what I found: module 4 sets the timeout."
    message = _reasoned(
        record,
        new_messages=[ConversationMessage.assistant(text)],
        actions=[RespondAction(content=text)],
        terminal_output=text,
    )
    _apply(record, 20.0, lambda m: m.on_reasoned(message))
    assert record.steps[0].status is StepStatus.COMPLETED
    assert record.steps[1].status is StepStatus.RUNNING
    _turn(record, "Step two: I will raise the timeout in module 4 from 30 to 120 seconds.", 50)
    assert _injected(record, "[progress check]") == 0, record.conversation.messages[-1].content
