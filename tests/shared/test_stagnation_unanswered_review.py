"""Review of ``plan_unanswered`` (branch stag37): the coordinator's order of events.

In the coordinator a self-report made with no call is always followed by a turn before any
result (nothing was dispatched), and that turn is told to the detector (``note_turn``) before
its own calls' results come back. The rule then counts the report once more at that turn,
before the result that would answer it; and a NUDGE or REPLAN the coordinator injected in
between (the detector never sees it) does not answer the report either.
"""

from __future__ import annotations

from shared.stagnation import (
    ModelTurn,
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)

CONFIG = StagnationConfig()  # the production defaults (min_steps=4, plan_unanswered on)


def _read(index: int) -> ToolEvent:
    """A read whose content words were never shown: news to both sides."""
    words = " ".join(f"{word}{index}q" for word in ("alpha", "bravo", "delta", "kilo", "oscar"))
    return ToolEvent(
        tool_name="file_read",
        arguments={"path": f"src/module_{index}.py"},
        output=f"def handler_{index}():\n    # {words}\n    return configure({index})",
        kind=ToolKind.READ,
    )


def _working(detector: StagnationDetector) -> None:
    """Five reads that each brought news: the step gate is open, nothing is stale."""
    for index in range(5):
        detector.note_turn(
            ModelTurn.from_message(
                f"Reading module {index} to see where the handler is configured.",
                [("file_read", f'{{"path": "src/module_{index}.py"}}')],
            )
        )
        detector.observe(_read(index))
    assert detector.counters()["stale_turns"] == 0


REPORT = ModelTurn.from_message("I have tried every option in the loader and I am stuck.")
LOOP = ModelTurn.from_message("We are going round in circles.")
PLAN = ModelTurn.from_message(
    "I expect settings.py to show the default timeout that the loader reads; reading it now.",
    [("file_read", '{"path": "settings.py"}')],
)


def test_a_report_with_no_call_is_answered_by_the_result_of_the_next_turns_call() -> None:
    """Report (no call), then a turn with a new call whose result is news: the report is
    answered by that result (rule 13: only a result that tells nothing new corroborates it).
    The branch counts the report once more at ``note_turn``, before the result is in, and the
    news that follows takes nothing back: NUDGE on a run whose next step brought news."""
    assert REPORT.stuck is True and PLAN.stuck is None
    detector = StagnationDetector(CONFIG)
    _working(detector)
    assert detector.observe_turn(REPORT).level is StagnationLevel.NONE
    detector.note_turn(PLAN)
    verdict = detector.observe(_read(99))
    assert detector.counters()["stale_turns"] == 1, "news answered the report"
    assert verdict.level is StagnationLevel.NONE


def test_the_plan_that_answers_a_nudge_does_not_raise_replan() -> None:
    """The path the coordinator takes: two reports with no call reach NUDGE, the coordinator
    injects "[progress check] ... state which result you expect", the model does exactly that
    and calls a tool whose result is news. The branch counts the second report once more at
    that plan: REPLAN ("admit this path is dead") for obeying the NUDGE."""
    detector = StagnationDetector(CONFIG)
    _working(detector)
    detector.observe_turn(REPORT)
    nudge = detector.observe_turn(LOOP)
    assert nudge.level is StagnationLevel.NUDGE and nudge.escalated
    detector.note_turn(PLAN)  # the model's answer to the NUDGE, with its call
    verdict = detector.observe(_read(99))  # news
    assert verdict.level is StagnationLevel.NUDGE, verdict.message
    assert not verdict.escalated
