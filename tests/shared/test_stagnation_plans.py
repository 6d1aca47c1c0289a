"""The model's side of the stagnation detector: re-issued plans and self-reports (issue 13)."""

from __future__ import annotations

import json

import pytest

from shared.conversation import ConversationMessage, MessageRole
from shared.inference import ToolCall
from shared.stagnation import (
    ModelTurn,
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)
from shared.stagnation.novelty import MAX_SEEN_WORDS
from shared.stagnation.plans import plan_of, self_report
from tests.shared.test_stagnation_trajectories import read

NO_GATE = StagnationConfig(min_steps=0)
ASK = "Please press CONTINUE on the FedEx rate form to get the price of the envelope to New York."
ASK_AGAIN = "Please press CONTINUE on the FedEx rate form to get the price for the envelope to NYC."


def _page(noise: str) -> ToolEvent:
    """The same form, re-rendered: one OCR word differs, so the text is new every time."""
    form = "Calculate Shipping Rates | FedEx Brazil\nFrom: Rio de Janeiro  To: New York\n" * 3
    return ToolEvent(
        tool_name="web_surfer",
        arguments={"request": "continue"},
        output=f"{form}OCR: {noise}\n[ CONTINUE ]",
        kind=ToolKind.READ,
    )


NEWS = (
    "Economy: the envelope costs BRL one hundred and ten, delivery in six days.",
    "International Priority is sold out for this route on the chosen date.",
    "Customs: documents only, no declaration needed for paper under half a kilo.",
    "Pickup in Copacabana is available on weekdays before five in the afternoon.",
    "The insurance option adds a flat fee; it is optional for documents.",
    "Payment by card only; the quote is valid for twenty-four hours.",
)


def _ledger(looping: bool, progressing: bool) -> str:
    return json.dumps(
        {
            "is_in_loop": {"reason": "-", "answer": looping},
            "is_progress_being_made": {"reason": "-", "answer": progressing},
            "instruction_or_question": {"reason": "-", "answer": ASK},
        }
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_ledger(looping=True, progressing=True), True),
        (_ledger(looping=False, progressing=False), True),
        (_ledger(looping=False, progressing=True), False),
        ("I'm stuck: every build fails the same way.", True),
        ("We are going round in circles: the form never changes.", True),
        ("The test process is stuck on a lock; I will kill it.", None),
        ("So, I am stuck.\nLet me re-read the issue.", True),
        ("If I cannot modify the tests, I am stuck.", None),
        ("I am stuck on why it worked before.", None),
        ("So we are stuck with `pk_val` being set.", None),
        ("Let me read the parser next.", None),
    ],
)
def test_self_report_reads_ledgers_and_plain_statements(text: str, expected: bool | None) -> None:
    """A ledger's answers, or a first-person "I am stuck"; talk about other things is nothing."""
    assert self_report(text) is expected


def test_reissued_plans_with_noisy_pages_climb_one_rung_per_turn() -> None:
    """The same instruction again and again while each page differs only by noise: NUDGE at
    the second re-issue, REPLAN at the third, ASK_HUMAN at the fifth, named by the plan."""
    detector = StagnationDetector(NO_GATE)
    levels = []
    for k in range(7):
        turn = detector.observe_turn(ModelTurn(text=ASK if k % 2 else ASK_AGAIN))
        detector.observe(_page("abcdefghij"[k] * 6))
        levels.append(turn.level)
    # the first page is news; the first re-issue is the third turn
    assert levels == [
        StagnationLevel.NONE,
        StagnationLevel.NONE,
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
        StagnationLevel.REPLAN,
        StagnationLevel.ASK_HUMAN,
    ]
    verdict = detector.verdict()
    assert verdict.kind is StagnationKind.REPEAT
    assert verdict.reason_codes == (ReasonCode.REISSUED_PLAN,)
    assert detector.counters()["stale_turns"] == 5


def test_a_plan_reissued_after_news_is_not_stale() -> None:
    """Each page shows something never seen: asking again is following up, not looping."""
    detector = StagnationDetector(NO_GATE)
    for k, news in enumerate(NEWS):
        assert detector.observe_turn(ModelTurn(text=ASK)).level is StagnationLevel.NONE
        detector.observe(read(f"results/page{k}.html", news))
    assert detector.counters()["stale_turns"] == 0


def test_a_batch_of_lookups_in_the_same_words_is_not_a_reissue() -> None:
    """The same sentence proposing other calls (seven reservations looked up) is other plans."""
    detector = StagnationDetector(NO_GATE)
    for k in range(7):
        turn = ModelTurn.from_message(
            "Let me look up the next reservation in the list.",
            [("get_reservation_details", json.dumps({"reservation_id": f"RES{'ABCDEFG'[k]}"}))],
        )
        assert detector.observe_turn(turn).level is StagnationLevel.NONE


def test_self_reports_feed_the_ladder_and_fresh_plans_drain_it() -> None:
    """Three "we are looping" ledgers reach REPLAN; a fresh plan after news takes one off the
    count; a fresh plan with nothing new since the last turn, or a word too short to compare,
    neither adds nor takes off."""
    detector = StagnationDetector(NO_GATE)
    for k in range(3):
        verdict = detector.observe_turn(
            ModelTurn(text=f"Try source number {'ABC'[k]} for the figure.", stuck=True)
        )
    assert verdict.level is StagnationLevel.REPLAN
    assert verdict.reason_codes == (ReasonCode.SELF_REPORTED_STALL,)
    assert verdict.kind is StagnationKind.NO_GRADIENT
    detector.observe_turn(ModelTurn(text="TERMINATE"))
    assert detector.counters()["stale_turns"] == 3, "a word is too short to judge as a plan"
    detector.observe_turn(ModelTurn(text="Write to the agency and ask for the ridership data."))
    assert detector.counters()["stale_turns"] == 3, "no news since the last turn: no drain"
    detector.observe(read("agency/reply.txt", "The ridership data for 2023 is attached here."))
    detector.observe_turn(ModelTurn(text="Sum the ridership of the twelve months in the reply."))
    assert detector.counters()["stale_turns"] == 2


def test_a_turn_and_its_results_are_one_iteration() -> None:
    """The results of a turn's calls continue its iteration: no second rung, and their verdict
    says escalated so that a host holding the turn's text injects it once."""
    detector = StagnationDetector(NO_GATE)
    for k in range(2):
        detector.observe_turn(ModelTurn(text=ASK, stuck=True))
        detector.observe(_page("xy"[k] * 5))
    turn = detector.observe_turn(ModelTurn(text=ASK, stuck=True))
    assert (turn.level, turn.escalated) == (StagnationLevel.REPLAN, True)
    loop = ToolEvent(
        tool_name="run_command", arguments={"command": "false"}, output="x", exit_code=1
    )
    batch = detector.observe_batch([loop] * 4)
    assert (batch.level, batch.escalated) == (StagnationLevel.REPLAN, True)


def test_noting_a_turn_leaves_the_detector_as_observing_it_does() -> None:
    """``note_turn`` (a host that applies only the results' verdict) changes the detector
    exactly as ``observe_turn`` does, through re-issues that climb the ladder; the results'
    verdict after a turn that raised the level says escalated either way."""
    observed, noted = StagnationDetector(NO_GATE), StagnationDetector(NO_GATE)
    for k in range(7):
        turn = ModelTurn.from_message(ASK if k % 2 else ASK_AGAIN, [("browse", '{"page": 1}')])
        observed.observe_turn(turn)
        noted.note_turn(turn)
        page = _page("abcdefghij"[k] * 6)
        assert observed.observe_batch([page]) == noted.observe_batch([page])
        assert observed.to_state() == noted.to_state()
    assert noted.verdict().level is StagnationLevel.ASK_HUMAN


def test_a_turn_too_short_to_compare_has_no_plan() -> None:
    """``plan_of`` with ``min_chars``: None for a turn of calls alone or a short word (its
    calls are not digested); otherwise the same plan as without it."""
    calls_only = ModelTurn.from_message("", [("file_read", '{"path": "a.txt"}')])
    assert plan_of(calls_only, 40) is None
    assert plan_of(ModelTurn(text="TERMINATE"), 40) is None
    turn = ModelTurn.from_message(ASK, [("file_read", '{"path": "a.txt"}')])
    assert plan_of(turn, 40) == plan_of(turn)
    assert plan_of(calls_only) is not None, "without min_chars every turn has a plan"


def test_milestones_and_user_messages_forget_the_plans() -> None:
    """A verified milestone or a genuine user message starts the model's side afresh."""
    detector = StagnationDetector(NO_GATE)
    for _ in range(3):
        detector.observe_turn(ModelTurn(text=ASK))
    assert detector.counters()["stale_turns"] == 2
    detector.milestone("form filled")
    assert detector.observe_turn(ModelTurn(text=ASK)).level is StagnationLevel.NONE
    detector.observe_turn(ModelTurn(text=ASK))
    detector.reset_window()
    assert detector.counters()["stale_turns"] == 0


def test_the_model_side_state_stays_bounded() -> None:
    """A thousand long, all different turns and pages: the model side persists no more after
    them than after forty (the last ``plan_memory`` plans and results, each cut short)."""
    detector = StagnationDetector()
    sizes, kept = [], []
    for k in range(1000):
        words = " ".join(f"w{k}x{j}" for j in range(400))
        detector.observe_turn(ModelTurn(text=f"Plan {k}: {words}", calls=(f"search({k})",)))
        detector.observe(read(f"notes/{k}.md", words))
        if k in (40, 999):
            state = detector.to_state()
            sizes.append(len(json.dumps([state["plans"], state["result_gists"]])))
            kept.append(len(state["result_words"]))
    assert sizes[1] <= sizes[0] * 1.1
    assert sizes[1] < 16 * 2 * 700
    assert kept[1] <= MAX_SEEN_WORDS, "the content words the results showed: bounded too"
    restored = StagnationDetector.from_state(None, detector.to_state())
    assert restored.to_state() == detector.to_state()


def test_a_turn_is_read_from_the_assistant_message() -> None:
    """``from_conversation`` takes the assistant message's text and calls; no assistant: None."""
    call = ToolCall(id="c1", name="run_command", arguments='{"command": "pytest -q"}')
    messages = [
        ConversationMessage(role=MessageRole.ASSISTANT, content="I am stuck.", tool_calls=[call]),
        ConversationMessage.user("[policy] denied"),
    ]
    turn = ModelTurn.from_conversation(messages)
    assert turn is not None
    assert (turn.text, turn.calls, turn.stuck) == (
        "I am stuck.",
        ('run_command({"command":"pytest -q"})',),
        True,
    )
    assert ModelTurn.from_conversation([ConversationMessage.user("hi")]) is None


def test_a_conversation_stall_opens_the_gate_by_its_turns() -> None:
    """No tool at all: replies asking the user again for what they asked already pass the step
    gate (more than ``min_steps`` turns) and reach REPLAN; behind it they get no NUDGE, since no
    tool result has come in (rule 12 wants one since the last milestone or the task's start)."""
    detector = StagnationDetector()
    asks = (
        "To calculate the amount charged to your card, please give me the total cost and the "
        "gift card amounts.",
        "To calculate the amount charged to your card, please give me the total cost and the "
        "gift cards' amounts.",
    )
    levels = [detector.observe_turn(ModelTurn(text=asks[k % 2])).level for k in range(6)]
    assert levels[:4] == [StagnationLevel.NONE] * 4  # behind the gate, no tool result yet
    assert levels[4] is StagnationLevel.NUDGE  # the fifth turn opens the gate
    assert levels[5] is StagnationLevel.REPLAN  # one rung per iteration
    assert detector.verdict().steps_since_milestone == 0
