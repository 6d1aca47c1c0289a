"""The refusal signal: a write refused on the same target among variants of its arguments, and
re-sent unchanged after the same refusal (tau-bench update and booking stalls)."""

from __future__ import annotations

import json

from shared.stagnation import (
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)
from shared.stagnation.fingerprint import fingerprint
from shared.stagnation.memory import StaleWindow
from shared.stagnation.signal import EventNotes, SignalInput, SignalMemory
from shared.stagnation.signals import RefusalSignal, default_signals
from tests.shared.stagnation_samples import reservation_lookup

GIFT = "Error: gift card balance is not enough"
CERTIFICATE = "Error: certificate cannot be used to update reservation"
SEATS = "Error: not enough seats on flight HAT290"


RECORDS = [
    "Boston to Denver, economy, two passengers, paid by gift card",
    "Seattle to Miami, business, one passenger, credit card",
    "round trip JFK-LAX, basic economy, insurance declined",
    "cancelled (weather), refund issued to the original payment",
    "Phoenix, Atlanta and back; three bags, travel certificate applied",
    "ORD to DFW one way; seat by the window; no checked bags",
    "economy upgraded to business; membership gold; nothing owed",
    "two segments: SFO-SEA, SEA-ANC; infant on lap",
    "booked yesterday, free cancellation still open",
    "MIA to BOS, flexible fare, changes allowed without a fee",
]


def _lookup(number: int) -> ToolEvent:
    """Distinct lookups (each answer another record), to open the step gate with news."""
    return reservation_lookup(RECORDS, number)


def _update(payment: str, output: str, cabin: str = "business") -> ToolEvent:
    """One update of reservation HXDUBJ paid with ``payment``; refused when ``output`` says so."""
    return ToolEvent(
        tool_name="update_reservation_flights",
        arguments={
            "cabin": cabin,
            "flights": [{"date": "2024-05-19", "flight_number": "HAT072"}],
            "payment_id": payment,
            "reservation_id": "HXDUBJ",
        },
        output=output,
        kind=ToolKind.WRITE,
        path="HXDUBJ",
        after_hash=None if output.startswith("Error") else "updated",
        is_error=output.startswith("Error"),
    )


def _detector() -> StagnationDetector:
    detector = StagnationDetector(StagnationConfig())
    for number in range(5):
        assert detector.observe(_lookup(number)).level is StagnationLevel.NONE
    return detector


def _levels(detector: StagnationDetector, events: list[ToolEvent]) -> list[StagnationLevel]:
    return [detector.observe(event).level for event in events]


def test_a_refused_update_re_sent_unchanged_among_payment_variants_reaches_replan() -> None:
    # trial1/23: gift card, certificate, the other gift card, then the first gift card again
    detector = _detector()
    levels = _levels(
        detector,
        [
            _update("gift_card_6941833", GIFT),
            _update("certificate_2345996", CERTIFICATE),
            _update("gift_card_1646646", GIFT),
            _update("gift_card_6941833", GIFT),
        ],
    )
    assert levels == [
        StagnationLevel.NONE,
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
    ]
    verdict = detector.verdict()
    assert ReasonCode.REFUSED_WRITE in verdict.reason_codes
    assert "refused the same way before" in verdict.message


def test_a_new_reason_for_refusing_the_same_target_holds_the_level() -> None:
    # trial3/23: gift card, the other gift card (NUDGE), the certificate (a refusal never met:
    # news, which used to end the episode and its NUDGE), then the other gift card again
    detector = _detector()
    levels = _levels(
        detector,
        [
            _update("gift_card_6941833", GIFT),
            _update("gift_card_1646646", GIFT),
            _update("certificate_2345996", CERTIFICATE),
            _update("gift_card_1646646", GIFT),
        ],
    )
    assert levels == [
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
    ]
    assert detector.counters()["stale_steps"] == 2  # the certificate's refusal was held


def test_payment_variants_each_new_stay_at_nudge_until_one_passes() -> None:
    # dev trial0/3 (progressing): five refusals, no payment tried twice, then a success
    detector = _detector()
    levels = _levels(
        detector,
        [
            _update("gift_card_7480005", SEATS, cabin="economy"),
            _update("gift_card_7480005", GIFT),
            _update("gift_card_6276644", GIFT),
            # masks like gift_card_7480005 (digits after the first are volatile): still
            # another payment, compared unmasked
            _update("gift_card_7091239", GIFT),
            _update("certificate_8544743", CERTIFICATE),
            _update("credit_card_9879898", '{"reservation_id": "HXDUBJ", "cabin": "business"}'),
        ],
    )
    assert max(levels) is StagnationLevel.NUDGE


def test_one_retry_of_a_refusal_is_a_nudge() -> None:
    # trial1/15 (progressing): the same downgrade refused twice, then a narrower one passes
    detector = _detector()
    levels = _levels(
        detector,
        [
            _update("gift_card_1642017", SEATS, cabin="economy"),
            _update("gift_card_1642017", SEATS, cabin="economy"),
        ],
    )
    assert levels == [StagnationLevel.NONE, StagnationLevel.NUDGE]
    assert "refused 2 times on the same target with the same arguments" in (
        detector.verdict().message
    )


def _booking(amount: int) -> ToolEvent:
    return ToolEvent(
        tool_name="book_reservation",
        arguments={"cabin": "economy", "payment_methods": [{"amount": amount}]},
        output=f"Error: payment amount does not add up, total price is 1002, but paid {amount}",
        kind=ToolKind.WRITE,
        path="user_1",
        is_error=True,
    )


def test_a_booking_back_to_an_amount_already_refused_reaches_replan() -> None:
    # dev trial3/46: 957 refused, 1047 refused, then 957 again
    detector = _detector()
    levels = _levels(detector, [_booking(957), _booking(1047), _booking(957)])
    assert levels == [StagnationLevel.NONE, StagnationLevel.NUDGE, StagnationLevel.REPLAN]


def test_the_same_refused_call_alone_is_left_to_the_retried_failure_ladder() -> None:
    # trial1/8: book_reservation refused three times the same way, a think between; no
    # variant was tried, so this signal stays at NUDGE (the retried failure's ladder, 3 / 4,
    # names the third a NUDGE too)
    detector = _detector()
    think = ToolEvent(tool_name="think", arguments={"thought": "verify"}, output="")
    booking = ToolEvent(
        tool_name="book_reservation",
        arguments={"cabin": "business", "payment_methods": [{"amount": 1625}]},
        output="Error: payment amount does not add up, total price is 4875, but paid 1625",
        kind=ToolKind.WRITE,
        path="mohamed_silva_9265",
        is_error=True,
    )
    levels = _levels(detector, [booking, think, booking, think, booking])
    assert levels[-1] is StagnationLevel.NUDGE
    signal = RefusalSignal()
    for event in (booking, booking, booking):
        signal.note(event, fingerprint(event, frozenset()), StagnationConfig())
    step = SignalInput(StagnationConfig(), StaleWindow(30, 5), 0, 0, 0, None, event=booking)
    evidence = signal.observe(step)
    assert evidence is not None and evidence.level is StagnationLevel.NUDGE


def test_a_success_on_the_target_ends_its_refusals() -> None:
    detector = _detector()
    _levels(
        detector,
        [
            _update("gift_card_6941833", GIFT),
            _update("credit_card_1", '{"reservation_id": "HXDUBJ", "cabin": "economy"}'),
        ],
    )
    signal = next(s for s in detector.signals if isinstance(s, RefusalSignal))
    # after the success, the old refusal re-sent counts as the first refusal again
    detector.observe(_update("gift_card_6941833", GIFT))
    assert signal.dump()[1][-1][3] is not None
    assert detector.verdict().level is StagnationLevel.NONE


def test_refusals_older_than_history_are_forgotten() -> None:
    config = StagnationConfig(history=16)
    detector = StagnationDetector(config)
    detector.observe(_update("gift_card_6941833", GIFT))
    for number in range(16):
        detector.observe(_lookup(number % len(RECORDS)))
    signal = next(s for s in detector.signals if isinstance(s, RefusalSignal))
    assert signal.dump()[1] == []


def test_the_memory_survives_a_restore() -> None:
    events = [
        _update("gift_card_6941833", GIFT),
        _update("certificate_2345996", CERTIFICATE),
        _update("gift_card_1646646", GIFT),
        _update("gift_card_6941833", GIFT),
    ]
    straight = _detector()
    expected = _levels(straight, events)
    restored = _detector()
    got = []
    for event in events:
        restored = StagnationDetector.from_state(None, json.loads(json.dumps(restored.to_state())))
        got.append(restored.observe(event).level)
    assert got == expected
    assert (
        restored.to_state()["signal_memory"]["refusal"]
        == straight.to_state()["signal_memory"]["refusal"]
    )
    # a state saved before the signal existed loads with nothing remembered
    old = straight.to_state()
    del old["signal_memory"]["refusal"]
    assert StagnationDetector.from_state(None, old).to_state()["signal_memory"]["refusal"] == [
        0,
        [],
    ]


def test_the_refusal_signal_is_a_default_signal_with_notes_and_a_memory() -> None:
    signal = next(s for s in default_signals() if isinstance(s, RefusalSignal))
    assert isinstance(signal, EventNotes)
    assert isinstance(signal, SignalMemory)
    assert StagnationConfig().refusal.replan == 3
