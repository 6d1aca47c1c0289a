"""Persistence, bounds, configuration, levels and the ToolEvent bridge of the detector."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from shared.actions import Observation, ToolCallAction
from shared.stagnation import (
    Ladder,
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    StagnationVerdict,
    ToolEvent,
    ToolKind,
)
from tests.shared.test_stagnation_trajectories import ack, command, page, read, write


def _mixed_run() -> list[ToolEvent | str]:
    """Events with a compaction and a milestone in the middle (the strings are the calls)."""
    lines = [f"row {chr(97 + n % 26)}{n // 26}" for n in range(200)]
    events: list[ToolEvent | str] = []
    for i in range(60):
        events.append(page("data.txt", lines, 1 + (i % 7) * 20, 20))
        events.append(command("make", "error: missing separator", 2))
        if i % 9 == 0:
            events.append(write("a.py", None, f"x = '{chr(97 + i % 5)}'"))
        if i == 20:
            events.append("compacted")
        if i == 35:
            events.append("milestone")
        events.append(ack("true"))
    return events


def _drive(detector: StagnationDetector, items: list[ToolEvent | str]) -> list[StagnationVerdict]:
    verdicts = []
    for item in items:
        if item == "compacted":
            detector.compacted()
        elif item == "milestone":
            detector.milestone("halfway")
        else:
            assert isinstance(item, ToolEvent)
            verdicts.append(detector.observe(item))
    return verdicts


@pytest.mark.parametrize("cut", [0, 1, 17, 40, 95, 150])
def test_state_round_trip_mid_run_gives_identical_verdicts(cut: int) -> None:
    """Persist through JSON at ``cut``, restore, and the rest of the run gives the same verdicts."""
    items = _mixed_run()
    straight = StagnationDetector()
    _drive(straight, items[:cut])
    restored = StagnationDetector.from_state(None, json.loads(json.dumps(straight.to_state())))
    assert restored.to_state() == straight.to_state()
    assert _drive(restored, items[cut:]) == _drive(straight, items[cut:])


def test_empty_state_gives_a_fresh_detector() -> None:
    """The coordinator's ``{}`` (a new task) or None starts from scratch with the given config."""
    config = StagnationConfig(min_steps=3)
    states: tuple[dict[str, object] | None, ...] = ({}, None)
    for state in states:
        detector = StagnationDetector.from_state(config, state)
        assert detector.config == config
        assert detector.verdict().steps_since_milestone == 0


def test_config_given_on_restore_wins_over_the_saved_one() -> None:
    """A task can retune its thresholds between iterations; None keeps the saved config."""
    saved = StagnationDetector(StagnationConfig(min_steps=3)).to_state()
    assert StagnationDetector.from_state(None, saved).config.min_steps == 3
    retuned = StagnationDetector.from_state(StagnationConfig(min_steps=7), saved)
    assert retuned.config.min_steps == 7


def test_malformed_state_is_rejected() -> None:
    """A state that is not a detector's raises a validation error naming the field."""
    with pytest.raises(ValidationError, match="total_steps"):
        StagnationDetector.from_state(None, {"version": 1, "config": {}})


def test_state_stays_bounded_over_ten_thousand_events() -> None:
    """10,000 distinct events persist no more than the caps allow, and no more than 5,000 do."""
    detector = StagnationDetector()
    sizes = {}
    for step in range(1, 10_001):
        detector.observe(read(f"f{step % 400}.py", f"content {step}"))
        if step in (5_000, 10_000):
            sizes[step] = len(json.dumps(detector.to_state()))
    state = detector.to_state()
    config = detector.config
    assert len(state["seen"]) == config.max_seen_hashes
    assert len(state["paths"]) <= config.max_paths
    assert len(state["window"]) <= config.history
    assert sizes[10_000] <= sizes[5_000] * 1.01
    assert sizes[10_000] < 100_000


def test_stale_events_do_not_grow_the_state() -> None:
    """10,000 repeats of one call keep the window at ``history`` entries."""
    detector = StagnationDetector()
    for _ in range(10_000):
        detector.observe(command("make", "error: missing separator", 2))
    assert len(detector.to_state()["window"]) == detector.config.history


def test_milestone_names_are_capped() -> None:
    """Only the last 32 milestone names are kept; the count keeps them all."""
    detector = StagnationDetector()
    for n in range(100):
        detector.milestone(f"m{n}")
    assert detector.milestones == [f"m{n}" for n in range(68, 100)]
    assert detector.counters()["milestones"] == 100


# -- configuration -------------------------------------------------------------------------------


def test_config_round_trips_through_json() -> None:
    """A per-task config survives JSON exactly, sets included."""
    config = StagnationConfig(
        min_steps=4,
        stale=Ladder(nudge=5, replan=9, ask_human=14, abort=20),
        patient_tools=frozenset({"job_status", "wait"}),
    )
    text = config.model_dump_json()
    assert StagnationConfig.model_validate_json(text) == config
    assert json.loads(text)["patient_tools"] == ["job_status", "wait"]


def test_ladder_rungs_must_not_decrease() -> None:
    """A ladder whose REPLAN comes before NUDGE is refused with the rungs in the message."""
    with pytest.raises(ValidationError, match=r"must not decrease.*\[5, 3, 8, 12\]"):
        Ladder(nudge=5, replan=3, ask_human=8, abort=12)


def test_unreachable_rungs_are_refused() -> None:
    """A repeat rung beyond ``history`` could never be reached: the error says what to raise."""
    with pytest.raises(ValidationError, match="raise history to at least 40"):
        StagnationConfig(repeat=Ladder(nudge=3, replan=5, ask_human=8, abort=40))


def test_ladder_rung_maps_counts_to_levels() -> None:
    """Below NUDGE is NONE; each threshold reached gives its level."""
    ladder = Ladder(nudge=2, replan=4, ask_human=6, abort=8)
    assert [ladder.rung(n) for n in (1, 2, 5, 6, 9)] == [
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
        StagnationLevel.ASK_HUMAN,
        StagnationLevel.ABORT,
    ]


# -- levels --------------------------------------------------------------------------------------


def test_levels_are_ordered() -> None:
    """NONE < NUDGE < REPLAN < ASK_HUMAN < ABORT, whatever the alphabet says."""
    ordered = [
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
        StagnationLevel.ASK_HUMAN,
        StagnationLevel.ABORT,
    ]
    shuffled = [ordered[3], ordered[0], ordered[4], ordered[2], ordered[1]]
    assert sorted(shuffled) == ordered
    assert max(ordered) is StagnationLevel.ABORT
    assert StagnationLevel.ASK_HUMAN > StagnationLevel.REPLAN >= StagnationLevel.REPLAN
    assert [level.rank for level in ordered] == [0, 1, 2, 3, 4]


def test_levels_do_not_compare_with_plain_strings() -> None:
    """Ordering a level against a bare string is a TypeError, not a silent alphabetic answer."""
    with pytest.raises(TypeError, match="compare with a level"):
        assert StagnationLevel.NUDGE < "replan"


def test_verdict_serialises_levels_by_name() -> None:
    """The journal reads ``"level": "replan"``, not a number."""
    verdict = StagnationVerdict(level=StagnationLevel.REPLAN)
    assert json.loads(verdict.model_dump_json())["level"] == "replan"


# -- the ToolEvent bridge ------------------------------------------------------------------------


def test_tool_event_from_observation_reads_the_metadata() -> None:
    """Kind, path, hashes and exit code come from ``Observation.metadata``; the call's name."""
    action = ToolCallAction(call_id="c1", name="file_write", arguments='{"path": "a.py"}')
    observation = Observation(
        source="file_write",
        content="wrote 3 bytes",
        call_id="c1",
        metadata={
            "kind": "write",
            "path": "a.py",
            "before_hash": "",
            "after_hash": "abc",
            "exit_code": "0",
            "output_hash": "ffff",
        },
    )
    event = ToolEvent.from_observation(action, observation)
    assert event == ToolEvent(
        tool_name="file_write",
        arguments={"path": "a.py"},
        output="wrote 3 bytes",
        exit_code=0,
        kind=ToolKind.WRITE,
        path="a.py",
        before_hash="",
        after_hash="abc",
        output_hash="ffff",
    )


def test_tool_event_defaults_without_metadata() -> None:
    """No metadata: kind other, no hashes; a tool error stays an error."""
    action = ToolCallAction(call_id="c1", name="web_fetch", arguments="")
    event = ToolEvent.from_observation(action, Observation.tool_error("web_fetch", "timeout"))
    assert (event.kind, event.arguments, event.is_error, event.failed) == (
        ToolKind.OTHER,
        {},
        True,
        True,
    )


def test_tool_event_keeps_unparseable_arguments_raw() -> None:
    """Arguments that are not a JSON object are kept as text under ``_raw``."""
    action = ToolCallAction(call_id="c1", name="bash", arguments="ls -la")
    event = ToolEvent.from_observation(action, Observation.tool_result("bash", "x"))
    assert event.arguments == {"_raw": "ls -la"}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"exit_code": "zero"}, r"exit_code must be an integer, got 'zero'"),
        ({"kind": "delete"}, r"kind 'delete' is not one of read, write, command, other"),
    ],
)
def test_tool_event_rejects_malformed_metadata(metadata: dict[str, str], message: str) -> None:
    """A malformed exit code or kind names the tool, the value and the fix."""
    action = ToolCallAction(call_id="c1", name="run", arguments="{}")
    observation = Observation(source="run", content="", metadata=metadata)
    with pytest.raises(ValueError, match=message):
        ToolEvent.from_observation(action, observation)


def test_tool_event_refuses_an_observation_of_another_call() -> None:
    """Pairing an observation with the wrong call is caught."""
    action = ToolCallAction(call_id="c1", name="run", arguments="{}")
    observation = Observation(source="run", content="", call_id="c2")
    with pytest.raises(ValueError, match="answers call 'c2', not 'c1'"):
        ToolEvent.from_observation(action, observation)


def test_a_version_one_state_still_loads() -> None:
    """A state saved by the previous release resumes: its digests count as first seen at step 0,
    its path states as read."""
    state = StagnationDetector().to_state()
    detector = StagnationDetector()
    detector.observe(read("a.py", "x = 1"))
    state = detector.to_state()
    old = {
        **state,
        "version": 1,
        "seen": [[key, epoch] for key, (epoch, _step) in state["seen"]],
        "paths": [[key, value[2:]] for key, value in state["paths"]],
    }
    for new_field in ("pending_writes", "recent_failures", "recent_errors"):
        old.pop(new_field)
    old["episode"] = {k: v for k, v in state["episode"].items() if k != "started_at"}
    restored = StagnationDetector.from_state(None, old)
    assert restored.to_state()["version"] == 2
    assert restored.observe(read("a.py", "x = 1")).stale_steps == 1


def test_a_lenient_tool_event_reads_malformed_metadata_as_unknown_and_any_call_id() -> None:
    """``strict=False`` (a host reading third-party tools): a malformed kind reads as other, a
    malformed exit code as unknown, the rest of the metadata as given, and the observation is
    taken as the action's answer whatever call id it carries; the observation is unchanged."""
    action = ToolCallAction(call_id="c1", name="run", arguments='{"cmd": "ls"}')
    metadata = {"kind": "delete", "exit_code": "zero", "path": "a.py", "output_hash": "ff"}
    observation = Observation(source="run", content="out", call_id="c2", metadata=metadata)
    event = ToolEvent.from_observation(action, observation, strict=False)
    assert event == ToolEvent(
        tool_name="run",
        arguments={"cmd": "ls"},
        output="out",
        kind=ToolKind.OTHER,
        path="a.py",
        output_hash="ff",
    )
    assert observation.metadata == metadata and observation.call_id == "c2"
    fine = Observation(source="run", content="", metadata={"kind": "command", "exit_code": " 2"})
    event = ToolEvent.from_observation(action, fine, strict=False)
    assert (event.kind, event.exit_code, event.failed) == (ToolKind.COMMAND, 2, True)


def test_a_batch_verdict_says_escalated_when_any_event_of_it_escalated() -> None:
    """The verdict of a batch is its highest level met, ``escalated`` when any event of the
    batch (or the turn that opened it) raised the level, and not otherwise."""
    detector = StagnationDetector(StagnationConfig(min_steps=0))
    verdicts = [detector.observe_batch([read("a.py", "x = 1")]) for _ in range(6)]
    assert [v.escalated for v in verdicts] == [
        v.level > before.level
        for before, v in zip([StagnationDetector().verdict(), *verdicts], verdicts, strict=False)
    ]
    assert any(v.escalated for v in verdicts) and not all(v.escalated for v in verdicts)
    assert detector.observe_batch([]).escalated is False
