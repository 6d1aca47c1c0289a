"""A self-report corroborated by its result, and the model's NUDGE behind the step gate.

Who&When ``39``'s shape: the ledger says it loops, WebSurfer clicks the same link again and the
page comes back re-rendered (another hash, nothing new to read), the ledger says it loops again.
``58``'s: the same, from the run's first rounds, where the step gate held every rung.
"""

from __future__ import annotations

import json

from shared.stagnation import (
    ModelTurn,
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)

NO_GATE = StagnationConfig(min_steps=0)
STUCK = ModelTurn(text="We are in a loop: the databases page shows no genome link.", stuck=True)
PAGE = (
    "I clicked 'Links to NCBI Databases'. Here is a screenshot of the page: Machine learning "
    "tools, Databases, Genome data viewer, Downloads, Submit data, Help and support{}"
)


def _page(noise: str) -> ToolEvent:
    """The same page as WebSurfer returns it: another hash each time, the same text but a
    word of OCR noise (a near-duplicate: no news for the model's side)."""
    return ToolEvent(
        tool_name="WebSurfer",
        arguments={"request": "Open the genome section"},
        output=PAGE.format(noise),
        kind=ToolKind.READ,
    )


def _news(index: int) -> ToolEvent:
    """A page with content words never shown before."""
    words = " ".join(f"{word}{index}x" for word in ("alpha", "bravo", "delta", "kilo", "oscar"))
    return ToolEvent(
        tool_name="WebSurfer",
        arguments={"request": f"search {index}"},
        output=f"Search results for query {index}: {words}",
        kind=ToolKind.READ,
    )


def _rounds(detector: StagnationDetector, results: list[ToolEvent]) -> list[StagnationLevel]:
    """The ledger says it loops, then the result of its instruction comes back; per round, the
    level after the result."""
    levels = []
    for result in results:
        detector.observe_turn(STUCK)
        levels.append(detector.observe(result).level)
    return levels


def test_a_result_that_tells_nothing_new_after_a_self_report_adds_a_stale_turn() -> None:
    """Self-report, re-rendered page (new to the output side, no news to the model's side),
    self-report: three stale turns, REPLAN on the second round's result instead of the third
    round's report."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page(""))  # the page's first showing is news
    detector.observe_turn(STUCK)
    first = detector.observe(_page(" ."))
    assert detector.counters()["stale_turns"] == 2
    assert first.level is StagnationLevel.NUDGE
    assert first.stale_steps == 0, "the output side still counts the page as new"
    second = detector.observe_turn(STUCK)
    assert second.level is StagnationLevel.REPLAN
    assert ReasonCode.SELF_REPORTED_STALL in second.reason_codes


def test_news_after_a_self_report_adds_nothing() -> None:
    """A result with new content words answers the report: the count moves by the reports
    alone (REPLAN at the third, as before)."""
    levels = _rounds(StagnationDetector(NO_GATE), [_news(k) for k in range(3)])
    assert levels == [StagnationLevel.NONE, StagnationLevel.NUDGE, StagnationLevel.REPLAN]


def test_only_the_first_result_after_a_self_report_is_read_for_it() -> None:
    """Three re-rendered pages after one report add one stale turn, not three; a turn that
    does not report itself stuck opens no such wait."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page(""))
    detector.observe_turn(STUCK)
    for noise in (" .", " ,", " ;"):
        detector.observe(_page(noise))
    assert detector.counters()["stale_turns"] == 2
    detector.observe_turn(ModelTurn(text="Please click the genome data viewer link on the page."))
    detector.observe(_page(" :"))
    assert detector.counters()["stale_turns"] == 2


def test_the_model_side_nudges_behind_the_step_gate_but_never_alarms() -> None:
    """Behind the closed gate (four turns and events at most) the stale turns reach NUDGE and
    no further; the fifth turn opens the gate and REPLAN follows."""
    detector = StagnationDetector()  # min_steps 4
    detector.observe_turn(ModelTurn(text="Please open the NCBI databases page for the genome."))
    detector.observe(_page(""))
    levels = _rounds(detector, [_page(noise) for noise in (" .", " ,", " ;")])
    assert levels == [StagnationLevel.NUDGE] * 3, "counted, but held at NUDGE"
    assert detector.observe_turn(STUCK).level is StagnationLevel.REPLAN


LEDGER = (
    '{"is_request_satisfied": {"reason": "nothing done yet", "answer": false}, '
    '"is_in_loop": {"reason": "we have just started", "answer": false}, '
    '"is_progress_being_made": {"reason": "no step has run yet", "answer": false}, '
    '"next_speaker": {"reason": "%s", "answer": "WebSurfer"}}'
)


def test_no_nudge_reaches_the_model_before_any_tool_result() -> None:
    """A Magentic-One style progress ledger answers ``is_progress_being_made: false`` while
    nothing has been done yet ("we have just started"), which :func:`self_report` reads as
    stuck. Two such turns at a task's start, before any tool ran, give no NUDGE: the model's
    stale turns may NUDGE behind the gate only after a tool result since the last milestone or
    the task's start (``58``'s reports at 9 and 13 all follow tool results)."""
    detector = StagnationDetector()
    verdicts = [
        detector.observe_turn(ModelTurn.from_message(LEDGER % reason))
        for reason in ("search the web for the paper", "open the first result")
    ]
    assert detector.counters()["total_steps"] == 0  # no tool event at all
    nudged = [v for v in verdicts if v.escalated and v.level is not StagnationLevel.NONE]
    assert not nudged, f"a NUDGE in the task's first turns, before any tool ran: {nudged}"


def test_after_a_milestone_the_nudge_waits_for_a_tool_result_again() -> None:
    """Behind the gate the model's stale turns NUDGE only once a tool result came in since the
    last milestone: reports right after one raise nothing, the first result lets them."""
    detector = StagnationDetector()
    detector.observe(_news(0))
    detector.milestone("found the paper")
    assert [detector.observe_turn(STUCK).level for _ in range(2)] == [StagnationLevel.NONE] * 2
    detector.observe(_news(1))
    assert detector.observe_turn(STUCK).level is StagnationLevel.NUDGE


def test_the_tool_side_raises_nothing_behind_the_gate() -> None:
    """The same page re-read exactly (stale to the output side) for four steps: NONE."""
    detector = StagnationDetector()
    levels = [detector.observe(_page("")).level for _ in range(4)]
    assert levels == [StagnationLevel.NONE] * 4


def test_a_report_awaiting_its_result_survives_a_restore() -> None:
    """Saved between the self-report and its result, a restored detector reads the result as
    the original does; a state saved before the field existed loads with no report open."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page(""))
    detector.observe_turn(STUCK)
    state = json.loads(json.dumps(detector.to_state()))
    assert state["report_open"] is True
    restored = StagnationDetector.from_state(None, state)
    assert restored.observe(_page(" .")) == detector.observe(_page(" ."))
    assert restored.to_state() == detector.to_state()
    del state["report_open"]
    old = StagnationDetector.from_state(None, state)
    old.observe(_page(" ."))
    assert old.counters()["stale_turns"] == 1, "no report open: the result adds nothing"
