"""The slow-model benchmark's account of a run's time outside its model calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.slow_model_bench import Batch, gaps, schedule_to_start
from shared.events import JournalEntry, Started, ToolsDispatched
from shared.loop_types import LoopConfig


def _record(task: str, turn: int, start: float, end: float) -> dict[str, object]:
    return {"task": task, "turn": turn, "start": start, "end": end}


def test_gaps_count_the_first_answer_of_each_turn_of_the_runs_asked_for() -> None:
    records = [
        _record("a", 1, 100.5, 101.5),
        _record("a", 2, 101.75, 102.75),
        _record("a", 2, 103.0, 104.0),  # a duplicate call: the first answer counts
        _record("a", 3, 103.0, 0.0),  # still in flight: not answered, not counted
        _record("b", 1, 100.25, 101.0),
        _record("other", 1, 100.0, 101.0),  # another batch's run
    ]
    measured = gaps(records, ["a", "b"], submitted_at=100.0)
    assert sorted(measured.first_call) == [0.25, 0.5]
    assert measured.between_calls == (0.25,)


def _entry(at: float, event: Started | ToolsDispatched) -> JournalEntry:
    return JournalEntry(
        sequence=0, timestamp=datetime.fromtimestamp(at, UTC), agent_id="a", event=event
    )


class _Journals:
    """The benchmark's client, as far as ``schedule_to_start`` reads it: each task's journal."""

    def __init__(self, journals: dict[str, list[JournalEntry]]) -> None:
        self.journals = journals

    def journal(self, task_id: str) -> list[JournalEntry]:
        return self.journals[task_id]


def test_the_burst_is_split_at_each_runs_started() -> None:
    started = Started(agent_id="a", config=LoopConfig())
    later = ToolsDispatched(iteration=1, tool_count=1, duration=timedelta(milliseconds=1))
    final = ToolsDispatched(iteration=2, tool_count=0, duration=timedelta(0))  # the answer's
    client = _Journals(
        {
            "t-a": [_entry(100.25, started), _entry(101.75, later), _entry(103.0, final)],
            "t-b": [_entry(100.5, started)],  # its first call never reached the model
        }
    )
    batch = Batch(
        ids=["t-a", "t-b"], markers=["a", "b"], started=100.0, submitted=100.01, end=110.0,
        statuses={"t-a": "completed"},
    )  # fmt: skip
    records = [
        _record("a", 1, 100.375, 101.5),
        _record("a", 1, 100.5, 101.625),  # a duplicate call: the first arrival counts
        _record("a", 2, 102.0, 102.9),
    ]
    waits = schedule_to_start(client, batch, records)  # type: ignore[arg-type]
    assert waits.first_dispatch == (0.25,)  # from the batch's start, the run that started only
    assert waits.first_wait == (0.125,)
    # a's two requests (its final answer dispatched nothing), b's one, which waited to the end
    assert sorted(waits.seconds) == [0.125, 0.25, 9.5]
    assert waits.unstarted == 1
