"""The stagnation detector, rule by rule, on small hand-made trajectories."""

from __future__ import annotations

import pytest

from shared.stagnation import (
    Ladder,
    ReasonCode,
    StagnationConfig,
    StagnationDetector,
    StagnationKind,
    StagnationLevel,
    ToolEvent,
)
from shared.stagnation.events import ToolKind
from tests.shared.test_stagnation_trajectories import (
    ack,
    command,
    failed_write,
    noted,
    page,
    poll,
    read,
    replay,
    search,
    sha,
    write,
)

NO_GATE = StagnationConfig(min_steps=0)
LEVELS = list(StagnationLevel)


def _opening() -> list[ToolEvent]:
    """Five reads of new content: the start of any task."""
    return [read(f"src/{name}.py", f"def {name}(): ...") for name in "abcde"]


def _bash_loop(count: int) -> list[ToolEvent]:
    """The same failing ``cd``, whose error differs only by the bash line number."""
    return [
        ToolEvent(
            tool_name="bash",
            arguments={"command": "cd fastxml/ && ls -F"},
            output=f"/bin/bash: line {334 + 18 * i}: cd: fastxml/: No such file or directory\n"
            "fasterxml/",
            is_error=True,
        )
        for i in range(count)
    ]


# -- the counters --------------------------------------------------------------------------------


def test_rereading_with_other_line_numbers_is_not_new() -> None:
    """The same lines shown with other line numbers (same file state) add no new state change."""
    first = ToolEvent(
        tool_name="file_read",
        arguments={"path": "a.py", "around": "parse"},
        output="  12\tdef parse(text):\n  13\t    return text",
        kind=ToolKind.READ,
        path="a.py",
        content_hash=sha("v1"),
    )
    again = first.model_copy(
        update={
            "arguments": {"path": "a.py", "around": "the parser"},
            "output": "  40\tdef parse(text):\n  41\t    return text",
        }
    )
    verdicts = replay([first, again])
    assert [v.new_state_changes for v in verdicts] == [1, 1]
    assert verdicts[1].stale_steps == 1


def test_paging_through_a_long_file_is_new_each_page() -> None:
    """Each new page of an unchanged file is new; going back to a page already read is not."""
    words = ("parse", "render", "load", "save", "check", "merge", "split", "plan", "run", "stop")
    lines = [f"def {verb}_{noun}(): ..." for noun in words for verb in words * 5]
    pages = [page("big.py", lines, start, 50) for start in range(1, 501, 50)]
    verdicts = replay([*pages, pages[3]])
    assert [v.new_state_changes for v in verdicts] == [*range(1, 11), 10]


def test_command_with_seen_name_exit_and_output_is_not_new() -> None:
    """Same tool, exit code and masked output is not new; another exit code is."""
    verdicts = replay(
        [
            command("pytest", "FAILED test_a - assert 2 == 3\n1 failed in 0.31s", 1),
            command("pytest -x", "FAILED test_a - assert 2 == 3\n1 failed in 0.29s", 1),
            command("pytest", "FAILED test_a - assert 2 == 3\n1 failed in 0.30s", 2),
        ]
    )
    assert [v.new_state_changes for v in verdicts] == [1, 1, 2]


def test_write_whose_after_equals_before_changes_nothing() -> None:
    """A write that leaves the file as it was is stale; a real one is pending its outcome."""
    detector = StagnationDetector()
    noop = detector.observe(write("a.py", "x = 1", "x = 1"))
    assert (noop.stale_steps, detector.counters()["pending_writes"]) == (1, 0)
    real = detector.observe(write("a.py", "x = 1", "x = 2"))
    assert (real.stale_steps, real.new_state_changes) == (1, 0)
    assert detector.counters()["pending_writes"] == 1


def test_write_without_before_hash_uses_the_last_known_state() -> None:
    """With no before-hash, the state last read or written for the path stands in for it."""
    detector = StagnationDetector()
    detector.observe(read("a.py", "x = 2"))
    assert detector.observe(write("a.py", None, "x = 2")).stale_steps == 1
    assert detector.observe(write("a.py", None, "x = 3")).stale_steps == 1
    assert detector.observe(write("a.py", None, "x = 3")).stale_steps == 2
    assert detector.counters()["pending_writes"] == 1


def test_writes_count_when_what_they_could_affect_comes_out_differently() -> None:
    """A pending write is confirmed by the next result that differs; the same result drops it."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(command("pytest -q", "FAILED test_a - KeyError\n1 failed", 1))
    detector.observe(write("app.py", "v1", "v2"))
    same = detector.observe(command("pytest -q", "FAILED test_a - KeyError\n1 failed", 1))
    assert (same.new_state_changes, same.stale_steps) == (1, 1)
    detector.observe(write("app.py", "v2", "v3"))
    fixed = detector.observe(command("pytest -q", "1 passed", 0))
    assert (fixed.new_state_changes, fixed.stale_steps) == (3, 0)


def test_a_changed_answer_of_the_same_call_confirms_writes_even_if_seen_elsewhere() -> None:
    """After writes, a call's first answer, or an answer it never gave, is their outcome."""
    detector = StagnationDetector(NO_GATE)
    detector.observe(search("Legacy", "no match for 'Legacy' in src (3 files searched)"))
    detector.observe(search("OldName", "src/a.py:1: import OldName"))
    detector.observe(write("src/a.py", "import OldName", "import NewName"))
    done = detector.observe(search("OldName", "no match for 'OldName' in src (3 files searched)"))
    assert (done.new_state_changes, done.stale_steps) == (4, 0)
    # without the write, the same answer (seen for another pattern) is no news
    again = StagnationDetector(NO_GATE)
    again.observe(search("Legacy", "no match for 'Legacy' in src (3 files searched)"))
    assert again.observe(search("Old", "no match for 'Old' in src (3 files searched)")).stale_steps


def test_reverting_to_a_state_already_seen_is_not_new() -> None:
    """Putting back content already written, or re-applying the same edit, is stale."""
    insert = {"path": "a.py", "insert_at": 3, "text": "log()"}
    edits = [
        write("a.py", "v1", "v2"),
        write("a.py", "v2", "v1"),
        ToolEvent(
            tool_name="insert", arguments=insert, kind=ToolKind.WRITE, path="a.py", after_hash="h1"
        ),
        ToolEvent(
            tool_name="insert", arguments=insert, kind=ToolKind.WRITE, path="a.py", after_hash="h2"
        ),
    ]
    verdicts = replay([read("a.py", "v1"), *edits])
    assert [v.stale_steps for v in verdicts] == [0, 0, 1, 1, 2]


def test_the_same_edit_at_shifting_line_ranges_is_reapplied() -> None:
    """Delete line N and rewrite the block below, N down by one each round: stale from round 2."""
    block = "    {\n        ArrayList<JavaType> types = new ArrayList<>();\n    }"
    events = []
    for round_, line in enumerate(range(72, 68, -1)):
        delete = {"command": f"edit {line}:{line}\nend_of_edit"}
        rewrite = {"command": f"edit {line}:{line + 11}\n{block}\nend_of_edit"}
        events += [
            ToolEvent(
                tool_name="edit",
                arguments=delete,
                kind=ToolKind.WRITE,
                path="T.java",
                after_hash=f"deleted{round_}",
            ),
            ToolEvent(
                tool_name="edit",
                arguments=rewrite,
                kind=ToolKind.WRITE,
                path="T.java",
                after_hash=f"rewritten{round_}",
            ),
        ]
    verdicts = replay(events, NO_GATE)
    assert [v.stale_steps for v in verdicts] == [0, 0, 1, 2, 3, 4, 5, 6]
    # the same edit in other files is a batch; other numbers written are another edit
    batch = [
        ToolEvent(
            tool_name="edit",
            arguments={"command": "edit 3:3\nimport x\nend_of_edit"},
            kind=ToolKind.WRITE,
            path=f"m{i}.py",
            after_hash=f"h{i}",
        )
        for i in range(5)
    ]
    tuned = [write("a.py", f"x = {i}", f"x = {i + 1}") for i in range(5)]
    for events in (batch, tuned):
        assert {v.stale_steps for v in replay(events, NO_GATE)} == {0}


def test_failed_write_with_a_refusal_already_met_is_stale() -> None:
    """Refusals differing only by numbers are one refusal; a new refusal reason is news, unless
    the same target was refused since its last success (the refusal signal holds it neutral:
    another reason for refusing the same write is no progress)."""
    events = [failed_write("a.py", f"v{i}", f"lint error, line {i}: bad indent") for i in range(6)]
    verdicts = replay([read("a.py", "x"), *events])
    assert (verdicts[-1].new_state_changes, verdicts[-1].stale_steps) == (2, 5)
    same_target = replay([*events[:2], failed_write("a.py", "v9", "permission denied")])
    assert (same_target[-1].new_state_changes, same_target[-1].stale_steps) == (1, 1)
    other_target = replay([*events[:2], failed_write("b.py", "v9", "permission denied")])
    assert other_target[-1].new_state_changes == 2


def test_creating_a_file_is_a_change_once_its_effect_shows() -> None:
    """``before_hash`` "" (the file did not exist) differs from any content: pending, then new."""
    detector = StagnationDetector()
    created = write("new.py", None, "print()").model_copy(update={"before_hash": ""})
    assert detector.observe(created).stale_steps == 0
    assert detector.counters()["pending_writes"] == 1
    assert detector.observe(command("python new.py", "", 0)).new_state_changes == 2


def test_reading_back_what_was_written_is_neutral() -> None:
    """A read of the state our own write left shows nothing new, nor is it a loop step."""
    detector = StagnationDetector()
    detector.observe(write("a.py", "x = 1", "x = 2"))
    verdict = detector.observe(read("a.py", "x = 2"))
    assert (verdict.stale_steps, verdict.new_state_changes) == (0, 0)
    assert detector.counters()["pending_writes"] == 1


def test_empty_acknowledgements_of_other_tools_are_neither_progress_nor_loop() -> None:
    """Thirty "ok" answers of a note-taking tool leave every counter but the step count."""
    verdicts = replay([noted(f"step {i}") for i in range(30)], NO_GATE)
    assert {v.level for v in verdicts} == {StagnationLevel.NONE}
    assert (verdicts[-1].new_state_changes, verdicts[-1].stale_steps) == (0, 0)
    assert verdicts[-1].steps_since_milestone == 30


def test_empty_search_results_are_information_free() -> None:
    """Searches that find nothing are stale from the first one, whatever they looked for."""
    finds = [
        ToolEvent(
            tool_name="bash",
            arguments={"command": f"find / -name '{name}*'"},
            kind=ToolKind.READ,
        )
        for name in ("jdk", "java_home", "javac", "openjdk", "temurin", "sdkman", "jre")
    ]
    verdicts = replay(finds, NO_GATE)
    assert [v.stale_steps for v in verdicts] == list(range(1, 8))
    assert verdicts[-1].level is StagnationLevel.REPLAN
    assert verdicts[-1].kind is StagnationKind.NO_GRADIENT


def test_silent_success_says_something_the_first_time_a_call_is_made() -> None:
    """A command's empty output is new once per call; the same call silent again is stale."""
    verdicts = replay([ack("python reproduce.py"), ack("make"), ack("python reproduce.py")])
    assert [v.new_state_changes for v in verdicts] == [1, 2, 2]
    assert verdicts[-1].stale_steps == 1


def test_acknowledgements_do_not_break_a_repeat() -> None:
    """Acks between three identical (call, result) pairs neither reset nor add to the count."""
    loop = command("make", "error: missing separator", 2)
    verdicts = replay([loop, noted("a"), loop, noted("b"), loop], NO_GATE)
    assert verdicts[-1].level is StagnationLevel.NUDGE
    assert verdicts[-1].kind is StagnationKind.REPEAT


def test_silent_failure_is_not_an_acknowledgement() -> None:
    """Exit 1 with no output is a result (grep found nothing), not an ack."""
    verdicts = replay([command("grep foo a.py", "", 1)])
    assert verdicts[0].new_state_changes == 1


# -- masking -------------------------------------------------------------------------------------


def test_outputs_differing_only_by_a_line_number_are_one_observation() -> None:
    """The 53-step SWE-agent loop shape: REPLAN within 8 steps of the loop's start at step 6."""
    verdicts = replay([*_opening(), read("README", "hello"), *_bash_loop(20)])
    first_replan = next(i for i, v in enumerate(verdicts) if v.level >= StagnationLevel.REPLAN)
    assert first_replan - 6 <= 8
    assert verdicts[first_replan].kind is StagnationKind.REPEAT
    assert ReasonCode.REPEATED_RESULT in verdicts[first_replan].reason_codes


def test_numeric_only_results_are_compared_unmasked() -> None:
    """A calculator's different answers are new; masking would have made them one."""
    events = [
        ToolEvent(tool_name="calculate", arguments={"expression": f"{a} + 7"}, output=f"{a + 7}")
        for a in range(10)
    ]
    verdicts = replay(events, NO_GATE)
    assert verdicts[-1].new_state_changes == 10
    assert verdicts[-1].level is StagnationLevel.NONE


# -- input-side signals --------------------------------------------------------------------------


def test_short_cycle_is_detected_and_named() -> None:
    """Three reads of unchanged files going round: a cycle of period 3, REPLAN at 4 rounds."""
    round_trip = [read("a", "A"), read("b", "B"), read("c", "C")]
    quiet_window = Ladder(nudge=20, replan=25, ask_human=28, abort=30)
    verdicts = replay(round_trip * 4, StagnationConfig(min_steps=0, stale=quiet_window))
    assert verdicts[8].kind is StagnationKind.CYCLE
    assert verdicts[11].level is StagnationLevel.REPLAN
    assert ReasonCode.CYCLE in verdicts[11].reason_codes


def test_the_most_specific_signal_names_the_rung_it_reaches() -> None:
    """When the window and a cycle both reach the next rung, the cycle names it."""
    round_trip = [read("a", "A"), read("b", "B")]
    verdicts = replay(round_trip * 5, StagnationConfig(min_steps=0))
    first_replan = next(v for v in verdicts if v.level is StagnationLevel.REPLAN)
    assert first_replan.kind is StagnationKind.CYCLE


def test_an_other_tools_errors_add_up_within_the_episode_only() -> None:
    """The world's errors count across new results; a fetch's (an *other* tool's) do not."""

    def fetch(url: str) -> ToolEvent:
        return ToolEvent(
            tool_name="web_fetch", arguments={"url": url}, output="HTTP 404", is_error=True
        )

    def missing(name: str) -> ToolEvent:
        return command(f"{name} -version", f"bash: {name}: command not found", 127)

    opening = [read(f"src/{name}.py", f"def {name}(): ...") for name in "abcde"]
    for failing, expected in ((fetch, StagnationLevel.NONE), (missing, StagnationLevel.NUDGE)):
        events = list(opening)
        for i, name in enumerate(("javac", "mvn", "ant")):
            events += [failing(name), read(f"docs/{i}.md", f"note {name}")]
        verdicts = replay([*events, failing("gradle")], NO_GATE)
        assert verdicts[-1].level is expected
        assert verdicts[-1].stale_steps == 1


def test_same_error_whatever_the_arguments() -> None:
    """The same error from the same tool with other arguments each time is a repeat."""
    events = [
        command(f"javac -cp lib/{name} T.java", "bash: javac: command not found", 127)
        for name in ("alpha", "beta", "gamma", "delta", "epsilon")
    ]
    verdicts = replay(events, NO_GATE)
    assert verdicts[2].level is StagnationLevel.NUDGE
    assert verdicts[3].level is StagnationLevel.REPLAN
    assert verdicts[3].kind is StagnationKind.REPEAT
    assert ReasonCode.SAME_ERROR in verdicts[3].reason_codes
    assert ReasonCode.REPEATED_RESULT not in verdicts[3].reason_codes


def test_identical_calls_in_one_batch_are_repeats() -> None:
    """Three identical calls in one response count as repeats even when their outputs differ."""
    calls = [command("mvn test", f"run {tag}: BUILD FAILURE") for tag in ("one", "two", "three")]
    batched = StagnationDetector(NO_GATE).observe_batch(calls)
    assert batched.level is StagnationLevel.NUDGE
    assert ReasonCode.BATCH_DUPLICATE in batched.reason_codes
    one_by_one = replay(calls, NO_GATE)
    assert one_by_one[-1].level is StagnationLevel.NONE


def test_empty_batch_returns_the_current_verdict() -> None:
    """Observing an empty batch changes nothing."""
    detector = StagnationDetector()
    assert detector.observe_batch([]) == detector.verdict()


# -- the composite trigger -----------------------------------------------------------------------


def test_nothing_is_flagged_until_more_than_min_steps() -> None:
    """A loop from the first step stays NONE for ``min_steps`` steps, then climbs rung by rung.

    By then the loop is long enough for ASK_HUMAN, but the model still gets a NUDGE and a
    REPLAN first: one rung per stale event.
    """
    verdicts = replay(_bash_loop(14), StagnationConfig(min_steps=10))
    assert {v.level for v in verdicts[:10]} == {StagnationLevel.NONE}
    assert [v.level for v in verdicts[10:]] == LEVELS[1:]


def test_long_task_reaching_milestones_never_trips() -> None:
    """1,000 steps of pure re-reading, but a milestone every ``min_steps`` steps: always NONE."""
    detector = StagnationDetector()
    stale = read("notes.md", "same notes")
    for step in range(1000):
        if step % detector.config.min_steps == 0:
            detector.milestone(f"m{step}")
        assert detector.observe(stale).level is StagnationLevel.NONE


def _wandering() -> list[ToolEvent]:
    return [
        read(f"src/{name}.py", f"def {name}(): ...", focus=f"{topic} of {name}")
        for topic in ("callers", "the types", "edge cases", "error paths", "defaults", "docs", "io")
        for name in "abcde"
    ]


def test_ladder_rises_in_order_at_the_default_rungs() -> None:
    """Wandering climbs NUDGE, REPLAN, ASK_HUMAN, ABORT at 4/7/12/20 stale steps."""
    detector = StagnationDetector()
    levels = [detector.observe(e).level for e in [*_opening(), *_wandering()[:20]]]
    firsts = {level: levels.index(level) - 4 for level in LEVELS[1:]}
    assert firsts == {
        StagnationLevel.NUDGE: 4,
        StagnationLevel.REPLAN: 7,
        StagnationLevel.ASK_HUMAN: 12,
        StagnationLevel.ABORT: 20,
    }
    assert levels == sorted(levels)


def test_new_results_drain_the_stale_run_one_step_each() -> None:
    """A new result takes one step off the stale run (a leaky count); the episode, and the
    level, end when it is empty, so an isolated new fact does not wipe a long stall."""
    detector = StagnationDetector()
    for event in [*_opening(), *_wandering()[:5]]:
        detector.observe(event)
    assert detector.verdict().level is StagnationLevel.NUDGE
    news = [command(f"python check_{i}.py", f"answer {chr(97 + i)}") for i in range(5)]
    drained = [detector.observe(event) for event in news]
    assert [v.stale_steps for v in drained] == [4, 3, 2, 1, 0]
    assert [v.level for v in drained] == [StagnationLevel.NUDGE] * 4 + [StagnationLevel.NONE]
    assert detector.observe(_wandering()[0]).level is StagnationLevel.NONE


def test_without_recovery_a_new_result_ends_the_stall_at_once() -> None:
    """``recovery=0``: the first new result ends the episode."""
    detector = StagnationDetector(StagnationConfig(recovery=0))
    for event in [*_opening(), *_wandering()[:5]]:
        detector.observe(event)
    verdict = detector.observe(command("python check.py", "answer"))
    assert (verdict.level, verdict.stale_steps) == (StagnationLevel.NONE, 0)


def test_milestone_resets_counters_and_level() -> None:
    """After a milestone the step counter, the new changes and the level start from zero."""
    detector = StagnationDetector(NO_GATE)
    for event in _bash_loop(6):
        detector.observe(event)
    assert detector.verdict().level is StagnationLevel.REPLAN
    detector.milestone("reproduced")
    verdict = detector.verdict()
    assert (verdict.level, verdict.steps_since_milestone, verdict.new_state_changes) == (
        StagnationLevel.NONE,
        0,
        0,
    )
    assert detector.milestones == ["reproduced"]


def test_escalated_is_set_only_when_the_level_rises() -> None:
    """``escalated`` marks the events that raised the level, nothing else."""
    verdicts = replay(_bash_loop(13), NO_GATE)
    raised = [i for i, v in enumerate(verdicts) if v.escalated]
    assert raised == [2, 3, 6, 9]


# -- amnesia and no-gradient ---------------------------------------------------------------------


def _rereads() -> list[ToolEvent]:
    """Re-reading the opening files, each time for another stated reason."""
    return [
        read(f"src/{name}.py", f"def {name}(): ...", why=reason)
        for reason in ("recall the api", "check naming", "look again")
        for name in "abcde"
    ]


def test_rereading_after_compaction_is_amnesia() -> None:
    """Content first seen before ``compacted()`` and read again is classified as amnesia."""
    detector = StagnationDetector()
    for event in _opening():
        detector.observe(event)
    detector.compacted()
    verdicts = [detector.observe(e) for e in _rereads()]
    replan = next(v for v in verdicts if v.level is StagnationLevel.REPLAN)
    assert replan.kind is StagnationKind.AMNESIA
    assert ReasonCode.AMNESIA_REREAD in replan.reason_codes
    assert "stop re-reading" in replan.message


def test_same_rereads_without_compaction_are_no_gradient() -> None:
    """The same trajectory with no compaction: zero gain, distinct signatures, no_gradient."""
    verdicts = replay([*_opening(), *_rereads()])
    replan = next(v for v in verdicts if v.level is StagnationLevel.REPLAN)
    assert replan.kind is StagnationKind.NO_GRADIENT
    assert replan.reason_codes == (ReasonCode.STALE_WINDOW,)


# -- per-tool awareness and switches -------------------------------------------------------------


def test_polling_with_changing_results_is_progress() -> None:
    """The same status call 60 times, its result changing each time, is never flagged."""
    stages = ("pulling", "building", "testing", "uploading")
    parts = ("core", "api", "web", "cli", "docs")
    events = [poll("job-7", f"{stage} {part}") for stage in stages for part in parts]
    events += [poll("job-7", f"{pct}%") for pct in range(50, 90)]
    assert {v.level for v in replay(events, NO_GATE)} == {StagnationLevel.NONE}


def test_patient_tools_wait_without_pressure() -> None:
    """An unchanged poll is neutral for a patient tool and escalates for any other tool."""
    waiting = [poll("job-7", "running") for _ in range(40)]
    patient = StagnationConfig(min_steps=0, patient_tools=frozenset({"job_status"}))
    assert replay(waiting, patient)[-1].level is StagnationLevel.NONE
    assert replay(waiting, NO_GATE)[-1].level is StagnationLevel.ABORT


def test_a_short_answer_keeps_its_numbers() -> None:
    """``running, 57% done`` then ``58%``: a short answer's numbers are its content, so each
    poll is new; a long output's numbers are masked (line numbers, timings)."""
    polls = [poll("job-7", f"running, {pct}% done") for pct in range(40)]
    assert {v.level for v in replay(polls, NO_GATE)} == {StagnationLevel.NONE}


def test_disabled_detector_counts_but_never_flags() -> None:
    """``enabled=False``: counters go on, the level stays NONE."""
    verdicts = replay(_bash_loop(40), StagnationConfig(enabled=False))
    assert {v.level for v in verdicts} == {StagnationLevel.NONE}
    assert verdicts[-1].stale_steps == 39


def test_reset_window_starts_a_new_episode_but_keeps_the_step_count() -> None:
    """A reviewer's hint clears the episode; steps since the last milestone keep counting."""
    detector = StagnationDetector(NO_GATE)
    for event in _bash_loop(8):
        detector.observe(event)
    detector.reset_window()
    verdict = detector.verdict()
    assert (verdict.level, verdict.stale_steps, verdict.steps_since_milestone) == (
        StagnationLevel.NONE,
        0,
        8,
    )


def test_counters_report_the_level_and_counts() -> None:
    """``counters()`` gives the operator the numbers behind the verdict."""
    detector = StagnationDetector(NO_GATE)
    detector.milestone("started")
    for event in [*_opening(), *_bash_loop(4)]:
        detector.observe(event)
    detector.compacted()
    assert detector.counters() == {
        "level": "replan",
        "steps_since_milestone": 9,
        "new_state_changes": 6,
        "stale_steps": 3,
        "pending_writes": 0,
        "stale_turns": 0,
        "total_steps": 9,
        "milestones": 1,
        "compactions": 1,
    }


# -- texts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "level", "expected"),
    [
        (3, StagnationLevel.NUDGE, "[progress check] 3 steps since the last milestone"),
        (4, StagnationLevel.REPLAN, "Admit this path is dead"),
        (7, StagnationLevel.ASK_HUMAN, "last milestone: reproduced"),
        (10, StagnationLevel.ABORT, "Milestones kept: reproduced"),
    ],
)
def test_each_level_carries_its_text(steps: int, level: StagnationLevel, expected: str) -> None:
    """NUDGE shows the counters, REPLAN forces a new plan, the operator texts name milestones."""
    detector = StagnationDetector(NO_GATE)
    detector.milestone("reproduced")
    verdict = detector.verdict()
    for event in _bash_loop(steps):
        verdict = detector.observe(event)
    assert verdict.level is level
    assert expected in verdict.message


def test_no_text_at_none() -> None:
    """A verdict at NONE has no message, no kind and no reason codes."""
    verdict = replay([read("a", "A")])[0]
    assert (verdict.message, verdict.kind, verdict.reason_codes) == ("", None, ())


def test_search_results_count_as_reads() -> None:
    """A search returning results already seen is not new, whatever the pattern."""
    verdicts = replay([search("foo", "a.py:3: foo()"), search("fo+", "a.py:3: foo()")])
    assert [v.new_state_changes for v in verdicts] == [1, 1]


# -- what is compared ----------------------------------------------------------------------------


def test_the_raw_output_hash_is_not_what_is_compared() -> None:
    """Two runs whose raw hashes differ but whose masked text is the same are one result."""
    runs = [
        command("pytest", f"exit code: 1\n[12:00:0{i}] test_a.py:{40 + i}: KeyError\n", 1)
        for i in range(2)
    ]
    hashed = [r.model_copy(update={"output_hash": sha(r.output)}) for r in runs]
    assert hashed[0].output_hash != hashed[1].output_hash
    assert replay(hashed)[1].stale_steps == 1


def test_an_echo_of_the_arguments_is_no_information() -> None:
    """ "No matches for X" and "X: command not found" say the same whatever X is."""
    searches = [
        ToolEvent(
            tool_name="search_dir",
            arguments={"command": f'search_dir "{q}"'},
            output=f'No matches found for "{q}" in /repo',
            kind=ToolKind.READ,
        )
        for q in ("install JDK", "build script", "JAVA_HOME setup")
    ]
    typos = [
        command(line, f"/bin/sh: 1: {line.split()[0]}: not found", 127)
        for line in ("find. -name x", "cd.. ", "mvnn compile")
    ]
    assert [v.stale_steps for v in replay(searches)] == [0, 1, 2]
    assert [v.stale_steps for v in replay(typos)] == [0, 1, 2]


def test_a_search_hit_that_contains_its_pattern_is_content() -> None:
    """In a successful answer only a quoted echo is masked: other hits are other content."""
    verdicts = replay(
        [search("parse", "a.py:3: def parse():"), search("load", "a.py:9: def load():")]
    )
    assert [v.new_state_changes for v in verdicts] == [1, 2]


def test_run_command_lines_are_judged_by_what_they_do() -> None:
    """An empty ``find`` is an empty search; a heredoc into a file is a pending write."""
    detector = StagnationDetector()
    empty = detector.observe(command("find / -name 'jdk*' 2>/dev/null", "exit code: 0\n", 0))
    assert empty.stale_steps == 1
    wrote = detector.observe(command("cat <<'EOF' > fix.py\nx = 1\nEOF", "exit code: 0\n", 0))
    assert (wrote.stale_steps, detector.counters()["pending_writes"]) == (1, 1)


def test_a_failing_call_retried_unchanged_counts_across_new_results() -> None:
    """The same failing call between new results: the retry count keeps going."""
    failing = command("deploy --env prod", "error: credentials expired", 1)
    events = []
    for i in range(4):
        events += [failing, read(f"docs/page{i}.md", f"page {i}")]
    verdicts = replay(events, NO_GATE)
    assert max(v.level for v in verdicts) >= StagnationLevel.REPLAN
    assert ReasonCode.RETRIED_FAILURE in verdicts[-2].reason_codes


def test_one_batch_raises_the_level_one_rung_at_most() -> None:
    """Many stale calls in one response still give a NUDGE first, then a REPLAN next turn."""
    detector = StagnationDetector(NO_GATE)
    loop = _bash_loop(30)
    first = detector.observe_batch(loop[:15])
    second = detector.observe_batch(loop[15:])
    assert (first.level, second.level) == (StagnationLevel.NUDGE, StagnationLevel.REPLAN)
    assert first.escalated and second.escalated


def test_a_write_refused_for_the_same_reason_counts_across_new_results() -> None:
    """The same refusal of the same tool, whatever the arguments, counted across a new lookup:
    the fifth one reaches REPLAN (a refused write's first refusal is not counted:
    ``shared.stagnation.signal.occurrences``) while the same-error count (since the lookup) is
    at four."""

    def refused(i: int) -> ToolEvent:
        return failed_write("r1", f"flights {i}", "Error: flight HAT030 not available")

    lookup = read("search", "[flight a]")
    events = [refused(0), lookup, refused(1), lookup, refused(2), refused(3), refused(4)]
    verdicts = replay(events, NO_GATE)
    assert [v.level for v in verdicts[-2:]] == [StagnationLevel.NUDGE, StagnationLevel.REPLAN]
    assert ReasonCode.RETRIED_FAILURE in verdicts[-1].reason_codes
