"""The slot signal: the agent asks the user again for the same item (an id, a number, a code)
with nothing new come back since it last asked (tau-bench conversation stalls)."""

from __future__ import annotations

import json
import timeit

from shared.stagnation import (
    ModelTurn,
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    ToolEvent,
)
from shared.stagnation.signal import SignalMemory
from shared.stagnation.signals import SlotSignal, default_signals
from shared.stagnation.signals.slot import MAX_SLOTS, asked_slots
from tests.shared.stagnation_samples import reservation_lookup

# tau-bench trial0/9, abridged: every reply asks again for the id the user said they lack
REASKS = [
    "To proceed, I'll need your user ID and the reservation ID. Could you please provide them?",
    "To modify a reservation, I need the reservation ID. Please check your email for it.",
    "Unfortunately, I cannot proceed without the reservation ID. Please provide it.",
    "To check eligibility, I'll need your user ID and the reservation ID of the booking.",
    "Once you have the reservation number, please share it and we will cancel the booking.",
    "Take your time in finding the reservation ID; I'll be here when you have it.",
]


RECORDS = [
    "Boston to Denver, economy, two passengers, paid by gift card",
    "Seattle to Miami on May 3, business, one passenger, credit card",
    "round trip JFK-LAX, basic economy, insurance declined",
    "cancelled on 2024-05-01 (weather), refund issued to the original payment",
    "Phoenix, Atlanta and back; three bags, travel certificate applied",
    "ORD to DFW one way; seat 12C; no checked bags",
    "economy upgraded to business; membership gold; nothing owed",
    "two segments: SFO-SEA, SEA-ANC; infant on lap",
    "booked yesterday, 24-hour free cancellation still open",
    "MIA to BOS, flexible fare, changes allowed without a fee",
    "one passenger, Denver to Houston, paid with two gift cards",
    "awaiting payment: the hold expires at midnight",
]


def _lookup(number: int) -> ToolEvent:
    """A reservation the user named, looked up: each answer another record."""
    return reservation_lookup(RECORDS, number)


def test_slots_are_the_items_asked_of_the_reader() -> None:
    """A noun phrase ending in id, number or code, in a sentence addressed to the reader;
    number and code read as id, qualifiers that do not name the item dropped."""
    assert asked_slots(REASKS[0]) == {"user id", "reservation id"}
    assert asked_slots(REASKS[4]) == {"reservation id"}
    assert asked_slots("Could you give me the IATA code of your airport?") == {"iata id"}
    assert asked_slots("Please send the same confirmation code again, if you can.") == {
        "confirmation id"
    }
    # a coding agent's notes address nobody: the line number is not asked of anyone
    assert asked_slots("Let me check the line number in options.py. The PR number is 42.") == set()
    assert asked_slots("Thank you! Have a great day.") == set()


def test_reasking_the_same_slot_with_nothing_new_climbs_the_plan_ladder() -> None:
    """No tool call between the re-asks: the 2nd re-ask is a NUDGE, the 3rd a REPLAN (the plan
    ladder, 2 / 3 / 5 / 8), one rung per turn, named by the slot."""
    detector = StagnationDetector(StagnationConfig(min_steps=0))
    verdicts = [detector.observe_turn(ModelTurn.from_message(text)) for text in REASKS[:4]]
    assert [v.level for v in verdicts] == [
        StagnationLevel.NONE,
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
    ]
    assert verdicts[3].escalated
    assert verdicts[3].kind is StagnationKind.REPEAT
    assert ReasonCode.REASKED_SLOT in verdicts[3].reason_codes
    assert "asked for the reservation ID 3 times" in verdicts[2].message


def test_a_new_result_between_the_asks_is_no_reask() -> None:
    """The user gave an id and the agent looked it up (a new result): asking for an id again
    after that is a new question, however many times it happens."""
    detector = StagnationDetector(StagnationConfig(min_steps=0))
    levels = []
    for number, text in enumerate(REASKS * 2):
        levels.append(detector.observe_turn(ModelTurn.from_message(text)).level)
        levels.append(detector.observe(_lookup(number)).level)
    assert set(levels) == {StagnationLevel.NONE}


def test_other_slots_are_other_questions() -> None:
    """Asking for the date, then the airport code, then the city is gathering, not a loop."""
    detector = StagnationDetector(StagnationConfig(min_steps=0))
    texts = [
        "Could you please provide your user ID?",
        "Could you tell me the flight number you are booked on?",
        "Could you please provide the IATA code for your local airport?",
        "Could you please provide your membership number?",
        "What is the confirmation code you received?",
    ]
    levels = {detector.observe_turn(ModelTurn.from_message(t)).level for t in texts}
    assert levels == {StagnationLevel.NONE}


def test_two_items_asked_in_turn_each_keep_their_count() -> None:
    """Re-asks of one item interleaved with re-asks of another (tau-bench trial2/1: the
    reservation ID, then the airport code, then the reservation ID again) still climb: asking
    for the other item between them is no news."""
    detector = StagnationDetector()  # the default gate, as the replay runs it
    texts = [
        "I'll need your user ID and the reservation ID. Could you please provide those details?",
        "To proceed, I need the reservation ID. You might find it in your email confirmation.",
        "Unfortunately, I need the reservation ID to access and modify your flight details.",
        "To check for flights, I'll need to know the origin airport in Texas and the date.",
        "Could you please provide the airport code or name you are departing from?",
        "To search for flights, I need the airport code. If you can find it, please tell me.",
        "To cancel with travel insurance, I'll need your user ID and the reservation ID.",
        "I need the reservation ID to proceed. Once you have it, please provide it.",
    ]
    verdicts = [detector.observe_turn(ModelTurn.from_message(t)) for t in texts]
    assert [v.level for v in verdicts[:6]] == [StagnationLevel.NONE] * 6
    assert verdicts[6].level is StagnationLevel.NUDGE
    assert verdicts[7].level is StagnationLevel.REPLAN
    assert ReasonCode.REASKED_SLOT in verdicts[7].reason_codes
    assert "asked for the reservation ID 5 times" in verdicts[7].message


def test_the_step_gate_holds_the_reasks_of_a_conversation_start() -> None:
    """Under the default gate (more than 4 turns), the first re-asks stay below NUDGE."""
    detector = StagnationDetector()
    levels = [detector.observe_turn(ModelTurn.from_message(t)).level for t in REASKS[:4]]
    assert set(levels) == {StagnationLevel.NONE}


def test_the_slot_memory_is_saved_restored_and_cleared() -> None:
    """The signal's memory goes with the detector's state (JSON), a restored detector goes on
    counting where it was, and a milestone forgets it."""
    detector = StagnationDetector(StagnationConfig(min_steps=0))
    for text in REASKS[:3]:
        detector.observe_turn(ModelTurn.from_message(text))
    state = json.loads(json.dumps(detector.to_state()))
    assert state["signal_memory"]["slot"][-1][0] == "reservation id"
    restored = StagnationDetector.from_state(None, state)
    assert restored.observe_turn(ModelTurn.from_message(REASKS[3])).level is (
        StagnationLevel.REPLAN
    )
    restored.milestone("reservation found")
    assert restored.to_state()["signal_memory"]["slot"] == []
    # a state saved before the signal existed loads with an empty memory
    del state["signal_memory"]
    older = StagnationDetector.from_state(None, state)
    assert older.to_state()["signal_memory"]["slot"] == []


def test_the_slot_signal_is_a_signal_with_a_memory_and_bounded() -> None:
    """It satisfies both protocols, each detector gets its own instance, and it keeps at most
    MAX_SLOTS slots."""
    signal = SlotSignal()
    assert isinstance(signal, SignalMemory)
    first = [s for s in default_signals() if isinstance(s, SlotSignal)]
    second = [s for s in default_signals() if isinstance(s, SlotSignal)]
    assert first[0] is not second[0]
    detector = StagnationDetector(StagnationConfig(min_steps=0), signals=[signal])
    for number in range(3 * MAX_SLOTS):
        detector.observe_turn(ModelTurn.from_message(f"Could you give me your item{number} ID?"))
    assert len(signal.dump()) == MAX_SLOTS


def test_a_turn_costs_well_under_a_millisecond() -> None:
    """One pass of a regular expression over the first 2,000 characters: under 1 ms for a long
    reply (the best of five batches, so that a busy shared box measures the rule, not the
    other processes)."""
    text = " ".join(REASKS) * 10
    per_turn = min(timeit.repeat(lambda: asked_slots(text), number=50, repeat=5)) / 50
    print(f"RESULT slot_signal_us_per_turn {per_turn * 1e6:.1f}")
    assert per_turn < 1e-3
