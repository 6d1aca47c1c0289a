"""A comparison on a restored workspace (issue 30, eighth round): the same failing call, run
again right after a revert with the same answer, says the failure predates the edits; it is
news, and the retries before it no longer count. A stuck cycle that re-runs on the state it ran
on before, and the same comparison made again, stay stale."""

from __future__ import annotations

from shared.stagnation import (
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)
from shared.stagnation.shell import is_restore
from tests.shared.stagnation_samples import grep_read, warmed_detector

FAILURE = (
    "==== test session starts ====\ntests/{name}.py ..F..\nFAILED test_repr - TypeError\n1 failed"
)


def _test(name: str) -> ToolEvent:
    """A test file run, failing the same pre-existing way whatever the edits."""
    return ToolEvent(
        tool_name="bash",
        arguments={"command": f"pytest tests/{name}.py"},
        output=FAILURE.format(name=name),
        kind=ToolKind.COMMAND,
        exit_code=1,
    )


def _fix(state: str = "fixed", command: str = "sed -i '40,45d' app.py") -> ToolEvent:
    return ToolEvent(
        tool_name="bash",
        arguments={"command": command},
        output="",
        kind=ToolKind.WRITE,
        path="app.py",
        after_hash=state,
    )


def _revert(paths: str = "app.py") -> ToolEvent:
    return ToolEvent(
        tool_name="bash",
        arguments={"command": f"git checkout {paths}"},
        output="",
        kind=ToolKind.WRITE,
        path="app.py",
        after_hash="original",
    )


def test_a_failure_compared_on_the_restored_workspace_is_news() -> None:
    # Gemini astropy-13236's verification: the main test file run with the fix, the fix
    # reverted and the file run again (the same failure: it predates the fix), the fix
    # re-applied; then each other test file run with the fix, reverted (with the test file),
    # run again, the fix re-applied and the main file run again. Before this rule the main
    # file's fourth failure reached REPLAN (retried failure), then ASK_HUMAN.
    detector = warmed_detector()
    events = [_fix(), _test("test_main"), _revert(), _test("test_main"), _fix(), grep_read("zeta")]
    events.append(_test("test_main"))
    for name in ("test_table", "test_operations"):
        events += [
            _test(name),
            _revert(f"app.py tests/{name}.py"),
            _test(name),
            _fix(command=f"sed -i '40,45d' app.py && sed -i 's/a/b/' tests/{name}.py"),
            _test("test_main"),
        ]
    levels = [detector.observe(event).level for event in events]
    assert max(levels) < StagnationLevel.REPLAN


def test_a_comparison_counts_as_a_new_result() -> None:
    detector = warmed_detector()
    detector.observe(_fix())
    detector.observe(_test("test_table"))
    detector.observe(_revert())
    before = detector.counters()["new_state_changes"]
    detector.observe(_test("test_table"))
    assert int(detector.counters()["new_state_changes"]) > int(before)


def test_the_same_comparison_made_again_is_no_news() -> None:
    # a fix applied and reverted in turn, the same test after each: one comparison, then a loop
    detector = warmed_detector()
    levels = []
    for _ in range(5):
        for event in (_fix(), _test("test_main"), _revert(), _test("test_main")):
            levels.append(detector.observe(event).level)
    assert max(levels) >= StagnationLevel.REPLAN


def test_a_cycle_that_reruns_on_the_same_state_stays_a_loop() -> None:
    # paste, run, clean, paste, run (SWE-agent doubao databind-4189): the run after each paste
    # is on the state the previous run saw, so it is no comparison
    detector = warmed_detector()
    levels = []
    for _ in range(6):
        for event in (_fix("pasted"), _test("test_main"), _fix("cleaned")):
            levels.append(detector.observe(event).level)
    assert max(levels) >= StagnationLevel.REPLAN


def test_negative_results_after_new_edits_are_no_comparison() -> None:
    # new edits, no revert: the same failure each time stays a retried failure
    detector = warmed_detector()
    levels = [
        detector.observe(event).level
        for place in range(6)
        for event in (_fix(f"state-{place}"), _test("test_main"))
    ]
    assert max(levels) >= StagnationLevel.REPLAN


def test_a_comparison_survives_a_restore_from_the_saved_state() -> None:
    detector = warmed_detector()
    detector.observe(_fix())
    detector.observe(_test("test_table"))
    detector.observe(_revert())
    restored = StagnationDetector.from_state(None, detector.to_state())
    before = restored.counters()["new_state_changes"]
    restored.observe(_test("test_table"))
    assert int(restored.counters()["new_state_changes"]) > int(before)


def test_restore_lines() -> None:
    assert is_restore("git checkout astropy/table/table.py")
    assert is_restore("cd /repo && git stash")
    assert is_restore("git restore --staged a.py")
    assert not is_restore("git diff a.py")
    assert not is_restore("git checkout -b fix-table")
    assert not is_restore("git checkout --orphan scratch")
    assert not is_restore("git stash list")
    assert not is_restore("cat <<'EOF' > notes.md\ngit checkout a.py\nEOF")
