"""``bench/stagnation_eval.py`` end to end, on hand-made trajectories in the normalised schema."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ci import require

REPO = Path(__file__).resolve().parents[2]
EVAL = REPO / "bench" / "stagnation_eval.py"


SCORER = REPO.parent / "shared" / "stagnation-labels" / "score_stagnation.py"


def labelled_set_scorer(path: Path = SCORER) -> Path:
    """The labelled set's scorer; missing, a failure in CI (where a copy of shared/ sits beside
    the clone) and a skip elsewhere."""
    if not path.exists():
        require(
            f"the labelled set's scorer {path}",
            "put a copy of the shared/ folder (with stagnation-labels/) beside the clone",
        )
    return path


@pytest.fixture
def scorer() -> Path:
    """The scorer the labelled-set tests run (:func:`labelled_set_scorer`)."""
    return labelled_set_scorer()


def test_a_missing_scorer_fails_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Under CI=true a missing scorer fails, naming it and the fix; it never skips there."""
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"score_stagnation.py is required in CI"):
        labelled_set_scorer(tmp_path / "shared" / "stagnation-labels" / "score_stagnation.py")


def _run(folder: Path, *args: str, labels: Path | None = None) -> subprocess.CompletedProcess[str]:
    labels_dir = labels if labels is not None else folder / "no-labels"
    env = {
        **os.environ,
        "ORGA_TRAJECTORIES": str(folder),
        "ORGA_STAGNATION_LABELS": str(labels_dir),
    }
    return subprocess.run(
        [sys.executable, str(EVAL), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _step(i: int, action: str, observation: str) -> dict[str, Any]:
    return {
        "i": i,
        "actor": "agent",
        "tool": None,
        "action": action,
        "observation": observation,
        "thought": None,
        "state": None,
    }


def _trajectory(
    dataset: str, model: str, instance: str, resolved: bool | None, steps: list[dict[str, Any]]
) -> dict[str, Any]:
    label = {
        "resolved": resolved,
        "reward": None,
        "exit_status": "submitted" if resolved else "exit_cost",
        "mistake_step": None,
        "mistake_agent": None,
        "mistake_reason": None,
    }
    return {
        "dataset": dataset,
        "run": f"run_{model}",
        "instance_id": instance,
        "model": model,
        "agent": "hand-made",
        "label": label,
        "steps": steps,
    }


def _write(folder: Path, dataset: str, trajectories: list[dict[str, Any]]) -> None:
    with gzip.open(folder / f"{dataset}.jsonl.gz", "wt", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(json.dumps(trajectory) + "\n")


def _swe_agent_runs() -> list[dict[str, Any]]:
    """A made-up loop under the known loop's name, and a short resolved run with an edit."""
    opening = [_step(i, f"ls -F dir{i}/\n", f"file{i}.txt\nsub{i}/") for i in range(6)]
    loop = [
        _step(
            6 + k, "cd build/\nls -F\n", f"/bin/bash: line {300 + 17 * k}: cd: build/: No such file"
        )
        for k in range(20)
    ]
    resolved = [
        _step(
            0, "open src/App.java\n", "[File: /repo/src/App.java (3 lines total)]\n1:class App {}"
        ),
        _step(
            1, "edit 1:1\nclass App { int x; }\nend_of_edit\n", "[File: /repo/src/App.java]\n1:x"
        ),
        _step(2, "submit\n", "diff --git a/src/App.java b/src/App.java"),
    ]
    dataset = "swe-agent-java-5models"
    return [
        _trajectory(
            dataset, "deepseek-coder-v2", "fasterxml__jackson-databind-4249", False, opening + loop
        ),
        _trajectory(dataset, "gpt-4o", "made-up-1", True, resolved),
    ]


def _mini_swe_runs() -> list[dict[str, Any]]:
    """A resolved bash-only run: a read, a heredoc write (empty ack), a test run."""
    steps = [
        _step(0, "cat app.py\n", "<returncode>0</returncode>\n<output>\nx = 1\n</output>"),
        _step(
            1,
            "cat <<'EOF' > app.py\nx = 2\nEOF\n",
            "<returncode>0</returncode>\n<output>\n</output>",
        ),
        _step(
            2, "python -m pytest -q\n", "<returncode>0</returncode>\n<output>\n1 passed\n</output>"
        ),
    ]
    return [_trajectory("mini-swe-agent-gemini3pro-verified", "gemini", "made-up-2", True, steps)]


def test_eval_skips_cleanly_without_trajectories(tmp_path: Path) -> None:
    """No data folder: a message and exit status 0."""
    result = _run(tmp_path / "absent")
    assert result.returncode == 0
    assert "Skipping" in result.stdout


def test_eval_reports_the_table_and_the_loop(tmp_path: Path) -> None:
    """On hand-made data: the table, the by-exit breakdown, the loop line and the cost line."""
    _write(tmp_path, "swe-agent-java-5models", _swe_agent_runs())
    _write(tmp_path, "mini-swe-agent-gemini3pro-verified", _mini_swe_runs())
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "R>=REPLAN" in out
    assert "the same action 20 times, starting at step 6" in out
    assert "ours        REPLAN at step 9 (+3 from loop start)" in out
    assert "openhands   never reaches REPLAN" in out
    assert "µs per observation" in out
    assert "no labelled set at" in out
    assert "RESULT stagnation_gemini_resolved_ask_human 0.000" in out


def _labels(folder: Path, extra: list[dict[str, Any]] | None = None) -> Path:
    """A two-run label file for the hand-made runs (plus ``extra`` rows), next to a link to the
    real scorer."""
    labels = folder / "labels"
    labels.mkdir()
    (labels / "score_stagnation.py").symlink_to(SCORER)
    rows = [
        {
            "dataset": "swe-agent-java-5models",
            "run": "run_deepseek-coder-v2",
            "instance_id": "fasterxml__jackson-databind-4249",
            "label": "stuck",
            "onset_step": 6,
            "end_step": 25,
            "kind": "exact-repeat",
        },
        {
            "dataset": "mini-swe-agent-gemini3pro-verified",
            "run": "run_gemini",
            "instance_id": "made-up-2",
            "label": "progressing",
            "onset_step": None,
            "end_step": None,
            "kind": None,
        },
        *(extra or []),
    ]
    (labels / "labels.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return labels


@pytest.mark.usefixtures("scorer")
def test_eval_scores_the_labelled_set_with_its_own_scorer(tmp_path: Path) -> None:
    """Labelled runs: every detector's row, the slices, the stall summary, the RESULT lines."""
    _write(tmp_path, "swe-agent-java-5models", _swe_agent_runs())
    _write(tmp_path, "mini-swe-agent-gemini3pro-verified", _mini_swe_runs())
    result = _run(tmp_path, labels=_labels(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for name in ("ours", "openhands", "gemini-cli", "step budget", "naive output hash"):
        assert f"  {name}" in out
    assert "exact-repeat" in out
    assert "ours: detected stalls (episodes reaching REPLAN)" in out
    assert "exact-repeat  -> repeat" in out
    assert "ours: labelled stalls missed within 8 steps of onset: 0" in out
    assert "RESULT stagnation_recall8 1.000" in out
    assert "RESULT stagnation_false_alarms 0.000" in out


@pytest.mark.usefixtures("scorer")
def test_eval_reports_leave_one_source_out_with_intervals(tmp_path: Path) -> None:
    """Held-out figures: one fold per labelled source, each choosing on the other, the pooled
    held-out RESULT lines with their bootstrap intervals; our extra labels scored apart."""
    _write(tmp_path, "swe-agent-java-5models", _swe_agent_runs())
    _write(tmp_path, "mini-swe-agent-gemini3pro-verified", _mini_swe_runs())
    extra = tmp_path / "extra.jsonl"
    extra.write_text(
        json.dumps(
            {
                "dataset": "swe-agent-java-5models",
                "run": "run_gpt-4o",
                "instance_id": "made-up-1",
                "label": "progressing",
                "onset_step": None,
                "end_step": None,
                "kind": None,
            }
        )
        + "\n"
    )
    labels = _labels(tmp_path)
    result = _run(tmp_path, "--labelled-only", "--extra-labels", str(extra), labels=labels)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "shared labelled set: held-out figures (grid of 12 configurations" in out
    folds = [line for line in out.splitlines() if "chosen on" not in line and "(" in line]
    assert any(line.startswith("  swe-agent-java-5models") for line in folds)
    assert "RESULT stagnation_loso_recall_within_8 1.000" in out
    assert "RESULT stagnation_loso_recall_within_8_ci95 1.000 1.000" in out
    assert "RESULT stagnation_loso_false_alarm_rate 0.000" in out
    assert "RESULT stagnation_loso_false_alarm_rate_ci95 0.000 0.000" in out
    assert "extra labels extra.jsonl: held-out figures" in out
    assert "RESULT stagnation_extra_false_alarm_rate 0.000" in out


@pytest.mark.usefixtures("scorer")
def test_eval_lists_the_stalls_ours_misses(tmp_path: Path) -> None:
    """A stall ours never flags is listed with its onset and the tool results in its window."""
    _write(tmp_path, "swe-agent-java-5models", _swe_agent_runs())
    _write(tmp_path, "mini-swe-agent-gemini3pro-verified", _mini_swe_runs())
    quiet = {
        "dataset": "swe-agent-java-5models",
        "run": "run_gpt-4o",
        "instance_id": "made-up-1",
        "label": "stuck",
        "onset_step": 0,
        "end_step": 2,
        "kind": "no-gradient",
    }
    result = _run(tmp_path, "--labelled-only", labels=_labels(tmp_path, [quiet]))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ours: labelled stalls missed within 8 steps of onset: 1" in out
    listed = next(line for line in out.splitlines() if "made-up-1" in line and "onset" in line)
    assert "first REPLAN never" in listed
    assert listed.endswith("tool results in window 3")
    assert "RESULT stagnation_recall8 0.500" in out


def _who_and_when_run() -> dict[str, Any]:
    """A Magentic-One run whose orchestrator says it is looping while every page is new text."""
    steps: list[dict[str, Any]] = [
        {**_step(0, "Find the FedEx price of an envelope to New York.", ""), "actor": "human"}
    ]
    for k in range(8):
        ledger = {
            "is_request_satisfied": {"reason": "no price yet", "answer": False},
            "is_in_loop": {"reason": "the same form again", "answer": k >= 2},
            "is_progress_being_made": {"reason": "-", "answer": k < 2},
            "next_speaker": {"reason": "-", "answer": "WebSurfer"},
            "instruction_or_question": {"reason": "-", "answer": f"Open result {k} of the search."},
        }
        steps += [
            {
                **_step(0, "Updated Ledger:\n" + json.dumps(ledger), ""),
                "actor": "Orchestrator (thought)",
            },
            {
                **_step(0, f"Open result {k} of the search.", ""),
                "actor": "Orchestrator (-> WebSurfer)",
            },
            {
                **_step(0, f"I clicked result {'abcdefgh'[k]}: page {'qrstuvwx'[k]}", ""),
                "actor": "WebSurfer",
            },
        ]
    steps = [{**step, "i": i, "observation": None} for i, step in enumerate(steps)]
    return {**_trajectory("who-and-when", "gpt-4o", "1", False, steps), "run": "Hand-Crafted"}


@pytest.mark.usefixtures("scorer")
def test_eval_feeds_the_models_messages(tmp_path: Path) -> None:
    """Who&When: the orchestrator's ledger reaches the detector as a turn; its self-reports
    raise the ladder although every tool result is new."""
    _write(tmp_path, "swe-agent-java-5models", _swe_agent_runs())
    _write(tmp_path, "mini-swe-agent-gemini3pro-verified", _mini_swe_runs())
    _write(tmp_path, "who-and-when", [_who_and_when_run()])
    stuck = {
        "dataset": "who-and-when",
        "run": "Hand-Crafted",
        "instance_id": "1",
        "label": "stuck",
        "onset_step": 10,
        "end_step": 24,
        "kind": "no-gradient",
    }
    result = _run(tmp_path, "--labelled-only", labels=_labels(tmp_path, [stuck]))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ours: labelled stalls missed within 8 steps of onset: 0" in out
    assert "said you are stuck or not progressing" in out
