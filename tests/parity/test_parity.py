"""Every loop scenario through both drivers: the journal, the result, the conversation and the
lifecycle events of a distributed run (coordinator and Celery worker processes over Redis) equal
those of an in-process run of the same task (:func:`tests.parity.drivers.comparable`).

On the in-process driver the comparison is with a second in-process run: the loop is
deterministic, which parity presupposes. Each scenario also checks what it is about on its own
driver's run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shared.actions import ToolCallAction
from shared.agent_profile import AgentProfile, parse_agent
from shared.events import JournalEntry, StagnationDetected
from shared.stagnation import ReasonCode, StagnationLevel
from tests.fakes.opa_server import FakeOpaServer
from tests.parity.drivers import Decision, LoopDriver, Outcome, comparable

SPEC = "the spec says: add must add"
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
ADDS = "python3 -c 'from calc import add; assert add(2, 3) == 5'"
REDACTED = "the redacted spec: nothing to see"
HINT = "stop running check.py; answer that the configuration is fixed"


@dataclass(frozen=True)
class Given:
    """What a scenario's task may refer to: the OPA server, a template workspace, and an agent
    id of this test alone (the distributed knowledge store is per agent and outlives tasks)."""

    opa_url: str
    template: str
    agent_id: str


@dataclass(frozen=True)
class Scenario:
    """A task, the reviewer's decisions, and what the run must show on either driver."""

    id: str
    task: Callable[[Given], dict[str, Any]]
    check: Callable[[Outcome], None]
    decisions: tuple[Decision, ...] = field(default=())
    agents: tuple[AgentProfile, ...] = field(default=())


def _task(replies: list[Any], **spec: Any) -> dict[str, Any]:
    spec.setdefault("steps", [{"id": "work", "instruction": "do the work"}])
    return {"goal": "finish the work", "provider": {"kind": "scripted", "replies": replies}, **spec}


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}


WRITE = ("file_write", {"path": "a.txt", "content": "hello"})
READ = ("file_read", {"path": "a.txt"})
OTHER_WRITE = ("file_write", {"path": "b.txt", "content": "world"})
CHECK_FAILS = ("file_write", {"path": "check.py", "content": "print('E: no config')\nexit(1)\n"})
RUN_CHECK = ("run_command", {"command": "python3 check.py"})
FIX = ("file_write", {"path": "calc.py", "content": FIXED})


SUB_AGENTS = (
    parse_agent({"name": "alpha", "tools": ["file_write", "file_read"], "provider": {
        "kind": "scripted", "replies": [_calls(WRITE), "alpha wrote a.txt"]}}),
    parse_agent({"name": "beta", "provider": {"kind": "scripted", "replies": ["beta agrees"]}}),
)  # fmt: skip
"""Two registered agents that parent tasks delegate to (both drivers know them)."""


def _delegate(agent: str) -> tuple[str, dict[str, Any]]:
    steps = [{"id": "only", "instruction": f"answer as {agent}"}]
    return ("delegate", {"agent": agent, "goal": f"help as {agent}", "steps": steps})


def _delegated_twice(outcome: Outcome) -> None:
    assert outcome.status == "completed", outcome.result
    texts = _tool_texts(outcome)
    assert "sub-agent 'alpha' (task" in texts[0] and "answer: alpha wrote a.txt" in texts[0]
    assert "answer: beta agrees" in texts[1]
    assert [c.status for c in outcome.record.children] == ["completed", "completed"]
    assert outcome.events.count("delegated") == 2 and outcome.events.count("child_finished") == 2
    assert outcome.record.iteration == 2 + 2 + 1  # its own two, alpha's two, beta's one


def _delegation_rejected(outcome: Outcome) -> None:
    assert outcome.status == "completed", outcome.result
    assert "'nobody' is not a registered agent" in _tool_texts(outcome)[0]
    assert outcome.record.children[0].status == "rejected"


def _tool_texts(outcome: Outcome) -> list[str]:
    return [m.content for m in outcome.record.conversation.messages if m.role.value == "tool"]


# -- the scenarios' checks ------------------------------------------------------------------


def _answered(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert outcome.result["output"] == "forty-two"
    assert outcome.messages().count("forty-two") == 1
    assert [e.event.type for e in outcome.journal][-1] == "Terminated"


def _wrote_then_read(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert _tool_texts(outcome)[-1] == "hello"
    assert [e.tool_count for e in outcome.events_of("ToolsDispatched")] == [1, 1, 0]
    # The journal says what each call answered, in the order of the calls.
    results = [e.results for e in outcome.events_of("ObservationsCollected")]
    assert [[(r.tool, r.is_error) for r in batch] for batch in results] == [
        [("file_write", False)],
        [("file_read", False)],
        [],
    ]
    assert results[1][0].content == "hello" and results[1][0].full_chars is None


def _two_calls(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert _tool_texts(outcome)[:2] == [
        "wrote 5 bytes to a.txt (created)", "wrote 5 bytes to b.txt (created)"
    ]  # fmt: skip
    assert [e.tool_count for e in outcome.events_of("ToolsDispatched")] == [2, 1, 0]


def _fixed_the_bug(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert outcome.record.milestones == ["step:fix"]
    assert _tool_texts(outcome)[0] == BUGGY
    assert "exit code: 0" in _tool_texts(outcome)[-1]
    said = next(m for m in outcome.record.conversation.messages if m.content == "Let me look.")
    assert said.role.value == "assistant" and said.tool_calls  # text with tool calls is kept


def _schema_refused(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert _tool_texts(outcome)[0].startswith("[Schema validation failed] tool 'file_read'")


def _failed_attempts(outcome: Outcome, reason: str) -> None:
    assert outcome.status == "failed"
    assert outcome.result["steps"][0]["status"] == "skipped"
    failures = [m for m in outcome.messages() if m.startswith("[Coordinator] Attempt 1")]
    assert len(failures) == 1 and reason in failures[0], failures


def _planned(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert [step["id"] for step in outcome.result["steps"]] == ["write", "read"]
    assert outcome.events[:3] == ["accepted", "planned", "step_started"]
    assert outcome.record.milestones == ["step:write"]


def _two_steps(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert outcome.record.milestones == ["step:write", "step:read"]
    started = [e for e in outcome.journal if e.event.type == "Started"]
    assert [e.step_id for e in started] == ["write", "read"]


def _one_call_at_a_time(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert [e.tool_count for e in outcome.events_of("ToolsDispatched")] == [3, 0]
    assert _tool_texts(outcome) == [f"wrote 1 bytes to {n}.txt (created)" for n in "abc"]


def _verified(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert outcome.record.milestones == ["step:work"]
    assert outcome.result["steps"][0]["verified"] is True


def _verified_on_second_try(outcome: Outcome) -> None:
    _verified(outcome)
    assert any(m.startswith("[Verification failed] `test -f a.txt`") for m in outcome.messages())
    assert outcome.result["steps"][0]["attempts"] == 1


def _denied(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert _tool_texts(outcome)[0].startswith("[Policy denied]")
    assert [e.denied_count for e in outcome.events_of("PolicyEvaluated")] == [1, 0]


def _out_of_iterations(outcome: Outcome) -> None:
    assert outcome.status == "failed"
    assert outcome.result["steps"][0]["status"] == "skipped"
    limit = "step 'work' used its 2 iterations without finishing"
    assert any(m.startswith("[Coordinator] Attempt 1") and limit in m for m in outcome.messages())
    assert len(outcome.events_of("StepLimitReached")) == 1


def _levels(outcome: Outcome) -> list[StagnationLevel]:
    return [e.level for e in outcome.events_of("StagnationDetected")
            if isinstance(e, StagnationDetected)]  # fmt: skip


def _escalated(outcome: Outcome) -> None:
    assert outcome.status == "awaiting_review"
    assert _levels(outcome) == [
        StagnationLevel.NUDGE, StagnationLevel.REPLAN, StagnationLevel.ASK_HUMAN
    ]  # fmt: skip
    assert outcome.record.review is not None
    assert outcome.record.review.source == "detector"


def _escalated_by_reissued_plans(outcome: Outcome) -> None:
    _escalated(outcome)
    reasons = [e.reason_codes for e in outcome.events_of("StagnationDetected")
               if isinstance(e, StagnationDetected)]  # fmt: skip
    assert reasons == [[ReasonCode.REISSUED_PLAN]] * 3


def _retried_with_hint(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    messages = outcome.messages()
    after_hint = messages[messages.index(f"[Human reviewer] {HINT}") + 1 :]
    assert after_hint == ["the configuration is fixed"]
    assert outcome.result["output"] == "the configuration is fixed"
    assert StagnationLevel.ASK_HUMAN in _levels(outcome)


def _skipped(outcome: Outcome) -> None:
    assert outcome.status == "failed"
    assert outcome.result["steps"][0]["status"] == "skipped"
    assert (outcome.result["steps"][0]["note"] or "").startswith(
        f"skipped by review {outcome.review_ids[0]}"
    )


def _aborted(outcome: Outcome) -> None:
    assert outcome.status == "aborted"
    assert (outcome.result["error"] or "").startswith(f"aborted by review {outcome.review_ids[0]}")


def _milestone_kept(outcome: Outcome) -> None:
    assert outcome.status == "aborted"
    assert outcome.record.milestones == ["step:fix"]
    assert outcome.result["steps"][0]["verified"] is True
    assert outcome.result["steps"][1]["status"] == "failed"
    assert _levels(outcome)[-1] is StagnationLevel.ASK_HUMAN


def _resolution_denied(outcome: Outcome) -> None:
    context = next(m for m in outcome.messages() if "[PRE_HYDRATED_CONTEXT]" in m)
    assert SPEC in context
    assert "(1 reference could not be resolved)" in context
    event = outcome.events_of("PreHydrationComplete")[0]
    assert (event.references_resolved, event.references_failed) == (1, 1)


def _compacted(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    assert outcome.result["steps"][0]["iterations"] == 16
    assert outcome.events.count("context_over_budget") == 0
    assert "[Previous file_read result omitted for context management]" in outcome.messages()


def _recalled_by_directory(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    [answer] = _tool_texts(outcome)
    assert answer.index("return early after checks") < answer.index("type-hint every public")


def _stored_and_recalled(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    stored, recalled = _tool_texts(outcome)
    assert "a bug in add" in recalled, (stored, recalled)


def _modified_resolution(outcome: Outcome) -> None:
    context = next(m for m in outcome.messages() if "[PRE_HYDRATED_CONTEXT]" in m)
    assert REDACTED in context
    assert SPEC not in context
    assert outcome.status == "completed"
    [change] = outcome.events_of("GateModified")  # the tool worker's Modify, journaled too
    assert change.iteration == 0 and change.call_id is not None
    assert isinstance(change.before, ToolCallAction) and isinstance(change.after, ToolCallAction)
    assert json.loads(change.before.arguments) == {"path": "./spec.md"}
    assert json.loads(change.after.arguments) == {"path": "redacted.md"}
    kinds = [e.event.type for e in outcome.journal]
    assert kinds.index("GateModified") < kinds.index("PreHydrationComplete")


def _resolution_timed_out(outcome: Outcome) -> None:
    context = next(m for m in outcome.messages() if "[PRE_HYDRATED_CONTEXT]" in m)
    assert SPEC in context
    assert "(1 reference could not be resolved)" in context
    event = outcome.events_of("PreHydrationComplete")[0]
    assert (event.references_resolved, event.references_failed) == (1, 1)
    [failure] = event.failures  # which reference failed, and why
    assert (failure.ref_type, failure.reference) == ("slow", "sleep 30")
    assert "timed out" in failure.error
    assert outcome.elapsed_s < 10, f"a 1 s timeout on a 30 s resolution took {outcome.elapsed_s}"


def _modified_in_the_loop(outcome: Outcome) -> None:
    assert outcome.status == "completed"
    [change] = outcome.events_of("GateModified")
    assert change.iteration == 1 and change.call_id == "call_1"
    assert isinstance(change.before, ToolCallAction) and isinstance(change.after, ToolCallAction)
    assert json.loads(change.before.arguments) == {"path": "./spec.md"}
    assert json.loads(change.after.arguments) == {"path": "redacted.md"}
    [[result]] = [e.results for e in outcome.events_of("ObservationsCollected")][:1]
    assert result.content == REDACTED and result.tool == "file_read"


def _tool_took_its_time(outcome: Outcome) -> None:
    durations = [e.duration for e in outcome.events_of("ToolsDispatched")]
    assert durations[0] >= timedelta(seconds=0.2)


# -- the scenarios --------------------------------------------------------------------------


def _opa_task(given: Given) -> dict[str, Any]:
    policy = {"kind": "opa", "opa_url": given.opa_url, "opa_path": "parity/decision"}
    return _task(
        ["I read the spec"],
        goal="Do what ./spec.md says",
        workspace_template=given.template,
        policy=policy,
        pre_hydration={"resolution_tools": {"file": "file_read"}},
    )


def _opa_loop_task(given: Given) -> dict[str, Any]:
    policy = {"kind": "opa", "opa_url": given.opa_url, "opa_path": "parity/decision"}
    return _task(
        [_calls(("file_read", {"path": "./spec.md"})), "read"],
        workspace_template=given.template,
        policy=policy,
    )


def _slow_resolution_task(given: Given) -> dict[str, Any]:
    hydration = {
        "custom_patterns": [{"ref_type": "slow", "pattern": "sleep [0-9]+"}],
        "resolution_tools": {"file": "file_read", "slow": "run_command"},
        "timeout": "1s",
    }
    return _task(
        ["done waiting"],
        goal="Read ./spec.md, then sleep 30",
        workspace_template=given.template,
        pre_hydration=hydration,
    )


def _bugfix_task(given: Given) -> dict[str, Any]:
    replies = [
        {"text": "Let me look.", **_calls(("file_read", {"path": "calc.py"}))},
        _calls(FIX),
        _calls(("run_command", {"command": ADDS})),
        "add now adds; the check passes.",
    ]
    steps = [{"id": "fix", "instruction": "make add add", "done_when": ADDS}]
    return _task(replies, steps=steps, workspace_template=given.template)


def _milestone_then_stuck(given: Given) -> dict[str, Any]:
    steps = [
        {"id": "fix", "instruction": "make add add", "done_when": ADDS},
        {"id": "polish", "instruction": "make the configuration load"},
    ]
    replies = [_calls(FIX), "fixed", *STUCK]
    return _task(replies, steps=steps, workspace_template=given.template)


def _prehydration_denied_task(given: Given) -> dict[str, Any]:
    hydration = {"resolution_tools": {"file": "file_read", "url": "web_fetch"}}
    return _task(
        ["read it"],
        goal="Use ./spec.md and https://example.com/ref.html",
        workspace_template=given.template,
        policy={"kind": "tool_filter", "allowed_tools": ["file_read"]},
        pre_hydration=hydration,
    )


def _compaction_task(given: Given) -> dict[str, Any]:
    reads = [_calls(("file_read", {"path": "notes.txt"})) for _ in range(15)]
    return _task(
        [*reads, "done"],
        workspace_template=given.template,
        context={"strategy": "observation_masking", "keep_recent": 4},
        limits={"context_token_budget": 600, "max_iterations": 20},
        stagnation={"enabled": False},
    )


PLAN = {
    "steps": [
        {"id": "write", "instruction": "write a.txt", "done_when": "test -f a.txt"},
        {"id": "read", "instruction": "read a.txt"},
    ]
}


def _two_steps_task(_given: Given) -> dict[str, Any]:
    steps = [
        {"id": "write", "instruction": "write a.txt", "done_when": "test -f a.txt"},
        {"id": "read", "instruction": "read a.txt", "done_when": "grep -q hello a.txt"},
    ]
    return _task([_calls(WRITE), "written", _calls(READ), "read"], steps=steps)


def _bounded_task(_given: Given) -> dict[str, Any]:
    writes = [("file_write", {"path": f"{n}.txt", "content": n}) for n in "abc"]
    return _task([_calls(*writes), "three files"], limits={"max_concurrent_tools": 1})


CONVENTIONS = {
    "conventions": [
        {"language": "python", "directory": "src/api", "content": "return early after checks"},
        {"language": "python", "content": "type-hint every public function"},
    ],
    "facts": [{"subject": "calc.py", "predicate": "is owned by", "object": "the API team"}],
}


def _recall_task(given: Given) -> dict[str, Any]:
    recall = {"query": "python", "directory": "src/api/handlers", "scope": "conventions"}
    return _task(
        [_calls(("recall_knowledge", recall)), "noted"],
        goal="Refactor calc.py to the python house style of src/api",
        agent_id=given.agent_id,
        knowledge=CONVENTIONS | {"auto_persist": False},
    )


def _store_task(given: Given) -> dict[str, Any]:
    fact = {"subject": "calc", "predicate": "has", "object": "a bug in add"}
    recall = {"query": "calc bug"}
    # Usage stated: the token estimate of a conversation would count the stored item's id.
    usage = {"usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}
    replies = [_calls(("store_knowledge", fact)), _calls(("recall_knowledge", recall))]
    return _task(
        [*(r | usage for r in replies), {"text": "stored"} | usage],
        agent_id=given.agent_id,
        knowledge={"auto_persist": True},
    )


STUCK = [_calls(CHECK_FAILS), *(_calls(RUN_CHECK) for _ in range(7))]
"""A model that runs the same failing check again and again: nudged at its 4th run, asked to
re-plan at its 5th, escalated at its 7th (the last reply here)."""

NOISY_FORM = (
    "import pathlib\n"
    "seen = pathlib.Path('renders.txt')\n"
    "n = len(seen.read_text()) if seen.exists() else 0\n"
    "seen.write_text('x' * (n + 1))\n"
    "print('Calculate Shipping Rates: Rio de Janeiro to New York, envelope, one week')\n"
    "print('Review the shipment details, then press CONTINUE to see the rates.')\n"
    "print('OCR:', 'abcdefghijklmnopqrstuvwxyz'[n % 26] * 8)\n"
)
REISSUING = [
    _calls(("file_write", {"path": "form.py", "content": NOISY_FORM})),
    *(
        {
            "text": "Please press CONTINUE on the rate form to get the price of the envelope.",
            "tool_calls": [{"name": "run_command", "arguments": {"command": "python3 form.py"}}],
        }
        for _ in range(9)
    ),
]
"""A model that re-issues the same plan while the page it runs differs by noise only (one OCR
word, the same on both drivers): every result is new text, so only the model's side climbs
(NUDGE, REPLAN, ASK_HUMAN)."""

PUSH = ("run_command", {"command": "git push --dry-run origin main"})  # never pushes
EDITED_PUSH = {"command": "echo pushed to review > pushed.txt"}
REJECTION = "do not push; open a pull request instead"
DENIED_EDIT = {"command": "rm -rf /"}


def _approval_task(_given: Given, **spec: Any) -> dict[str, Any]:
    """A push (held for a reviewer) and a write in one turn, then the answer."""
    return _task(
        [_calls(PUSH, WRITE), "pushed"],
        policy={"require_approval": ["run_command:git push*"]},
        **spec,
    )


def _held_then(decision: str) -> Callable[[Outcome], None]:
    def check(outcome: Outcome) -> None:
        assert outcome.status == "completed", outcome.result
        workspace = Path(outcome.record.workspace or "")
        assert (workspace / "a.txt").read_text() == "hello"  # the turn's other call ran
        (held,) = outcome.events_of("CallHeld")
        assert held.tool == "run_command" and "require-approval" in held.reason
        (decided,) = outcome.events_of("CallDecided")
        assert decided.decision == decision and decided.decided_by == "parity"
        results = {m.tool_call_id: m.content for m in outcome.record.conversation.messages}
        if decision == "edit" and json.loads(decided.arguments_after) == DENIED_EDIT:
            assert results[held.call_id].startswith("[Error] [Policy denied] rule 'rm-root'")
        elif decision == "edit":
            assert json.loads(decided.arguments_after) == EDITED_PUSH
            assert (workspace / "pushed.txt").read_text() == "pushed to review\n"
        elif decision == "approve":
            assert decided.arguments_after is None
            assert not results[held.call_id].startswith("[Error]")
        else:
            assert not (workspace / "pushed.txt").exists()
            assert REJECTION in results[held.call_id]
        assert outcome.events.count("escalated") == 1
        assert outcome.events.count("review_decided") == 1

    return check


SCENARIOS = [
    Scenario("plain-answer", lambda _g: _task(["forty-two"]), _answered),
    Scenario("bugfix", _bugfix_task, _fixed_the_bug),
    Scenario(
        "write-then-read", lambda _g: _task([_calls(WRITE), _calls(READ), "done"]), _wrote_then_read
    ),
    Scenario(
        "two-calls-in-one-iteration",
        lambda _g: _task([_calls(WRITE, OTHER_WRITE), _calls(READ), "done"]),
        _two_calls,
    ),
    Scenario(
        "two-calls-acted-inline",
        lambda _g: _task(
            [_calls(WRITE, OTHER_WRITE), _calls(READ), "done"], tool_dispatch="inline"
        ),
        _two_calls,
    ),
    Scenario("one-call-at-a-time", _bounded_task, _one_call_at_a_time),
    Scenario(
        "planned-task",
        lambda _g: {
            "goal": "write a.txt, then read it",
            "provider": {
                "kind": "scripted",
                "replies": [json.dumps(PLAN), _calls(WRITE), "written", _calls(READ), "read"],
            },
        },
        _planned,
    ),
    Scenario("two-steps", _two_steps_task, _two_steps),
    Scenario(
        "verified-milestone",
        lambda _g: _task(
            [_calls(WRITE), "written"],
            steps=[{"id": "work", "instruction": "write a.txt", "done_when": "test -f a.txt"}],
        ),
        _verified,
    ),
    Scenario(
        "verification-fails-then-passes",
        lambda _g: _task(
            ["already done", _calls(WRITE), "written now"],
            steps=[{"id": "work", "instruction": "write a.txt", "done_when": "test -f a.txt"}],
        ),
        _verified_on_second_try,
    ),
    Scenario(
        "policy-denial-fed-back",
        lambda _g: _task([_calls(("run_command", {"command": "rm -rf /"})), "I will not"]),
        _denied,
    ),
    Scenario(
        "max-iterations",
        lambda _g: _task(
            [_calls(("file_list", {})), _calls(WRITE), _calls(READ)] * 3,
            limits={"max_iterations": 2},
        ),
        _out_of_iterations,
    ),
    Scenario(
        "schema-failure-fed-back",
        lambda _g: _task([_calls(("file_read", {"nope": 1})), "I will read better"]),
        _schema_refused,
    ),
    Scenario(
        "empty-turn-fails-the-attempt",
        lambda _g: _task(["  "] * 3),
        partial(_failed_attempts, reason="no-progress turn"),
    ),
    Scenario(
        "refusal-fails-the-attempt",
        lambda _g: _task([{"text": "", "finish_reason": "refusal"}] * 3),
        partial(_failed_attempts, reason="refused"),
    ),
    Scenario(
        "token-limit",
        lambda _g: _task([_calls(("file_list", {}))] * 9, limits={"max_total_tokens": 300}),
        partial(_failed_attempts, reason="of max_total_tokens (300)"),
    ),
    Scenario(
        "step-timeout",
        lambda _g: _task(
            [_calls(("run_command", {"command": "sleep 1.1"}))] * 3,
            limits={"step_timeout": "1s"},
            stagnation={"enabled": False},
        ),
        partial(_failed_attempts, reason="exceeded its timeout of 1s"),
    ),
    Scenario("compaction-under-a-small-budget", _compaction_task, _compacted),
    Scenario("stagnation-escalates", lambda _g: _task(STUCK), _escalated),
    Scenario(
        "stagnation-from-reissued-plans",
        lambda _g: _task(REISSUING),
        _escalated_by_reissued_plans,
    ),
    Scenario(
        "stagnation-retried-with-hint",
        lambda _g: _task([*STUCK, "the configuration is fixed"]),
        _retried_with_hint,
        (Decision("retry", HINT),),
    ),
    Scenario("stagnation-aborted", lambda _g: _task(STUCK), _aborted, (Decision("abort"),)),
    Scenario("stagnation-skipped", lambda _g: _task(STUCK), _skipped, (Decision("skip"),)),
    Scenario(
        "stagnation-keeps-the-milestone",
        _milestone_then_stuck,
        _milestone_kept,
        (Decision("abort"),),
    ),
    Scenario("knowledge-recalled-by-directory", _recall_task, _recalled_by_directory),
    Scenario("knowledge-stored-then-recalled", _store_task, _stored_and_recalled),
    Scenario("prehydration-gate-denies", _prehydration_denied_task, _resolution_denied),
    Scenario("prehydration-gate-modifies", _opa_task, _modified_resolution),
    Scenario("prehydration-timeout", _slow_resolution_task, _resolution_timed_out),
    Scenario("gate-modifies-a-call-journaled", _opa_loop_task, _modified_in_the_loop),
    Scenario(
        "two-subagents-in-one-turn",
        lambda _g: _task([_calls(_delegate("alpha"), _delegate("beta")), "combined"]),
        _delegated_twice,
        agents=SUB_AGENTS,
    ),
    Scenario(
        "delegation-to-an-unknown-agent",
        lambda _g: _task([_calls(_delegate("nobody")), "went on alone"]),
        _delegation_rejected,
        agents=SUB_AGENTS,
    ),
    Scenario(
        "approval-edited",
        _approval_task,
        _held_then("edit"),
        (Decision("edit", arguments=EDITED_PUSH),),
    ),
    Scenario(
        "approval-edit-still-passes-the-deny-rules",
        _approval_task,
        _held_then("edit"),
        (Decision("edit", arguments=DENIED_EDIT),),
    ),
    Scenario(
        "approval-approved-beside-an-inline-call",
        partial(_approval_task, tool_dispatch="inline"),
        _held_then("approve"),
        (Decision("approve"),),
    ),
    Scenario(
        "approval-rejected",
        _approval_task,
        _held_then("reject"),
        (Decision("reject", REJECTION),),
    ),
    Scenario(
        "tool-duration-journaled",
        lambda _g: _task([_calls(("run_command", {"command": "sleep 0.2"})), "slept"]),
        _tool_took_its_time,
    ),
]


def _redact(document: Any) -> Any:
    """The OPA decision: a file_read of ./spec.md reads redacted.md instead; all else allowed."""
    arguments = document.get("arguments") or {}
    if document.get("tool_name") == "file_read" and arguments.get("path") == "./spec.md":
        return {"allow": True, "modified_arguments": {"path": "redacted.md"}}
    return {"allow": True}


@pytest.fixture
def given(opa: FakeOpaServer, tmp_path: Path) -> Given:
    """A template workspace with the spec and its redacted copy; OPA redacting the spec."""
    template = tmp_path / "template"
    template.mkdir()
    (template / "spec.md").write_text(SPEC)
    (template / "redacted.md").write_text(REDACTED)
    (template / "calc.py").write_text(BUGGY)
    (template / "notes.txt").write_text("a note about calc.py\n" * 20)
    opa.set_decision("parity/decision", _redact)
    return Given(opa_url=opa.url, template=str(template), agent_id=f"parity-{uuid.uuid4().hex}")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_the_loop_runs_alike_on_both_drivers(
    driver: LoopDriver, reference: LoopDriver, given: Given, scenario: Scenario
) -> None:
    """A scenario ends as it should, with the in-process run's journal, result and conversation."""
    outcome = driver.run(scenario.task(given), scenario.decisions, scenario.agents)
    scenario.check(outcome)
    for entry in outcome.journal:
        assert JournalEntry.model_validate_json(entry.model_dump_json()) == entry
    expected = reference.run(scenario.task(given), scenario.decisions, scenario.agents)
    assert comparable(outcome) == comparable(expected)
