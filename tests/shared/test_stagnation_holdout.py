"""``bench/stagnation_holdout.py``: leave-one-source-out folds, selection, the bootstrap."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "stagnation_holdout", BENCH / "stagnation_holdout.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stagnation_holdout"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


H = _load()


def _stuck(source: str, n: int, caught: bool) -> object:
    return H.RunRecord((source, "run", str(n)), source, stuck=True, detected8=caught)


def _progressing(source: str, n: int, alarmed: bool) -> object:
    return H.RunRecord((source, "run", str(n)), source, stuck=False, false_alarm=alarmed)


def test_record_for_uses_the_scorers_window() -> None:
    """Caught within 8: a fire in [onset, min(end + 2, onset + 8)]; any fire is a false alarm."""
    stuck = {"label": "stuck", "onset_step": 10, "end_step": 30}
    key = ("ds", "run", "1")
    assert H.record_for(key, stuck, [18]).detected8
    assert not H.record_for(key, stuck, [19]).detected8  # onset + 9
    assert not H.record_for(key, stuck, [9]).detected8  # before onset
    short = {"label": "stuck", "onset_step": 10, "end_step": 12}
    assert H.record_for(key, short, [14]).detected8  # end + 2 < onset + 8
    assert not H.record_for(key, short, [15]).detected8
    progressing = {"label": "progressing", "onset_step": None, "end_step": None}
    assert H.record_for(key, progressing, [3]).false_alarm
    assert not H.record_for(key, progressing, []).false_alarm
    with pytest.raises(ValueError, match="onset_step=None"):
        H.record_for(key, {"label": "stuck", "onset_step": None, "end_step": 3}, [1])


def test_select_config_prefers_recall_under_the_false_alarm_ceiling() -> None:
    """Recall wins only among configurations at most 3% false alarms; ties keep the first."""
    runs_a = [_stuck("a", i, i < 5) for i in range(10)] + [_progressing("a", 10, False)]
    runs_b = [_stuck("a", i, True) for i in range(10)] + [_progressing("a", 10, True)]
    runs_c = [_stuck("a", i, i < 5) for i in range(10)] + [_progressing("a", 10, False)]
    grid = {"defaults": runs_a, "eager": runs_b, "same": runs_c}
    assert H.select_config(grid, lambda r: True) == "defaults"  # eager: 100% FA; same ties
    # with no configuration under the ceiling: the fewest false alarms, then recall
    grid = {"x": runs_b, "y": [_stuck("a", 0, False), _progressing("a", 1, True)]}
    assert H.select_config(grid, lambda r: True) == "x"
    with pytest.raises(ValueError, match="at least one configuration"):
        H.select_config({}, lambda r: True)


def test_leave_one_source_out_never_chooses_on_the_held_out_source() -> None:
    """Each fold's choice is made on the other sources only; every run is held out once."""
    # 'tuned' is perfect on source a and alarms every progressing run of b: chosen when b is
    # held out (it is the best on a alone), rejected when a is held out (it alarms on b).
    tuned = [
        _stuck("a", 0, True),
        _stuck("a", 1, True),
        _progressing("a", 2, False),
        _stuck("b", 3, True),
        _progressing("b", 4, True),
    ]
    safe = [
        _stuck("a", 0, True),
        _stuck("a", 1, False),
        _progressing("a", 2, False),
        _stuck("b", 3, False),
        _progressing("b", 4, False),
    ]
    result = H.leave_one_source_out({"safe": safe, "tuned": tuned})
    chosen = {fold.source: fold.chosen for fold in result.folds}
    assert chosen == {"a": "safe", "b": "tuned"}
    assert sorted(r.key for r in result.pooled) == sorted(r.key for r in safe)
    # held out: a under 'safe' (1 of 2 caught), b under 'tuned' (caught, and a false alarm)
    assert result.recall == pytest.approx(2 / 3)
    assert result.false_alarms == pytest.approx(1 / 2)
    fold_b = next(fold for fold in result.folds if fold.source == "b")
    assert (fold_b.recall, fold_b.false_alarms) == (1.0, 1.0)
    assert (fold_b.train_recall, fold_b.train_fa) == (1.0, 0.0)


def test_leave_one_source_out_refuses_misaligned_configurations() -> None:
    """Configurations scored on other runs cannot be compared: an error naming the fix."""
    with pytest.raises(ValueError, match="same labelled runs"):
        H.leave_one_source_out({"x": [_stuck("a", 0, True)], "y": [_stuck("a", 1, True)]})


def test_bootstrap_is_reproducible_and_brackets_the_share() -> None:
    """A fixed seed gives the same interval; it contains the point estimate; degenerate inputs
    give degenerate intervals."""
    outcomes = [True] * 43 + [False] * 7
    first = H.bootstrap_interval(outcomes, resamples=500, seed=7)
    again = H.bootstrap_interval(outcomes, resamples=500, seed=7)
    assert first == again
    assert first.value == pytest.approx(0.86)
    assert first.low < first.value < first.high
    assert (first.low, first.high) == (0.76, 0.94)  # seed 7, 500 resamples: pinned
    assert H.bootstrap_interval([False] * 20, resamples=100) == H.Interval(0.0, 0.0, 0.0)
    assert H.bootstrap_interval([True] * 5, resamples=100) == H.Interval(1.0, 1.0, 1.0)
    empty = H.bootstrap_interval([], resamples=100)
    assert math.isnan(empty.value)
    assert math.isnan(empty.low)


def test_bootstrap_refuses_bad_parameters() -> None:
    """Resamples below one or a confidence outside (0, 1): an error with the value and a fix."""
    with pytest.raises(ValueError, match="resamples must be at least 1, got 0"):
        H.bootstrap_interval([True], resamples=0)
    with pytest.raises(ValueError, match="confidence must be in"):
        H.bootstrap_interval([True], confidence=1.0)
