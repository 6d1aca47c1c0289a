"""A self-report that no result answered stands when the model speaks again.

Hard Who&When ``37``'s shape: the ledger says the team loops and hands the search to the
Assistant, a model with no tool, which answers "I will perform a web search ... Please hold on
a moment"; the ledger says it loops again. Nothing from the world came back between the two
reports, so nothing contradicted the first: it counts once more at the reply
(``plan_unanswered``), as a report corroborated by a result that tells nothing new does.
"""

from __future__ import annotations

import time

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
OFF = NO_GATE.model_copy(update={"plan_unanswered": False})
STUCK = ModelTurn(
    text="Try searching for the transcript of 'Human Origins 101' to identify what #9 is.",
    stuck=True,
)
REPLY = ModelTurn(
    text="I will perform a web search for the transcript and check what #9 refers to. "
    "Please hold on a moment while I gather the information."
)


def _page() -> ToolEvent:
    """The search page the run's first request got (news: it starts the mark)."""
    return ToolEvent(
        tool_name="WebSurfer",
        arguments={"request": "search"},
        output="Search results: Human Origins 101 National Geographic video, 4.1M views",
        kind=ToolKind.READ,
    )


def test_a_report_answered_by_a_reply_alone_climbs_a_round_earlier() -> None:
    """Report, reply, report: NUDGE at the reply, REPLAN at the second report (without the
    rule: nothing at the reply, NUDGE at the second report)."""
    levels = {}
    for name, config in (("on", NO_GATE), ("off", OFF)):
        detector = StagnationDetector(config)
        detector.observe(_page())
        steps = [detector.observe_turn(turn) for turn in (STUCK, REPLY, STUCK)]
        levels[name] = [verdict.level for verdict in steps]
        if name == "on":
            assert steps[1].escalated
            assert steps[1].reason_codes == (ReasonCode.SELF_REPORTED_STALL,)
            assert detector.counters()["stale_turns"] == 3
    assert levels["on"] == [StagnationLevel.NONE, StagnationLevel.NUDGE, StagnationLevel.REPLAN]
    assert levels["off"] == [StagnationLevel.NONE, StagnationLevel.NONE, StagnationLevel.NUDGE]


def test_a_result_between_closes_the_report() -> None:
    """A page with news after the report answers it: the reply after that page is a fresh plan
    after news, which takes one off, as before the rule."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page())
    detector.observe_turn(STUCK)
    detector.observe(
        ToolEvent(
            tool_name="WebSurfer",
            arguments={"request": "transcript"},
            output="Transcript: the Australopithecus, Homo habilis, Homo erectus, Neanderthals",
            kind=ToolKind.READ,
        )
    )
    detector.observe_turn(REPLY)
    assert detector.counters()["stale_turns"] == 0


def test_only_a_plan_that_says_nothing_of_its_progress_stands_for_it() -> None:
    """A next turn that says it progresses contradicts the report; another report counts by
    itself, not twice; a word too short to compare ("TERMINATE") says nothing."""
    progressing = ModelTurn(text=REPLY.text, stuck=False)
    for second, stale_turns in ((progressing, 1), (STUCK, 2), (ModelTurn(text="TERMINATE"), 1)):
        detector = StagnationDetector(NO_GATE)
        detector.observe(_page())
        detector.observe_turn(STUCK)
        detector.observe_turn(second)
        assert detector.counters()["stale_turns"] == stale_turns, second.text


def test_the_report_counts_once_more_only_once() -> None:
    """Two replies after one report: the first stands for it, the second adds nothing."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page())
    other = ModelTurn(text="The Monterey Bay Aquarium lists the lengths of its animals.")
    for turn in (STUCK, REPLY, other):
        detector.observe_turn(turn)
    assert detector.counters()["stale_turns"] == 2


def test_an_unanswered_report_survives_a_restore() -> None:
    """The open report is saved: a restored detector counts the reply as the original does."""
    original = StagnationDetector(NO_GATE)
    original.observe(_page())
    original.observe_turn(STUCK)
    restored = StagnationDetector.from_state(NO_GATE, original.to_state())
    verdicts = [detector.observe_turn(REPLY) for detector in (original, restored)]
    assert original.counters() == restored.counters()
    assert restored.counters()["stale_turns"] == 2
    assert verdicts[0] == verdicts[1]


def test_the_unanswered_report_costs_well_under_a_millisecond() -> None:
    """The turn that stands for a report (one more pass over the signals, then the turn's
    own): well under 1 ms of CPU per turn."""
    rounds = 200
    detectors = []
    for _ in range(rounds):
        detector = StagnationDetector(NO_GATE)
        detector.observe(_page())
        detector.observe_turn(STUCK)
        detectors.append(detector)
    started = time.process_time()
    for detector in detectors:
        detector.observe_turn(REPLY)
    per_turn = (time.process_time() - started) / rounds
    assert all(detector.counters()["stale_turns"] == 2 for detector in detectors)
    print(f"unanswered report: {per_turn * 1e6:.0f} µs of CPU per turn")
    assert per_turn < 1e-3


def _call_turn(text: str) -> ModelTurn:
    return ModelTurn.from_message(text, [("WebSurfer", '{"request": "transcript"}')])


def _same_page_again() -> ToolEvent:
    """Another hash of the first page (a re-render): new to the output side, nothing new to
    the model (the plan memory's mark does not move)."""
    return ToolEvent(
        tool_name="WebSurfer",
        arguments={"request": "transcript"},
        output="Search results: Human Origins 101 National Geographic video, 4.1M views .",
        kind=ToolKind.READ,
    )


def test_a_turn_with_calls_keeps_the_report_open_for_its_first_result() -> None:
    """Report, then a turn that proposes a call (the coordinator's order: a report with no
    call is followed by a turn before any result): that turn does not count the report; the
    call's result decides. A result that tells nothing new corroborates the report (one more
    stale turn); with the rule off the call's turn closes the report, as before."""
    counts = {}
    for name, config in (("on", NO_GATE), ("off", OFF)):
        detector = StagnationDetector(config)
        detector.observe(_page())
        detector.observe_turn(STUCK)
        detector.note_turn(_call_turn(REPLY.text))
        assert detector.counters()["stale_turns"] == 1, name  # not counted at the turn
        detector.observe(_same_page_again())
        counts[name] = detector.counters()["stale_turns"]
    assert counts == {"on": 2, "off": 1}


def test_a_turn_of_calls_alone_keeps_the_report_open_too() -> None:
    """A turn too short to compare that proposes a call also leaves the report to its result."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page())
    detector.observe_turn(STUCK)
    detector.note_turn(_call_turn(""))
    assert detector.counters()["stale_turns"] == 1
    detector.observe(_same_page_again())
    assert detector.counters()["stale_turns"] == 2


def test_a_report_the_host_answered_does_not_stand() -> None:
    """The host injected its own message after the report (a NUDGE, a new step) and says so
    (``report_answered``): the model's next plan, with no call, answers that message, and the
    report is not counted once more; the counts and the level stay."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(_page())
    detector.observe_turn(STUCK)
    before = detector.counters()
    detector.report_answered()
    assert detector.counters() == before
    verdict = detector.observe_turn(REPLY)
    assert detector.counters()["stale_turns"] == 1
    assert not verdict.escalated
    restored = StagnationDetector.from_state(NO_GATE, detector.to_state())
    assert restored.counters() == detector.counters()
