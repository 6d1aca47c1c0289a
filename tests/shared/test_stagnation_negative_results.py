"""Negative results and refused re-sends (issue 30, fourth round): the same answer after a new,
distinct edit is an experiment's answer, not a repeat; an identical refused edit reaches REPLAN
at its fifth refusal, not its fourth."""

from __future__ import annotations

from shared.stagnation import (
    ReasonCode,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)
from shared.stagnation.signal import occurrences
from tests.shared.stagnation_samples import warmed_detector

PLACES = ("parse", "load", "render", "save", "close", "flush", "merge")
REPRO = "Initial state: Book one by Author one\nAfter save: Book one by Author one\nBug present"


def _debug_print(place: str) -> ToolEvent:
    """A debug print inserted in another function each time: a new, distinct file state."""
    return ToolEvent(
        tool_name="bash",
        arguments={"command": f"sed -i '/def {place}/a print(\"DEBUG {place}\")' app.py"},
        output="",
        kind=ToolKind.WRITE,
        path="app.py",
        after_hash=f"state-{place}",
    )


def _run(output: str) -> ToolEvent:
    return ToolEvent(
        tool_name="bash",
        arguments={"command": "python repro.py"},
        output=output,
        kind=ToolKind.COMMAND,
        exit_code=0,
    )


def _edit_and_run(output: str, places: tuple[str, ...]) -> list[StagnationLevel]:
    detector = warmed_detector()
    detector.observe(_run(output))
    levels = []
    for place in places:
        detector.observe(_debug_print(place))
        levels.append(detector.observe(_run(output)).level)
    return levels


def test_the_same_answer_after_each_new_edit_is_no_repeat() -> None:
    # Gemini django-16100: a debug print at another place each time, the same output, four
    # runs: the stale window counts them (NUDGE at its 4th), the repeat signal does not
    levels = _edit_and_run(REPRO, PLACES[:4])
    assert max(levels) < StagnationLevel.REPLAN


def test_the_stale_window_still_counts_negative_results() -> None:
    # seven new edits answered the same way: the stale window reaches REPLAN at its seventh
    levels = _edit_and_run(REPRO, PLACES)
    assert levels[-1] is StagnationLevel.REPLAN
    assert levels[3] is StagnationLevel.NUDGE


def test_a_silent_answer_after_each_new_edit_is_still_a_repeat() -> None:
    # doubao databind-4186: println edits, then a script that prints nothing, every time
    detector = warmed_detector()
    detector.observe(_run(""))
    verdict = None
    for place in PLACES[:3]:
        detector.observe(_debug_print(place))
        verdict = detector.observe(_run(""))
    assert verdict is not None and verdict.level is StagnationLevel.REPLAN
    assert ReasonCode.REPEATED_RESULT in verdict.reason_codes


def test_the_same_answer_after_a_re_applied_edit_is_still_a_repeat() -> None:
    # gpt-4o-mini databind-4249: the same edit re-applied, the same mock output each time
    detector = warmed_detector()
    detector.observe(_run(REPRO))
    detector.observe(_debug_print("parse"))
    levels = [detector.observe(_run(REPRO)).level]
    for _ in range(2):
        detector.observe(_debug_print("parse"))
        levels.append(detector.observe(_run(REPRO)).level)
    assert levels[-1] is StagnationLevel.REPLAN


def _refused_edit() -> ToolEvent:
    return ToolEvent(
        tool_name="edit",
        arguments={"command": "edit 1:1\nclass MockParser:\n    def count(self): return self.n"},
        output="Your proposed edit has introduced new syntax error(s).\nE999 IndentationError",
        kind=ToolKind.WRITE,
        path="test_parser.py",
        is_error=True,
    )


def test_an_identical_refused_edit_reaches_replan_at_its_fifth_refusal() -> None:
    # gpt-4o-mini core-380: the same edit refused four times, then a fix: no REPLAN
    detector = warmed_detector()
    levels = [detector.observe(_refused_edit()).level for _ in range(5)]
    assert levels[0] is StagnationLevel.NONE
    assert levels[1:4] == [StagnationLevel.NUDGE] * 3
    assert levels[4] is StagnationLevel.REPLAN


def test_only_a_refused_write_has_its_first_occurrence_uncounted() -> None:
    assert occurrences(_refused_edit(), 4) == 3
    assert occurrences(_refused_edit(), 0) == 0
    assert occurrences(_run(REPRO), 4) == 4
    failed_command = _run("Traceback: boom").model_copy(update={"exit_code": 1})
    assert occurrences(failed_command, 4) == 4
