"""The slow-model benchmark's account of a run's time outside its model calls."""

from __future__ import annotations

from bench.slow_model_bench import gaps


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
