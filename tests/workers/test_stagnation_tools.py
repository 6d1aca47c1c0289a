"""The stagnation detector fed by the real tools: run_command, file_read, file_write, grep.

Each turn runs the calls through the worker's :class:`ToolExecutor` with the built-in tools in a
temporary workspace, turns every observation into a :class:`ToolEvent` the way the coordinator
does (``ToolEvent.from_observation(..., strict=False)``) and hands the turn's events to
``observe_batch``, as the coordinator does once per iteration.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from shared.actions import ToolCallAction
from shared.loop_types import LoopConfig, Retry
from shared.stagnation import (
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    StagnationVerdict,
    ToolEvent,
)
from workers.circuit_breaker import CircuitBreakerRegistry
from workers.executor import ToolExecutor
from workers.tools import ToolContext
from workers.tools.registry import default_registry

Call = tuple[str, dict[str, Any]]

# A failing test run whose output changes every run, as real ones do: a timestamp, a process id,
# the line number of the failing assertion, the duration.
FLAKY_FAILURE = """\
import time
n = time.time_ns() // 1000 % 100000
print(f"[2026-12-01 10:{n % 60:02d}:{n % 60:02d}] collecting tests (pid {n % 977})")
print(f"tests/test_config.py:{10 + n % 40}: in test_load")
print("E   KeyError: 'settings.DATABASE'")
print(f"1 failed in {n % 97 / 10:.2f}s")
raise SystemExit(1)
"""


class Session:
    """One agent run: the real tools in ``workspace``, one detector, one turn per iteration."""

    def __init__(self, workspace: Path, config: StagnationConfig | None = None) -> None:
        tools = {tool.definition.name: tool for tool in default_registry(False)}
        self.executor = ToolExecutor(tools, CircuitBreakerRegistry())
        self.context = ToolContext(workspace=workspace, timeout_s=20.0)
        self.loop_config = LoopConfig(default_recovery=Retry(max_attempts=0))
        self.detector = StagnationDetector(config)
        self.observations: list[dict[str, str]] = []
        self._ids = itertools.count()

    def turn(self, *calls: Call) -> StagnationVerdict:
        """Run the calls of one model response and observe them as one iteration."""
        actions = [
            ToolCallAction(call_id=f"c{next(self._ids)}", name=name, arguments=json.dumps(args))
            for name, args in calls
        ]
        report = asyncio.run(self.executor.execute(actions, self.loop_config, self.context))
        self.observations += [dict(o.metadata) for o in report.observations]
        events = [
            ToolEvent.from_observation(action, observation, strict=False)
            for action, observation in zip(actions, report.observations, strict=True)
        ]
        return self.detector.observe_batch(events)


def _command(line: str) -> Call:
    return ("run_command", {"command": line})


def _python(script: str) -> Call:
    return _command(f"{sys.executable} {script}")


def test_a_retried_failure_whose_line_numbers_change_escalates(tmp_path: Path) -> None:
    """Cause 1: run_command's raw output_hash differs every run, the masked text does not."""
    session = Session(tmp_path)
    session.turn(("file_write", {"path": "app.py", "content": FLAKY_FAILURE}))
    verdicts = [session.turn(_python("app.py")) for _ in range(8)]
    raw_hashes = {meta["output_hash"] for meta in session.observations[1:]}
    assert len(raw_hashes) == 8  # a detector comparing output_hash would see 8 new results
    levels = [v.level for v in verdicts]
    assert StagnationLevel.REPLAN in levels[:5]
    assert levels[-1] >= StagnationLevel.ASK_HUMAN
    assert verdicts[-1].kind is StagnationKind.REPEAT


def test_searches_that_find_nothing_are_information_free(tmp_path: Path) -> None:
    """Cause 2: invented names for find and grep, every answer empty, climb to REPLAN."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("def main():\n    return 1\n")
    session = Session(tmp_path)
    session.turn(("file_read", {"path": "src/app.py"}))
    names = ("jdk_install", "java_home", "build_notes", "setup_env", "env_vars", "java_conf")
    verdicts = []
    for name in names:
        verdicts.append(session.turn(_command(f"find . -name '{name}*'")))
        verdicts.append(session.turn(("grep", {"pattern": name, "path": "src"})))
    assert session.observations[2]["matches"] == "0"
    # the first grep's "no match" is news and drains the run by one; every later one is not
    assert [v.stale_steps for v in verdicts[:6]] == [1, 0, 1, 2, 3, 4]
    assert max(v.level for v in verdicts) >= StagnationLevel.REPLAN
    replan = next(v for v in verdicts if v.level is StagnationLevel.REPLAN)
    assert replan.kind is StagnationKind.NO_GRADIENT


def test_an_empty_write_acknowledgement_stays_neutral(tmp_path: Path) -> None:
    """Only a write's acknowledgement is neutral: new files written one after the other."""
    session = Session(tmp_path)
    verdicts = [
        session.turn(("file_write", {"path": f"docs/part{i}.md", "content": f"# part {i}\n"}))
        for i in range(12)
    ]
    assert {(v.level, v.stale_steps) for v in verdicts} == {(StagnationLevel.NONE, 0)}
    assert session.detector.counters()["pending_writes"] == 12


BROKEN = "def total(xs):\n    return 0\n"
TEST_SCRIPT = """\
import app
assert app.total([1, 2, 3]) == 6, f"total is {app.total([1, 2, 3])}"
print("ok")
"""


def test_writes_that_change_bytes_but_not_the_outcome_do_not_reset(tmp_path: Path) -> None:
    """Cause 3: new content every time, the same failing test every time: the run climbs.

    A revert to content already written is stale at once; the fix that changes the test's
    answer counts, and the run drains.
    """
    session = Session(tmp_path)
    session.turn(("file_write", {"path": "test_app.py", "content": TEST_SCRIPT}))
    session.turn(("file_write", {"path": "app.py", "content": BROKEN}))
    session.turn(_python("test_app.py"))
    verdicts = []
    for attempt in range(5):
        body = f"def total(xs):\n    # attempt {attempt}\n" + "    pass\n" * attempt
        body += "    return 0\n"
        verdicts.append(session.turn(("file_write", {"path": "app.py", "content": body})))
        verdicts.append(session.turn(_python("test_app.py")))
    assert [v.stale_steps for v in verdicts[1::2]] == [1, 2, 3, 4, 5]
    assert all(v.new_state_changes == verdicts[0].new_state_changes for v in verdicts)
    revert = session.turn(
        ("file_write", {"path": "app.py", "content": "def total(xs):\n    return 0\n"})
    )
    assert (revert.stale_steps, session.detector.counters()["pending_writes"]) == (6, 0)
    fixed_body = "def total(xs):\n    return sum(xs)\n"
    session.turn(("file_write", {"path": "app.py", "content": fixed_body}))
    fixed = session.turn(_python("test_app.py"))
    assert fixed.new_state_changes == verdicts[0].new_state_changes + 2
    assert fixed.stale_steps < revert.stale_steps


def test_reading_back_a_written_file_is_neither_news_nor_a_loop(tmp_path: Path) -> None:
    """file_read's whole-file hash equals file_write's after-hash: the agent wrote what it reads."""
    session = Session(tmp_path)
    session.turn(("file_write", {"path": "notes.md", "content": "first finding\n"}))
    verdict = session.turn(("file_read", {"path": "notes.md"}))
    assert (verdict.stale_steps, verdict.new_state_changes) == (0, 0)
    assert session.observations[0]["after_hash"] == session.observations[1]["content_hash"]


def test_parallel_identical_calls_climb_one_rung_per_turn(tmp_path: Path) -> None:
    """Three identical failing calls per response: NUDGE, REPLAN, ASK_HUMAN, ABORT, in turn."""
    session = Session(tmp_path)
    session.turn(("file_write", {"path": "app.py", "content": FLAKY_FAILURE}))
    run = _python("app.py")
    escalations = []
    for _ in range(8):
        verdict = session.turn(run, run, run)
        if verdict.escalated:
            escalations.append(verdict.level)
    assert escalations == [
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
        StagnationLevel.ASK_HUMAN,
        StagnationLevel.ABORT,
    ]


UNRELATED_CHECK = """\
print("Exception occurred: Cause cannot be null")
print("Script completed successfully, no errors.")
"""


def test_the_same_answer_counts_across_new_results(tmp_path: Path) -> None:
    """A check answering the same after every re-applied edit, a new search hit between: REPLAN
    at its fourth answer.

    Each new hit drains the stale run (the first one ends the episode), yet the check's answer
    is the one it gave three times before, whatever came between (gpt-4o-mini
    ``databind-4249``: an unrelated script run after each edit, a search between).
    """
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "Deser.java").write_text("class Deser {}\n")
    (tmp_path / "src" / "Notes.java").write_text("// alpha\n// beta\n// gamma\n")
    session = Session(tmp_path)
    edit = ("file_write", {"path": "src/Deser.java", "content": "class Deser { int a; }\n"})
    session.turn(("file_write", {"path": "check.py", "content": UNRELATED_CHECK}))
    session.turn(edit)
    first = session.turn(_python("check.py"))
    checks = []
    for word in ("alpha", "beta", "gamma"):
        session.turn(edit)
        session.turn(("grep", {"pattern": word, "path": "src"}))
        checks.append(session.turn(_python("check.py")))
    assert first.stale_steps == 0
    assert [v.stale_steps for v in checks] == [1, 2, 3]
    assert [v.level for v in checks] == [
        StagnationLevel.NONE,
        StagnationLevel.NUDGE,
        StagnationLevel.REPLAN,
    ]
    assert checks[-1].kind is StagnationKind.REPEAT
    assert ReasonCode.REPEATED_RESULT in checks[-1].reason_codes


def test_the_same_error_counts_across_new_results(tmp_path: Path) -> None:
    """Missing programs under other names, a new read between: REPLAN at the fourth.

    ``command not found`` twice, a read that shows something new (the stall's pressure is
    gone), then twice more: the error is the same one the world gave four times (doubao
    ``xml-531``), not two in a fresh episode.
    """
    (tmp_path / "README.md").write_text("build with mvnw\n")
    (tmp_path / "pom.xml").write_text("<project/>\n")
    (tmp_path / "mvnw").write_text("#!/bin/sh\necho JAVA_HOME is not set\n")
    session = Session(tmp_path)
    session.turn(("file_read", {"path": "README.md"}))
    session.turn(("file_read", {"path": "pom.xml"}))
    missing = [
        _command(f"orga_missing_{name} -version") for name in ("javac", "mvn", "gradle", "ant")
    ]
    opening = [session.turn(missing[0]), session.turn(missing[1])]
    news = session.turn(("file_read", {"path": "mvnw"}))
    later = [session.turn(missing[2]), session.turn(missing[3])]
    assert session.observations[2]["exit_code"] == "127"
    assert [v.stale_steps for v in (*opening, news, *later)] == [0, 1, 0, 1, 2]
    assert [v.level for v in later] == [StagnationLevel.NUDGE, StagnationLevel.REPLAN]
    assert ReasonCode.SAME_ERROR in later[-1].reason_codes
