"""The ``Signal`` seam: a signal is a module with one ``observe`` method, plugged into the
detector; the production signals behind it give the detector's verdicts."""

from __future__ import annotations

import pytest

from shared.stagnation import (
    ModelTurn,
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    ToolEvent,
)
from shared.stagnation import detector as detector_module
from shared.stagnation.fingerprint import EventFingerprint
from shared.stagnation.signal import EventNotes, Evidence, Signal, SignalInput
from shared.stagnation.signals import (
    CycleSignal,
    ErrorSignal,
    PlanSignal,
    RefusalSignal,
    RepeatSignal,
    RetrySignal,
    SlotSignal,
    StaleSignal,
    default_signals,
)
from tests.shared.test_stagnation_trajectories import read

NO_GATE = StagnationConfig(min_steps=0)


class SameToolSignal:
    """A signal of our own: the same tool name, stale, several times in a row reaches REPLAN."""

    def __init__(self) -> None:
        self.seen: list[SignalInput] = []

    def observe(self, step: SignalInput) -> Evidence | None:
        self.seen.append(step)
        if step.event is None or step.stale_steps < 2:
            return None
        return Evidence(
            StagnationLevel.ABORT,
            StagnationKind.NO_GRADIENT,
            (ReasonCode.STALE_WINDOW,),
            lambda: f"{step.event.tool_name if step.event else ''} again",
        )


def _reread(times: int) -> list[ToolEvent]:
    return [read("src/a.py", "def a(): ...") for _ in range(times)]


def test_default_signals_are_the_production_set_in_tie_order() -> None:
    """Stale run first (it answers on every stale event), then cycle, repeat, error, retry,
    the model side, re-asked slots and refused writes; every one satisfies the protocol."""
    signals = default_signals()
    assert [type(s) for s in signals] == [
        StaleSignal,
        CycleSignal,
        RepeatSignal,
        ErrorSignal,
        RetrySignal,
        PlanSignal,
        SlotSignal,
        RefusalSignal,
    ]
    typed: tuple[Signal, ...] = signals
    assert all(callable(signal.observe) for signal in typed)
    assert [type(s) for s in StagnationDetector().signals] == [type(s) for s in signals]


def test_a_new_signal_is_a_module_passed_to_the_detector() -> None:
    """A host-supplied signal sees each stale step and drives the ladder one rung per
    iteration like any other; the stale run alone stays below it on the same steps."""
    own = SameToolSignal()
    detector = StagnationDetector(NO_GATE, signals=[StaleSignal(), own])
    levels = [detector.observe(event).level for event in _reread(4)]
    assert levels == [
        StagnationLevel.NONE,  # the first read is new: no signal is asked
        StagnationLevel.NONE,  # one stale step: ours says nothing yet
        StagnationLevel.NUDGE,  # ours at ABORT, one rung per iteration
        StagnationLevel.REPLAN,
    ]
    assert [step.stale_steps for step in own.seen] == [1, 2, 3]
    assert all(step.event is not None and step.fingerprint is not None for step in own.seen)
    plain = StagnationDetector(NO_GATE, signals=[StaleSignal()])
    assert {plain.observe(e).level for e in _reread(4)} == {StagnationLevel.NONE}


def test_without_signals_nothing_escalates() -> None:
    """An empty signal list keeps counting but never raises the level."""
    detector = StagnationDetector(NO_GATE, signals=[])
    assert {detector.observe(e).level for e in _reread(12)} == {StagnationLevel.NONE}
    assert detector.counters()["stale_steps"] == 11


def test_tool_side_signals_say_nothing_on_a_turn() -> None:
    """A stale turn reaches the signals with no event: only the model side answers (the slot
    signal too, when the turn asks for something; this one does not)."""
    step = SignalInput(
        config=NO_GATE,
        window=StagnationDetector()._window,
        stale_steps=9,
        amnesia_steps=0,
        plan_stale=3,
        plan_kind=StagnationKind.NO_GRADIENT,
        turn=ModelTurn(text="We are going round in circles."),
        stale_turn=True,
    )
    answers = {type(s).__name__: s.observe(step) for s in default_signals()}
    assert {name for name, e in answers.items() if e is not None} == {"PlanSignal"}
    plan = answers["PlanSignal"]
    assert plan is not None
    assert plan.level is StagnationLevel.REPLAN
    assert plan.reasons == (ReasonCode.SELF_REPORTED_STALL,)


def test_restored_detector_keeps_the_host_signals() -> None:
    """from_state takes the signals as the constructor does; the saved state is the detector's."""
    own = SameToolSignal()
    detector = StagnationDetector(NO_GATE, signals=[own])
    for event in _reread(2):
        detector.observe(event)
    restored = StagnationDetector.from_state(None, detector.to_state(), signals=[own])
    assert restored.signals == (own,)
    assert restored.observe(_reread(1)[0]).level is StagnationLevel.NUDGE


def test_the_plan_signal_says_nothing_on_a_turn_that_was_not_stale() -> None:
    """Every turn reaches every signal now; the plan count answers only on a stale turn (or a
    stale tool event), so a fresh reply cannot climb a rung on an earlier count."""
    step = SignalInput(
        config=NO_GATE,
        window=StagnationDetector()._window,
        stale_steps=0,
        amnesia_steps=0,
        plan_stale=3,
        plan_kind=StagnationKind.REPEAT,
        turn=ModelTurn(text="Here is something else entirely, a fresh reply."),
        stale_turn=False,
    )
    assert PlanSignal().observe(step) is None


class NotingSignal(SameToolSignal):
    """A host signal that is told of every tool event (``EventNotes``), new ones too."""

    def __init__(self) -> None:
        super().__init__()
        self.noted: list[str] = []

    def note(self, event: ToolEvent, fp: EventFingerprint, config: StagnationConfig) -> bool:
        self.noted.append(event.tool_name)
        return False


def test_every_detector_tells_its_noting_signals_of_every_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal with ``note`` hears every event (the new one too) in every detector built or
    restored with it; whether its class notes events is asked of the protocol once per class,
    not once per detector (a coordinator builds one per task it starts or loads)."""
    asked: list[type] = []

    class CountingNotes:
        """Stands in for the protocol in the detector's check, counting the checks."""

        def __instancecheck__(self, instance: object) -> bool:
            asked.append(type(instance))
            return isinstance(instance, EventNotes)

    monkeypatch.setattr(detector_module, "_NOTING_KINDS", {})
    monkeypatch.setattr(detector_module, "EventNotes", CountingNotes())
    noting = NotingSignal()
    signals: list[Signal] = [noting, SameToolSignal()]
    first = StagnationDetector(NO_GATE, signals=signals)
    for event in _reread(2):
        first.observe(event)
    restored = StagnationDetector.from_state(None, first.to_state(), signals=signals)
    restored.observe(_reread(1)[0])
    another = StagnationDetector(NO_GATE, signals=[NotingSignal(), SameToolSignal()])
    another.observe(_reread(1)[0])
    assert noting.noted == ["file_read"] * 3
    assert asked == [NotingSignal, SameToolSignal]


class RememberingSignal(SameToolSignal):
    """A host signal with a memory of its own (``SignalMemory``): it counts the steps shown."""

    name = "remembering"

    def dump(self) -> int:
        return len(self.seen)

    def load(self, state: object) -> None:
        pass

    def clear(self) -> None:
        self.seen.clear()


def test_behind_the_closed_gate_only_the_signals_with_a_memory_are_asked() -> None:
    """No tool-side evidence can raise the level before ``min_steps`` steps: a signal that
    keeps nothing is not asked on a tool event then (its evidence would be dropped), one with a
    memory sees every step; a turn is shown to both (the model's side may NUDGE behind the
    gate); once the gate opens, both are asked, and the level climbs as it would have."""
    plain, remembering = SameToolSignal(), RememberingSignal()
    detector = StagnationDetector(
        StagnationConfig(min_steps=3), signals=[plain, RememberingSignal(), remembering]
    )
    detector.observe_turn(ModelTurn(text="Read src/a.py again to see what it does."))
    levels = [detector.observe(event).level for event in _reread(5)]
    assert len(remembering.seen) == 5, "the turn and every stale read (the first is new)"
    # the turn, then the 4th and 5th read
    assert [s.event is not None for s in plain.seen] == [False, True, True]
    assert levels == [StagnationLevel.NONE] * 3 + [StagnationLevel.NUDGE, StagnationLevel.REPLAN]
