"""The inbox's timeline in words: durations a reader can read, calls and results summarised,
a gate's change before and after, and no raw JSON for the events it knows."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from coordinator.inbox.timeline import describe, human_duration
from shared.actions import Observation, RespondAction, ToolCallAction
from shared.events import (
    GateModified,
    ObservationsCollected,
    PreHydrationComplete,
    ReasoningComplete,
    ReferenceFailure,
    Terminated,
    ToolResultRecord,
    ToolsDispatched,
)
from shared.inference import Usage
from shared.loop_types import TerminationReason


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (timedelta(microseconds=850), "850 µs"),
        (timedelta(microseconds=72510), "73 ms"),
        (timedelta(microseconds=1008110), "1.01 s"),
        (12.34, "12.3 s"),
        (303, "5 min 3 s"),
        (7500, "2 h 5 min"),
    ],
)
def test_durations_read_in_units(value: timedelta | float, shown: str) -> None:
    """µs, ms, s, min and h: never the journal's "1008110us"."""
    assert human_duration(value) == shown


def test_a_model_turn_and_its_results_in_words() -> None:
    """A proposal names the call and its arguments; the results fold the tool's answer."""
    call = ToolCallAction(call_id="c1", name="file_read", arguments=json.dumps({"path": "a.py"}))
    line, blocks = describe(
        ReasoningComplete(iteration=1, actions=[call], usage=Usage(total_tokens=222))
    )
    assert line == "model proposed file_read(path=a.py) · 222 tokens"
    assert blocks[0].label == "file_read c1" and '"path": "a.py"' in blocks[0].text
    observed = ObservationsCollected(
        iteration=1,
        observation_count=1,
        results=[
            ToolResultRecord.of(Observation.tool_result("file_read", "x = 1").with_call_id("c1"))
        ],
    )
    line, blocks = describe(observed)
    assert line == "results: file_read ok"
    assert [(b.label, b.text) for b in blocks] == [("file_read c1 → ok", "x = 1")]
    assert (
        describe(ToolsDispatched(iteration=1, tool_count=1, duration=timedelta(seconds=0.0726)))[0]
        == "1 call ran in 73 ms (the longest)"
    )


def test_a_gate_change_and_failed_references_are_shown() -> None:
    """GateModified shows before and after; PreHydrationComplete each failure and why."""
    before = ToolCallAction(call_id="c1", name="file_read", arguments='{"path": "spec.md"}')
    after = before.model_copy(update={"arguments": '{"path": "redacted.md"}'})
    line, blocks = describe(
        GateModified(iteration=2, call_id="c1", reason="policy", before=before, after=after)
    )
    assert line == "gate changed file_read(path=spec.md) into file_read(path=redacted.md)"
    assert [b.label for b in blocks] == ["reason", "before", "after"]
    failure = ReferenceFailure(ref_type="file", reference="./gone.md", error="no such file")
    line, blocks = describe(
        PreHydrationComplete(
            references_found=2,
            references_resolved=1,
            references_failed=1,
            total_tokens=10,
            failures=[failure],
        )
    )
    assert "1 failed" in line and [(b.label, b.text) for b in blocks] == [
        ("file ./gone.md", "no such file")
    ]


def test_an_answer_and_the_end_read_as_sentences() -> None:
    """An answer is quoted; the end says how, how long and how many tokens."""
    line, _ = describe(
        ReasoningComplete(iteration=2, actions=[RespondAction(content="done")], usage=Usage())
    )
    assert line == "model proposed answer: “done” · 0 tokens"
    ended = Terminated(
        reason=TerminationReason.completed(),
        iterations=2,
        total_usage=Usage(total_tokens=531),
        duration=timedelta(microseconds=1179747),
    )
    line, _ = describe(ended)
    assert line == "ended completed · 2 iterations · 531 tokens · took 1.18 s"
    assert "{" not in line
