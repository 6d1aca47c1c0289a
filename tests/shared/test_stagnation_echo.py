"""Echoes (``PlanMemory.reissue``'s ``Reissue.ECHO``): the same request asked again after news."""

from __future__ import annotations

import json
import time

from shared.stagnation import ModelTurn, StagnationConfig, StagnationDetector, StagnationLevel
from shared.stagnation.plans import PlanMemory, Reissue, plan_of
from tests.shared.stagnation_samples import REWORDED_REQUESTS
from tests.shared.test_stagnation_trajectories import read

NO_GATE = StagnationConfig(min_steps=0)
NO_ECHO = NO_GATE.model_copy(update={"plan_echo": 0.0})
STUCK = ModelTurn(text="We are in a loop: the rates page does not load.", stuck=True)


def _stall(detector: StagnationDetector) -> StagnationLevel:
    """Who&When 23's shape: the ledger says it loops, then the same USPS request, each round
    after a page that shows something new (another field of the same form filled in)."""
    fields = ("From: Hartford", "To: Colombia", "Package: envelope", "Weight: 0.2 lb")
    for round_, field in enumerate(fields):
        detector.observe_turn(STUCK)
        detector.observe(read(f"form/{round_}.html", f"FedEx rate form, field {field}"))
        detector.observe_turn(ModelTurn(text=REWORDED_REQUESTS[round_ % 2]))
        detector.observe(read(f"form/{round_}b.html", f"FedEx rate form, now {field} shown"))
    return detector.verdict().level


def test_memory_tells_stale_echo_and_new_apart() -> None:
    """With nothing new since, the same request is stale; after news, the same words are an
    echo, and another entity's request in the same instruction words (a batch) is new."""
    memory = PlanMemory(8)
    first, second = (plan_of(ModelTurn(text=text)) for text in REWORDED_REQUESTS[:2])
    assert memory.reissue(first, 0.9, 0.6, 0.9) is Reissue.NEW
    assert memory.reissue(second, 0.9, 0.6, 0.9) is Reissue.STALE
    memory.result("a new page", 0.9)
    assert memory.reissue(first, 0.9, 0.6, 0.0) is Reissue.NEW, "0: no echo"
    memory.result("another new page", 0.9)
    assert memory.reissue(first, 0.9, 0.6, 0.9) is Reissue.ECHO
    munich = plan_of(ModelTurn(text="Please check the availability of 'Munich' on Netflix (US)."))
    royale = plan_of(ModelTurn(text="Please check the availability of 'Skyfall' on Netflix (US)."))
    memory.reissue(munich, 0.9, 0.6, 0.9)
    memory.result("Munich streams on Netflix", 0.9)
    assert memory.reissue(royale, 0.9, 0.6, 0.9) is Reissue.NEW


def test_an_echo_after_news_does_not_drain_the_self_reports() -> None:
    """The ledger's loop reports climb to REPLAN when the request between them is the same one
    each time; without echoes each such request after a new page took one off (the count went
    1, 0, 1, 0) and no level was reached."""
    assert _stall(StagnationDetector(NO_GATE)) is StagnationLevel.REPLAN
    assert _stall(StagnationDetector(NO_ECHO)) is StagnationLevel.NONE


def test_an_echo_adds_nothing_by_itself() -> None:
    """Asking the same thing again after each new page is not a stale turn: no count, no level
    (paging with "continue to scroll" is progress)."""
    detector = StagnationDetector(NO_GATE)
    members = ("Andrea Young", "Marcus Bell", "Priya Raman", "Tomas Ekberg", "Lena Ortiz")
    for index, member in enumerate(members):
        detector.observe_turn(ModelTurn(text=REWORDED_REQUESTS[index % 2]))
        detector.observe(read(f"page/{index}.html", f"{member}: board seat, biography, career"))
    assert detector.counters()["stale_turns"] == 0
    assert detector.verdict().level is StagnationLevel.NONE


def test_a_new_request_after_news_still_drains() -> None:
    """A request that differs from every remembered one, after news, takes one off as before."""
    detector = StagnationDetector(NO_GATE)
    detector.observe_turn(STUCK)
    detector.observe(read("a.html", "the calculator page, with its fields"))
    detector.observe_turn(ModelTurn(text="Type ZIP code 06101 into the origin field and submit."))
    assert detector.counters()["stale_turns"] == 0


def test_the_echo_test_stays_well_under_a_millisecond() -> None:
    """Against 16 remembered 600-character plans made before the mark, one plan's test (Indel
    and content words against each) costs well under 1 ms of CPU."""
    memory = PlanMemory(16)
    base = " ".join(f"word{n} request detail" for n in range(60))
    for n in range(16):
        memory.reissue(plan_of(ModelTurn(text=f"{n} {base}")), 0.9, 0.6, 0.9)
        memory.result(f"page {n}", 0.9)
    plan = plan_of(ModelTurn(text=f"other {base}"))
    rounds = 200
    started = time.process_time()
    for _ in range(rounds):
        memory.reissue(plan, 0.9, 0.6, 0.9)
    per_plan = (time.process_time() - started) / rounds
    print(f"echo test: {per_plan * 1e6:.0f} µs of CPU per plan against 16")
    assert per_plan < 1e-3


def test_an_echo_survives_a_restore_from_the_saved_state() -> None:
    """Saved through JSON after the first news and restored, the detector still reads the
    request asked again after more news as an echo (the remembered plans keep their marks):
    it holds the count, 2 after the next loop report (1 without echoes), NUDGE."""
    straight, no_echo = StagnationDetector(NO_GATE), StagnationDetector(NO_ECHO)
    for detector in (straight, no_echo):
        detector.observe_turn(STUCK)
        detector.observe(read("form/0.html", "FedEx rate form, field From: Hartford"))
        detector.observe_turn(ModelTurn(text=REWORDED_REQUESTS[0]))
        detector.observe(read("form/0b.html", "FedEx rate form, now From: Hartford shown"))
    state = json.loads(json.dumps(straight.to_state()))
    restored = StagnationDetector.from_state(None, state)
    for detector in (straight, restored, no_echo):
        detector.observe_turn(STUCK)
        detector.observe(read("form/1.html", "FedEx rate form, field To: Colombia"))
        detector.observe_turn(ModelTurn(text=REWORDED_REQUESTS[1]))
        detector.observe_turn(STUCK)
    assert restored.counters()["stale_turns"] == straight.counters()["stale_turns"] == 2
    assert restored.verdict().level is straight.verdict().level is StagnationLevel.NUDGE
    assert no_echo.counters()["stale_turns"] == 1
