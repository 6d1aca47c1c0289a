"""Review of branch ``stag2`` (rule 12: the model's stale turns may NUDGE behind the step gate).

A Magentic-One style progress ledger answers ``is_progress_being_made: false`` while nothing
has been done yet ("we have just started"): :func:`self_report` reads it as stuck. With rule
12 two such turns at a task's very start, before any tool ran, put a NUDGE in the model's
conversation (``apply_verdict`` pushes the message on the escalation). The cases rule 12 was
kept for (``58``: reports at 9, 13 after tool results) all had tool results behind them."""

from __future__ import annotations

from shared.stagnation.config import StagnationLevel
from shared.stagnation.detector import StagnationDetector
from shared.stagnation.plans import ModelTurn

LEDGER = (
    '{"is_request_satisfied": {"reason": "nothing done yet", "answer": false}, '
    '"is_in_loop": {"reason": "we have just started", "answer": false}, '
    '"is_progress_being_made": {"reason": "no step has run yet", "answer": false}, '
    '"next_speaker": {"reason": "%s", "answer": "WebSurfer"}}'
)


def test_no_nudge_reaches_the_model_before_any_tool_result() -> None:
    detector = StagnationDetector()
    verdicts = [
        detector.observe_turn(ModelTurn.from_message(LEDGER % reason))
        for reason in ("search the web for the paper", "open the first result")
    ]
    assert detector.counters()["total_steps"] == 0  # no tool event at all
    nudged = [v for v in verdicts if v.escalated and v.level is not StagnationLevel.NONE]
    assert not nudged, f"a NUDGE in the task's first turns, before any tool ran: {nudged}"
