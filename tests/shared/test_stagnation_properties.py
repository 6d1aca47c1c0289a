"""Properties of the stagnation detector over generated trajectories (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.stagnation import (
    ModelTurn,
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
)
from shared.stagnation.state import DetectorState
from tests.shared.test_stagnation_trajectories import ack, command, read, write

_NEW_CONTENTS = st.lists(
    st.tuples(st.integers(min_value=0, max_value=4), st.text(min_size=1, max_size=30)),
    min_size=1,
    max_size=200,
    unique_by=lambda item: item[1],
)


@settings(max_examples=150, deadline=None)
@given(
    _NEW_CONTENTS,
    st.sampled_from([None, 0, 10]),
    st.booleans(),
)
def test_real_new_writes_never_reach_replan(
    writes: list[tuple[int, str]], min_steps: int | None, hosts_report_before: bool
) -> None:
    """Every event a write of content never written before: the level never passes NUDGE."""
    config = StagnationConfig() if min_steps is None else StagnationConfig(min_steps=min_steps)
    detector = StagnationDetector(config)
    current: dict[str, str] = {}
    for file_no, content in writes:
        path = f"src/m{file_no}.py"
        before = current.get(path, "") if hosts_report_before else None
        current[path] = content
        verdict = detector.observe(write(path, before, content))
        assert verdict.level < StagnationLevel.REPLAN


_EVENTS = st.sampled_from(
    [
        read("a.py", "A"),
        read("a.py", "A", why="again"),
        read("b.py", "B"),
        command("make", "error: missing separator", 2),
        command("make -j4", "error: missing separator", 2),
        command("pytest", "1 failed"),
        ack("true"),
        write("a.py", None, "A2"),
        write("a.py", None, "A"),
    ]
)
_TURNS = st.sampled_from(
    [
        ModelTurn(text="Please press CONTINUE on the rate form to get the price of the envelope."),
        ModelTurn(text="Please press CONTINUE on the rate form to get the price for the envelope."),
        ModelTurn(text="Let me read b.py next, to see how the parser is called."),
        ModelTurn(text="I am stuck: nothing I try changes the error."),
        ModelTurn(text="Run the tests once more.", calls=("run_command({})",)),
    ]
)
_ITEMS = st.lists(
    st.one_of(_EVENTS, _TURNS, st.sampled_from(["compacted", "milestone"])), max_size=120
)


def _apply(detector: StagnationDetector, item: ToolEvent | ModelTurn | str) -> object:
    if item == "compacted":
        detector.compacted()
        return "compacted"
    if item == "milestone":
        detector.milestone("m")
        return "milestone"
    if isinstance(item, ModelTurn):
        return detector.observe_turn(item)
    assert isinstance(item, ToolEvent)
    return detector.observe(item)


@settings(max_examples=100, deadline=None)
@given(_ITEMS, st.integers(min_value=0, max_value=120))
def test_restore_at_any_point_changes_nothing(
    items: list[ToolEvent | ModelTurn | str], cut: int
) -> None:
    """Saving through JSON and restoring at any step gives the same verdicts afterwards."""
    config = StagnationConfig(min_steps=2)
    straight = StagnationDetector(config)
    for item in items[:cut]:
        _apply(straight, item)
    restored = StagnationDetector.from_state(None, json.loads(json.dumps(straight.to_state())))
    rest = items[cut:]
    assert [_apply(restored, i) for i in rest] == [_apply(straight, i) for i in rest]


def _validated_state(detector: StagnationDetector) -> dict[str, Any]:
    """What ``to_state`` returns, built through :class:`DetectorState` (validated):
    the reference ``to_state`` is compared with (the
    snapshot as it was built before it was built directly)."""
    window, recent, runs = detector._window.dump()
    failures, errors = detector._window.dump_failures(), detector._window.dump_errors()
    plans, gists, mark = detector._plans.dump()
    state = DetectorState(
        config=detector.config,
        total_steps=detector._total_steps,
        steps_since_milestone=detector._since_milestone,
        new_state_changes=detector._new_changes,
        epoch=detector._epoch,
        milestones_total=detector._milestones_total,
        milestones=list(detector._milestones),
        seen=detector._seen.items(),
        paths=detector._paths.items(),
        window=window,
        recent_pairs=recent,
        cycle_runs=runs,
        episode=detector._episode.dump(),
        pending_writes=detector._pending_writes,
        recent_failures=failures,
        recent_errors=errors,
        plans=plans,
        result_gists=gists,
        result_words=detector._plans.dump_words(),
        plan_mark=mark,
        plan_stale=detector._plan_stale,
        plan_kind=detector._plan_kind,
        turn_mark=detector._turn_mark,
        turns_since_milestone=detector._turns_since_milestone,
        turn_open=detector._turn_open,
        climbed=detector._climbed,
        report_open=detector._report_open,
        last_write=detector._last_write,
        restored=detector._restored,
        last_result=detector._last_result,
        signal_memory={memory.name: memory.dump() for memory in detector._signal_memories()},
    )
    return state.model_dump(mode="json")


@settings(max_examples=100, deadline=None)
@given(_ITEMS, st.integers(min_value=0, max_value=120))
def test_state_is_what_the_validated_model_dumps(
    items: list[ToolEvent | ModelTurn | str], cut: int
) -> None:
    """The snapshot built directly equals, to the byte and the key order, the one built through
    ``DetectorState`` (validated), at any point of a run and after a restore."""
    detector = StagnationDetector(StagnationConfig(min_steps=2))
    for index, item in enumerate(items):
        if index == cut:
            detector = StagnationDetector.from_state(None, detector.to_state())
        _apply(detector, item)
        fast = detector.to_state()
        assert json.dumps(fast) == json.dumps(_validated_state(detector))
        assert DetectorState.model_validate(fast).model_dump(mode="json") == fast


@settings(max_examples=100, deadline=None)
@given(_ITEMS)
def test_level_never_drops_without_progress(items: list[ToolEvent | ModelTurn | str]) -> None:
    """The level only falls on a new state change, a milestone, or never."""
    detector = StagnationDetector(StagnationConfig(min_steps=0))
    previous = StagnationLevel.NONE
    for item in items:
        before_changes = detector.verdict().new_state_changes
        result = _apply(detector, item)
        if item == "milestone":
            previous = StagnationLevel.NONE
            continue
        if item == "compacted":
            continue
        assert hasattr(result, "level")
        level = detector.verdict().level
        progressed = detector.verdict().new_state_changes > before_changes
        assert progressed or level >= previous
        previous = level
