"""Sub-agents: a ``delegate`` call becomes a child task whose end is the call's result; limits
refuse runaway delegation; a parent's end cancels its children (the pure machine, then the
in-process driver running parents and children for real)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.machine import Effects, MachineSettings, TaskMachine
from coordinator.machine.delegation import child_result
from coordinator.state import AwaitKind, TaskRecord, TaskStatus
from orga.inprocess import InProcessDriver
from shared.actions import ToolCallAction
from shared.agent_profile import AgentProfile, parse_agent
from shared.conversation import ConversationMessage
from shared.delegation import ParentLink, parent_link
from shared.inference import ToolCall, Usage
from shared.protocol import ChildFinishedMessage, ReasonedMessage
from shared.task_spec import parse_task
from workers.runtime import local_core

SETTINGS = MachineSettings(
    observation_deadline_s=10.0, workspace_root="/ws", max_delegation_depth=3,
    max_children_per_task=3,
)  # fmt: skip


def _record(task_id: str = "p", **spec: Any) -> TaskRecord:
    data: dict[str, Any] = {
        "goal": "ship the release",
        "steps": [{"id": "combine", "instruction": "delegate, then combine"}],
        "limits": {"max_iterations": 10, "max_total_tokens": 5000},
    }
    data.update(spec)
    return TaskRecord(task_id=task_id, spec=parse_task(data), created_at=0.0, updated_at=0.0)


def _apply(record: TaskRecord, step: Any, now: float = 2.0) -> Effects:
    effects: Effects = step(TaskMachine(record, now, SETTINGS))
    return effects


def _delegate(call_id: str, agent: str = "alpha", **extra: Any) -> ToolCallAction:
    arguments = {"agent": agent, "goal": f"sub-task {call_id}", **extra}
    return ToolCallAction(call_id=call_id, name="delegate", arguments=json.dumps(arguments))


def _turn(record: TaskRecord, *calls: ToolCallAction) -> Effects:
    assert record.awaiting is not None
    message = ReasonedMessage(
        fence=record.awaiting.fence,
        usage=Usage(total_tokens=100),
        new_messages=[
            ConversationMessage.assistant_tool_calls(
                [ToolCall(id=c.call_id, name=c.name, arguments=c.arguments) for c in calls]
            )
        ],
        actions=list(calls),
        approved_calls=list(calls),
    )
    return _apply(record, lambda m: m.on_reasoned(message))


def _started(**spec: Any) -> TaskRecord:
    record = _record(**spec)
    _apply(record, lambda m: m.start(), now=1.0)
    return record


def _child_record(effects: Effects, index: int, status: TaskStatus) -> TaskRecord:
    submission = effects.children[index]
    return TaskRecord(
        task_id=submission.task_id,
        spec=parse_task(json.loads(submission.task)),
        created_at=0.0,
        updated_at=0.0,
        status=status,
        output=f"answer of {submission.task_id}",
        milestones=["step:x"],
        usage=Usage(total_tokens=40),
    )


def test_two_delegations_in_one_turn_submit_two_children_through_the_intake() -> None:
    """Each call becomes a child task ``{parent}.{n}`` with a key from parent, step, iteration
    and call, the parent's link, and budgets out of what the step has left."""
    record = _started()
    effects = _turn(record, _delegate("c1"), _delegate("c2", "beta", budget={"iterations": 50}))
    assert [c.task_id for c in effects.children] == ["p.1", "p.2"]
    assert not effects.tool_dispatches  # no worker runs a delegation
    first = json.loads(effects.children[0].task)
    assert first["agent"] == "alpha"
    assert first["idempotency_key"] == "delegate:p:combine:1:c1"
    link = ParentLink.model_validate(first["delegation"])
    assert (link.task_id, link.step_id, link.call_id, link.depth) == ("p", "combine", "c1", 1)
    assert link.goal == "ship the release"
    assert link.max_iterations == 4  # half of 10 minus the iteration that delegated
    assert link.max_total_tokens == 2450
    spec = parse_task(first)
    assert spec.loop_config().max_iterations == 4
    second = ParentLink.model_validate(json.loads(effects.children[1].task)["delegation"])
    assert (second.max_iterations, second.max_total_tokens) == (5, 2450)  # the rest, not 50
    assert [c.task_id for c in record.children] == ["p.1", "p.2"]
    assert record.awaiting is not None and record.awaiting.kind is AwaitKind.TOOLS
    assert record.awaiting.liveness_ids() == []  # children have no heartbeat to judge


def test_the_children_ends_are_the_call_results_applied_once() -> None:
    """The parent observes once both children ended; a second copy of an end is ignored; the
    children's usage and iterations count against the parent's step."""
    record = _started()
    effects = _turn(record, _delegate("c1"), _delegate("c2"))
    done = child_result("p.1", _child_record(effects, 0, TaskStatus.COMPLETED),
                        TaskStatus.COMPLETED, None)  # fmt: skip
    done = done.model_copy(update={"iterations": 3})
    assert _apply(record, lambda m: m.on_answer(done)).changed
    assert not _apply(record, lambda m: m.on_answer(done)).changed  # applied once
    assert record.awaiting is not None  # still waiting on p.2
    failed = child_result("p.2", _child_record(effects, 1, TaskStatus.ABORTED),
                          TaskStatus.ABORTED, "cancelled: no")  # fmt: skip
    after = _apply(record, lambda m: m.on_answer(failed))
    assert len(after.reason_dispatches) == 1  # the next iteration, with both results
    tools = [m for m in record.conversation.messages if m.role.value == "tool"]
    assert "sub-agent 'alpha' (task p.1) completed" in tools[0].content
    assert "answer: answer of p.1" in tools[0].content and "milestones: step:x" in tools[0].content
    assert tools[1].content.startswith("[Error] sub-agent 'alpha' (task p.2) aborted")
    assert record.iteration == 1 + 3  # its own iteration and the child's three
    assert record.usage.total_tokens == 100 + 40 + 40
    assert [c.status for c in record.children] == ["completed", "aborted"]


def _budgets(effects: Effects) -> list[tuple[int | None, int | None]]:
    links = [ParentLink.model_validate(json.loads(c.task)["delegation"]) for c in effects.children]
    return [(link.max_iterations, link.max_total_tokens) for link in links]


def test_siblings_of_one_turn_share_what_the_step_has_left() -> None:
    """Three children delegated in one turn with 7 iterations left reserve 7 between them (an
    even share each), not 7 each; their reservations are kept in the parent's record."""
    record = _started(limits={"max_iterations": 8, "max_total_tokens": 3100})
    effects = _turn(record, _delegate("c1"), _delegate("c2"), _delegate("c3"))
    assert _budgets(effects) == [(2, 1000), (2, 1000), (3, 1000)]
    reserved = [(c.reserved_iterations, c.reserved_tokens) for c in record.children]
    assert reserved == [(2, 1000), (2, 1000), (3, 1000)]
    assert all(parse_task(json.loads(c.task)).loop_config().max_iterations <= 3
               for c in effects.children)  # fmt: skip


def test_a_sibling_finding_the_budget_reserved_is_refused_naming_the_reservations() -> None:
    """Children that each ask for the whole rest: the first gets it, the others a tool error
    saying the running sub-agents reserved it, and what to do."""
    record = _started(limits={"max_iterations": 8, "max_total_tokens": 5000})
    asked = {"budget": {"iterations": 7}}
    effects = _turn(record, _delegate("c1", **asked), _delegate("c2", **asked),
                    _delegate("c3", **asked))  # fmt: skip
    assert [c.task_id for c in effects.children] == ["p.1"]
    assert _budgets(effects) == [(7, 1633)]  # tokens not asked for: a third of 4900
    assert record.awaiting is not None
    refused = [record.awaiting.results[c].content for c in ("c2", "c3")]
    for content in refused:
        assert (
            "this step has 0 iterations and 3267 tokens left of its limits (after the 7 "
            "iterations and 1633 tokens reserved by its sub-agents still running)" in content
        )
        assert "delegate in a later turn" in content


def test_a_finished_childs_unused_reservation_returns_to_the_step() -> None:
    """A child that used less than it reserved leaves the rest to the step: the next turn's
    child gets what is left after the first child's actual usage, not its reservation."""
    record = _started(limits={"max_iterations": 10, "max_total_tokens": 5000})
    effects = _turn(record, _delegate("c1", budget={"iterations": 6}))
    assert _budgets(effects) == [(6, 4900)]
    done = child_result("p.1", _child_record(effects, 0, TaskStatus.COMPLETED),
                        TaskStatus.COMPLETED, None)  # fmt: skip
    _apply(record, lambda m: m.on_answer(done.model_copy(update={"iterations": 2})))
    assert record.iteration == 3 and record.children[0].finished  # 1 + the child's 2
    second = _turn(record, _delegate("c2"))
    assert _budgets(second) == [(6, 4760)]  # 10 - 4 iterations, 5000 - 100 - 40 - 100 tokens


def test_a_record_stored_before_reservations_loads() -> None:
    """A parent record whose children were stored without reservations loads (reserving 0)."""
    record = _started()
    _turn(record, _delegate("c1"))
    data = json.loads(record.model_dump_json())
    for child in data["children"]:
        del child["reserved_iterations"], child["reserved_tokens"]
    loaded = TaskRecord.model_validate(data)
    assert [(c.task_id, c.reserved_iterations) for c in loaded.children] == [("p.1", 0)]


def test_a_late_look_at_a_parent_waiting_on_children_resends_nothing() -> None:
    """Past its deadline, a parent waiting only on children is looked at later; no child is
    created again and nothing is dead-lettered."""
    record = _started()
    _turn(record, _delegate("c1"))
    for now in (100.0, 1000.0, 10_000.0):
        effects = _apply(record, lambda m: m.on_tick(None), now=now)
        assert not effects.children and not effects.dead_letters and not effects.tool_dispatches
    assert record.awaiting is not None and record.awaiting.deadline > 10_000.0
    assert len(record.children) == 1


def test_a_redispatch_of_the_other_calls_never_creates_the_child_again() -> None:
    """A tool call re-sent after its deadline goes out again; the delegation beside it does not."""
    record = _started()
    read = ToolCallAction(call_id="r1", name="file_read", arguments='{"path": "a"}')
    _turn(record, read, _delegate("c1"))
    effects = _apply(record, lambda m: m.on_tick(None), now=50.0)
    assert [t.action.call_id for t in effects.tool_dispatches] == ["r1"]
    assert not effects.children


@pytest.mark.parametrize(
    ("spec", "settings", "expected"),
    [
        ({"delegation": {"task_id": "g", "step_id": "s", "iteration": 1, "call_id": "c",
                         "depth": 3}},
         SETTINGS, "the sub-agent would run at depth 4, over the delegation depth limit of 3 "
                   "(ORGA_MAX_DELEGATION_DEPTH)"),
        ({}, MachineSettings(max_children_per_task=0),
         "this task has created 0 sub-agents, the limit per task (ORGA_MAX_CHILDREN_PER_TASK=0)"),
        ({"limits": {"max_iterations": 1}}, SETTINGS, "this step has 0 iterations and"),
    ],
)  # fmt: skip
def test_runaway_delegation_is_refused_with_a_tool_error_naming_the_limit(
    spec: dict[str, Any], settings: MachineSettings, expected: str
) -> None:
    """Depth, children per task and the step's budget refuse a delegation at once: the call's
    result is an error naming the limit, its value and the fix, and the loop goes on."""
    record = _record(**spec)
    TaskMachine(record, 1.0, settings).start()
    assert record.awaiting is not None
    message = ReasonedMessage(
        fence=record.awaiting.fence, approved_calls=[_delegate("c1")], actions=[_delegate("c1")]
    )
    effects = TaskMachine(record, 2.0, settings).on_reasoned(message)
    assert not effects.children
    refused = [m for m in record.conversation.messages if m.role.value == "tool"]
    assert expected in refused[0].content, refused[0].content
    assert refused[0].content.startswith("[Error] delegation refused")
    assert effects.reason_dispatches or record.terminal or record.status.value == "awaiting_review"


def test_invalid_delegate_arguments_are_a_tool_error() -> None:
    """Arguments the schema check would refuse are refused by the coordinator too."""
    record = _started()
    bad = ToolCallAction(call_id="c1", name="delegate", arguments='{"agent": "a b", "goal": ""}')
    effects = _turn(record, bad)
    assert not effects.children
    assert "invalid delegate arguments" in record.conversation.messages[-1].content


def test_cancelling_a_parent_cancels_its_running_children_only() -> None:
    """A parent that ends sends a cancel for each child still running, and keeps milestones."""
    record = _started()
    effects = _turn(record, _delegate("c1"), _delegate("c2"))
    done = child_result("p.1", _child_record(effects, 0, TaskStatus.COMPLETED),
                        TaskStatus.COMPLETED, None)  # fmt: skip
    _apply(record, lambda m: m.on_answer(done))
    cancelled = _apply(record, lambda m: m.cancel("operator"))
    assert [c["task_id"] for c in cancelled.cancels] == ["p.2"]
    assert "its parent task p ended (aborted)" in cancelled.cancels[0]["reason"]
    assert record.status is TaskStatus.ABORTED


def test_a_childs_end_is_reported_to_its_parent_in_its_own_commit() -> None:
    """A child that ends (here: cancelled) writes its result for the parent's call."""
    link = {"task_id": "p", "step_id": "combine", "iteration": 1, "call_id": "c1", "attempt": 4}
    record = _started(delegation=link, agent="alpha")
    effects = _apply(record, lambda m: m.cancel("its parent task p ended (aborted)"))
    [result] = effects.child_results
    assert isinstance(result, ChildFinishedMessage)
    assert (result.fence.task_id, result.fence.call_id, result.status) == ("p", "c1", "aborted")
    assert result.child_task_id == "p" and result.observation.is_error


def test_a_childs_escalation_shows_its_parents_goal_and_step() -> None:
    """The review context of a sub-agent names the parent task, its goal and its step."""
    link = {"task_id": "p", "step_id": "combine", "iteration": 1, "call_id": "c1",
            "goal": "ship the release", "step_instruction": "delegate, then combine"}  # fmt: skip
    record = _started(delegation=link)
    _apply(record, lambda m: m.reviews.escalate("detector", "stuck"))
    assert record.review is not None
    parent = record.review.snapshot["parent"]
    assert parent["task_id"] == "p" and parent["goal"] == "ship the release"
    assert parent["step"] == {"id": "combine", "instruction": "delegate, then combine"}


def test_a_subagent_works_in_a_subfolder_or_a_copy_of_its_parents_workspace() -> None:
    """The profile's ``delegated_workspace`` says where the child works."""
    link = {"task_id": "p", "step_id": "s", "iteration": 1, "call_id": "c", "workspace": "/ws/p",
            "copy_from": "/ws/p"}  # fmt: skip
    sub = _started(delegation=link)
    assert sub.workspace == "/ws/p/subagents/p"
    copy = _record(task_id="p.1", delegation=link, delegated_workspace="copy")
    machine = TaskMachine(copy, 1.0, SETTINGS)
    assert machine.workspace() == "/ws/p.1"
    assert machine.workspace_template() == "/ws/p"


def test_a_copy_starts_from_the_parents_template_until_a_tool_used_its_workspace() -> None:
    """A parent that delegates first has no workspace yet: its children copy its template."""
    record = _started(workspace_template="/templates/release")
    effects = _turn(record, _delegate("c1"))
    link = ParentLink.model_validate(json.loads(effects.children[0].task)["delegation"])
    assert (link.workspace, link.copy_from) == ("/ws/p", "/templates/release")


# -- the in-process driver: parents and children run for real ----------------------------------


def _agent(name: str, replies: list[Any], **fields: Any) -> AgentProfile:
    return parse_agent({"name": name, "provider": {"kind": "scripted", "replies": replies},
                        "limits": {"max_iterations": 5}, **fields})  # fmt: skip


def _parent(*replies: Any) -> dict[str, Any]:
    return {
        "goal": "combine two answers",
        "steps": [{"id": "s", "instruction": "delegate and combine"}],
        "provider": {"kind": "scripted", "replies": list(replies)},
    }


def _delegating(*agents: str, steps: bool = True) -> dict[str, Any]:
    calls = []
    for agent in agents:
        arguments: dict[str, Any] = {"agent": agent, "goal": f"answer as {agent}"}
        if steps:
            arguments["steps"] = [{"id": "only", "instruction": "answer"}]
        calls.append({"name": "delegate", "arguments": arguments})
    return {"tool_calls": calls}


def _driver(tmp_path: Path, *agents: AgentProfile, **settings: Any) -> InProcessDriver:
    return InProcessDriver(
        local_core(),
        MachineSettings(workspace_root=str(tmp_path), **settings),
        agents={a.name: a for a in agents},
    )


def test_two_subagents_run_in_parallel_and_their_answers_come_back(tmp_path: Path) -> None:
    """Two delegations of one turn run as two child tasks at once; the parent combines them."""
    slow = _agent("slow", [{"tool_calls": [{"name": "run_command",
                                            "arguments": {"command": "sleep 1; echo slow"}}]},
                           "slow is done"])  # fmt: skip
    quick = _agent("quick", [{"tool_calls": [{"name": "run_command",
                                              "arguments": {"command": "sleep 1; echo quick"}}]},
                             "quick is done"])  # fmt: skip
    driver = _driver(tmp_path, slow, quick)
    started = asyncio.run(_timed(driver.run(_parent(_delegating("slow", "quick"), "both"), "p")))
    run, seconds = started
    assert run.status is TaskStatus.COMPLETED, run.result()
    assert seconds < 1.9  # two 1 s children, not one after the other
    assert {k: c.status for k, c in run.children.items()} == {
        "p.1": TaskStatus.COMPLETED, "p.2": TaskStatus.COMPLETED
    }  # fmt: skip
    results = [m.content for m in run.record.conversation.messages if m.role.value == "tool"]
    assert "answer: slow is done" in results[0] and "answer: quick is done" in results[1]
    assert run.children["p.1"].record.workspace == f"{tmp_path}/p/subagents/p.1"


async def _timed(coro: Any) -> tuple[Any, float]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await coro
    return result, loop.time() - start


def test_an_unknown_agent_is_an_error_result_not_a_hang(tmp_path: Path) -> None:
    """A child the intake refuses answers the call with the refusal, naming the known agents."""
    driver = _driver(tmp_path, _agent("alpha", ["a"]))
    run = asyncio.run(driver.run(_parent(_delegating("nobody"), "gave up"), "p"))
    assert run.status is TaskStatus.COMPLETED
    result = next(m for m in run.record.conversation.messages if m.role.value == "tool")
    assert "the sub-agent was not created: sub-agent task p.1: agent:" in result.content
    assert "'nobody' is not a registered agent; known agents: 'alpha'" in result.content
    assert run.record.children[0].status == "rejected"


def test_a_failed_child_is_an_error_result_with_its_milestones(tmp_path: Path) -> None:
    """A child whose only step is skipped fails; the parent's call gets an error, not a hang."""
    failing = _agent("failing", ["no"])
    run = asyncio.run(_driver(tmp_path, failing).run(_parent(
        {"tool_calls": [{"name": "delegate", "arguments": {
            "agent": "failing", "goal": "g",
            "steps": [{"id": "only", "instruction": "x", "done_when": "false"}]}}]},
        "done anyway",
    ), "p"))  # fmt: skip
    child = run.children["p.1"]
    assert child.status in (TaskStatus.FAILED, TaskStatus.ABORTED), child.result()
    result = next(m for m in run.record.conversation.messages if m.role.value == "tool")
    assert result.content.startswith(f"[Error] sub-agent 'failing' (task p.1) {child.status.value}")


def test_grandchildren_nest_and_the_depth_limit_stops_them(tmp_path: Path) -> None:
    """A child may delegate in turn; past the depth limit the call is refused."""
    recursive = _agent("recursive", [_delegating("recursive"), "nested"])
    run = asyncio.run(_driver(tmp_path, recursive, max_delegation_depth=2).run(
        _parent(_delegating("recursive"), "top"), "p"))  # fmt: skip
    assert run.status is TaskStatus.COMPLETED
    grandchild = run.children["p.1"].children["p.1.1"]
    assert grandchild.record.spec.delegation is not None
    assert grandchild.record.spec.delegation.depth == 2
    refused = next(m for m in grandchild.record.conversation.messages if m.role.value == "tool")
    assert "over the delegation depth limit of 2" in refused.content
    assert not grandchild.children


def test_a_parent_that_ends_cancels_its_children_keeping_their_milestones(
    tmp_path: Path,
) -> None:
    """A parent cancelled while its child runs: the child is cancelled too (aborted), its
    verified milestone kept, and the parent's result names the child's end."""
    stepper = _agent("stepper", [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch a"}}]},
        "first done",
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 30"}}]},
    ], limits={"tool_timeout": "60s"})  # fmt: skip
    task = _parent({"tool_calls": [{"name": "delegate", "arguments": {
        "agent": "stepper", "goal": "two steps",
        "steps": [{"id": "one", "instruction": "a", "done_when": "test -f a"},
                  {"id": "two", "instruction": "b"}]}}]})  # fmt: skip
    driver = _driver(tmp_path, stepper)

    async def scenario() -> Any:
        parent = asyncio.create_task(driver.run(task, "p"))
        while not ((child := driver.live("p.1")) and child.record.milestones):
            await asyncio.sleep(0.05)
        assert driver.cancel("p", "operator")
        return await parent

    run = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert run.status is TaskStatus.ABORTED
    child = run.children["p.1"]
    assert child.status is TaskStatus.ABORTED
    assert child.record.milestones == ["step:one"]
    assert "its parent task p ended (aborted)" in (child.record.error or "")


def test_children_of_an_iteration_given_up_are_cancelled() -> None:
    """A sibling call dead-lettered fails the attempt: the children it waited on are cancelled."""
    record = _started()
    read = ToolCallAction(call_id="r1", name="file_read", arguments='{"path": "a"}')
    _turn(record, read, _delegate("c1"))
    effects = Effects()
    for now in (50.0, 100.0, 150.0, 200.0):  # re-sent until max_redeliveries, then dead
        effects = _apply(record, lambda m: m.on_tick(None), now=now)
        if effects.dead_letters:
            break
    assert effects.dead_letters
    assert [c["task_id"] for c in effects.cancels] == ["p.1"]
    assert "the iteration of task p that created it failed" in effects.cancels[0]["reason"]


@pytest.mark.parametrize(
    "text",
    ['{"goal": "g", "x": ' + "[" * 100_000, '{"delegation": ' + "[" * 100_000, "goal: g", "{"],
)
def test_reading_a_parent_link_never_fails_on_bad_input(text: str) -> None:
    """The intake looks for a parent link before validating: bad text has none, never raises."""
    assert parent_link(text) is None


def test_a_child_left_waiting_for_a_review_makes_its_parents_run_return(tmp_path: Path) -> None:
    """In process, with nobody to decide: the child waits for review, and the parent's run
    returns still waiting on it (as the parent run itself would for its own review)."""
    wanderer = Path(__file__).resolve().parents[2] / "examples" / "wanderer"
    profile = parse_agent({"name": "wanderer", "delegated_workspace": "copy",
                           "provider": {"kind": "scripted",
                                        "script": str(wanderer / "script.yaml")},
                           "limits": {"max_iterations": 60}})  # fmt: skip
    task = _parent({"tool_calls": [{"name": "delegate", "arguments": {
        "agent": "wanderer", "goal": "find the latency bug",
        "steps": [{"id": "investigate", "instruction": "write FINDINGS.md",
                   "done_when": "test -s FINDINGS.md"}]}}]})  # fmt: skip
    task["workspace_template"] = str(wanderer / "workspace")
    run = asyncio.run(asyncio.wait_for(_driver(tmp_path, profile).run(task, "p"), 60))
    assert run.status is TaskStatus.RUNNING
    child = run.children["p.1"]
    assert child.status is TaskStatus.AWAITING_REVIEW
    assert child.record.review is not None
    assert child.record.review.snapshot["parent"]["goal"] == "combine two answers"


# -- a sub-agent's workspace stays inside its parent's (the red-team break) ----------------------


def _escaping_parent(command: str) -> dict[str, Any]:
    return _parent(
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        _delegating("reader"),
        "parent done",
    )


def _reader() -> AgentProfile:
    return _agent("reader", [
        {"tool_calls": [{"name": "file_read", "arguments": {"path": "secret.txt"}},
                        {"name": "file_write", "arguments": {"path": "planted.txt",
                                                             "content": "from the child"}},
                        {"name": "run_command", "arguments": {"command": "touch ran-here"}}]},
        "read it",
    ])  # fmt: skip


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the outside secret")
    return outside


def _transcript(run: Any) -> str:
    texts = [m.content or "" for m in run.record.conversation.messages]
    for child in run.children.values():
        texts += [m.content or "" for m in child.record.conversation.messages]
    return "\n".join(texts)


def test_a_link_planted_as_the_childs_folder_refuses_the_delegation(tmp_path: Path) -> None:
    """The parent links ``subagents/<parent>.1`` to an outside folder, then delegates: the
    ``delegate`` call is refused naming the link, no child runs, nothing outside is read or
    written."""
    outside = _outside(tmp_path / "ws")
    command = (
        "python3 -c \"import os; os.makedirs('subagents', exist_ok=True); "
        f"os.symlink('{outside}', 'subagents/p.1')\""
    )
    driver = _driver(tmp_path / "ws", _reader())
    run = asyncio.run(driver.run(_escaping_parent(command), "p"))
    results = [m.content for m in run.record.conversation.messages if m.role.value == "tool"]
    assert (
        "delegation refused: subagents/p.1 in this task's workspace is a symbolic link"
        in (results[1])
    ), results
    assert run.children == {} and run.record.children == []
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert "the outside secret" not in _transcript(run)


def test_a_childs_folder_made_by_the_parent_fails_the_child_not_the_containment(
    tmp_path: Path,
) -> None:
    """The parent makes ``subagents/<parent>.1`` itself with a link to the secret in it: the
    child is stopped at its first tool call (the folder was not made by the runtime), and the
    parent's ``delegate`` call gets that error."""
    outside = _outside(tmp_path / "ws")
    command = f"mkdir -p subagents/p.1 && ln -s {outside}/secret.txt subagents/p.1/secret.txt"
    driver = _driver(tmp_path / "ws", _reader())
    run = asyncio.run(driver.run(_escaping_parent(command), "p"))
    child = run.children["p.1"]
    assert child.status is TaskStatus.FAILED
    assert "was not created by the runtime" in (child.record.error or "")
    results = [m.content for m in run.record.conversation.messages if m.role.value == "tool"]
    assert "was not created by the runtime" in results[1], results
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert not (tmp_path / "ws" / "p" / "subagents" / "p.1" / "ran-here").exists()
    assert "the outside secret" not in _transcript(run)


def test_a_link_planted_where_a_copy_childs_folder_goes_fails_the_child(tmp_path: Path) -> None:
    """A ``copy`` child works in ``{root}/{child id}``, a name the parent can guess: a link
    planted there is refused when the child first opens it, nothing outside is touched."""
    outside = _outside(tmp_path / "ws")
    copying = _reader().model_copy(update={"delegated_workspace": "copy"})
    driver = _driver(tmp_path / "ws", copying)
    run = asyncio.run(driver.run(_escaping_parent(f"ln -s {outside} ../p.1"), "p"))
    child = run.children["p.1"]
    assert child.status is TaskStatus.FAILED
    assert "p.1' is a symbolic link" in (child.record.error or ""), child.record.error
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert "the outside secret" not in _transcript(run)
