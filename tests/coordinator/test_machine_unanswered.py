"""``plan_unanswered`` through the coordinator's machine: what answers a report made with no call.

A report with no call is always followed by a turn before any result. When that turn proposes a
call, the detector leaves the report to the call's first result; when it does not, the report
stands at it, unless the coordinator answered the report itself in between: it injected the
ladder's NUDGE or REPLAN, or started the next step (``StagnationDetector.report_answered``).
"""

from __future__ import annotations

from coordinator.state import StepStatus, TaskRecord
from shared.actions import RespondAction
from shared.conversation import ConversationMessage
from shared.stagnation import StagnationDetector
from tests.coordinator.test_machine import _apply, _reasoned, _record, _start
from tests.coordinator.test_machine_unanswered_review import _injected, _turn


def _stale_turns(record: TaskRecord) -> int:
    detector = StagnationDetector.from_state(record.spec.stagnation, record.detector)
    return int(detector.counters()["stale_turns"])


def _working(steps: list[dict[str, str]]) -> TaskRecord:
    record = _record(steps=steps, limits={"max_iterations": 200})
    _start(record)
    for index in range(5):
        _turn(record, f"Reading module {index} to see where the handler is configured.", index)
    assert _stale_turns(record) == 0
    return record


STEP = {"id": "explore", "instruction": "find where the timeout is set"}


def test_a_plan_with_no_call_after_an_unanswered_report_still_counts_it() -> None:
    """The rule still works in the coordinator: a report with no call, then a plan with no
    call and nothing injected between: the report counts once more at the plan (NUDGE)."""
    record = _working([STEP])
    _turn(record, "I have tried every option in the loader and I am stuck.")
    assert _stale_turns(record) == 1
    assert _injected(record, "[progress check]") == 0
    _turn(record, "I will look at the loader's configuration once more before anything else.")
    assert _stale_turns(record) == 2
    assert _injected(record, "[progress check]") == 1


def test_a_plan_with_no_call_that_answers_the_nudge_gets_no_replan() -> None:
    """Two reports with no call reach NUDGE; the coordinator injects it and answers the report.
    The model's answer, a plan with no call, is not counted as the report once more."""
    record = _working([STEP])
    _turn(record, "I have tried every option in the loader and I am stuck.")
    _turn(record, "We are going round in circles.")
    assert _injected(record, "[progress check]") == 1
    stale = _stale_turns(record)
    _turn(record, "I expect the settings module to show the default timeout the loader reads.")
    assert _stale_turns(record) == stale
    assert _injected(record, "[replan required]") == 0, record.conversation.messages[-1].content


def test_a_plan_with_no_call_at_the_next_step_does_not_count_the_last_steps_report() -> None:
    """Step one ends (unverified) with an answer that reports a loop; the coordinator starts
    step two and answers the report: step two's first plan, with no call, counts nothing."""
    record = _working([STEP, {"id": "fix", "instruction": "raise the timeout"}])
    text = "We are going round in circles, so here is what I found: module 4 sets the timeout."
    message = _reasoned(
        record,
        new_messages=[ConversationMessage.assistant(text)],
        actions=[RespondAction(content=text)],
        terminal_output=text,
    )
    _apply(record, 20.0, lambda m: m.on_reasoned(message))
    assert record.steps[1].status is StepStatus.RUNNING
    stale = _stale_turns(record)
    _turn(record, "Step two: I will raise the timeout in module 4 from 30 to 120 seconds.")
    assert _stale_turns(record) == stale
    assert _injected(record, "[progress check]") == 0, record.conversation.messages[-1].content
