"""Delegation: a ``delegate`` call becomes a child task; the child's end is that call's result.

The coordinator decides a delegation (no worker runs it). An approved ``delegate`` call of an
iteration is, when :class:`Acting` reaches it, either refused at once with a tool error naming
the limit (depth, children per task, budget left) and its fix, or turned into a
:class:`ChildSubmission`: the child's task, submitted through the intake in the same atomic
commit as the parent's state, with the id ``{parent}.{n}`` and an idempotency key derived from
the parent, the step, the iteration and the call, so no redelivery or restart creates it twice.
The parent's awaited iteration then waits, in its persisted record, for a
:class:`ChildFinishedMessage`, which the child's own end writes to the observations stream in
the commit that ends it (or the intake, when it rejects the child). Sub-agents of one turn run
in parallel; their usage and iterations count against the parent's step.

Siblings share the step's budget: each child reserves, when it is created, the iterations,
tokens and money (:mod:`coordinator.machine.budget`) it may spend (its ``budget``, else an
even share among the turn's delegations not yet created), out of what the step has left after
the reservations of the siblings still running (:attr:`ChildRef.reserved_iterations`). A
finished child's actual usage replaces its reservation, so what it left unused is free again.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import ValidationError

from coordinator.machine.core import ChildSubmission, Section
from coordinator.state import Awaiting, AwaitKind, ChildRef, TaskRecord, TaskStatus
from shared.actions import Observation, ToolCallAction
from shared.conversation import MessageRole
from shared.delegation import (
    DELEGATE_TOOL,
    DelegateArguments,
    DelegationBudget,
    ParentLink,
    child_idempotency_key,
    child_task_id,
    is_delegate,
)
from shared.protocol import ChildFinishedMessage, Fence

__all__ = ["CHILD_LOOK_S", "Delegation", "child_result", "rejected_child"]

_ENDS: dict[TaskStatus, Literal["completed", "failed", "aborted"]] = {
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.ABORTED: "aborted",
}

CHILD_LOOK_S = 60.0
"""How often a task that waits only on its children is looked at (nothing is re-sent: a
child's end comes back by itself)."""


class Delegation(Section):
    """Sub-agent tasks: created from ``delegate`` calls, their ends applied, cancelled with
    their parent."""

    def start(self, awaiting: Awaiting, call: ToolCallAction) -> None:
        """Create the child of one ``delegate`` call, or answer the call with why not."""
        awaiting.dispatched.append(call.call_id)
        try:
            arguments = DelegateArguments.model_validate_json(call.arguments or "{}")
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            self.refuse(awaiting, call, f"invalid delegate arguments: {problems}")
            return
        refusal = self.limit_refusal(awaiting)
        if refusal is not None:
            self.refuse(awaiting, call, refusal)
            return
        self.submit(awaiting, call, arguments)

    def limit_refusal(self, awaiting: Awaiting) -> str | None:
        """Why this task may not create another child now (None: it may)."""
        m, record = self.m, self.record
        link = record.spec.delegation
        depth = (link.depth if link is not None else 0) + 1
        limit = m.settings.max_delegation_depth
        if depth > limit:
            return (
                f"delegation refused: the sub-agent would run at depth {depth}, over the "
                f"delegation depth limit of {limit} (ORGA_MAX_DELEGATION_DEPTH); do this part "
                "yourself, or ask the operator to raise the limit"
            )
        cap = m.settings.max_children_per_task
        if len(record.children) >= cap:
            return (
                f"delegation refused: this task has created {len(record.children)} sub-agents, "
                f"the limit per task (ORGA_MAX_CHILDREN_PER_TASK={cap}); do the rest yourself, "
                "or ask the operator to raise the limit"
            )
        money = self.m.budget.left()
        if money is not None and money <= 0:
            return (
                f"delegation refused: this task has no money left of its limits.max_cost_usd "
                f"({record.spec.max_cost_usd} USD, after what its running sub-agents reserved); "
                "finish the step yourself, or wait for the running sub-agents"
            )
        iterations, tokens = self.remaining(awaiting)
        if iterations < 1 or tokens < 1:
            held, held_tokens = self.reserved(awaiting)
            return (
                f"delegation refused: this step has {max(iterations, 0)} iterations and "
                f"{max(tokens, 0)} tokens left of its limits (after the {held} iterations and "
                f"{held_tokens} tokens reserved by its sub-agents still running), and a "
                "sub-agent's budget comes out of them; finish the step yourself, or wait for "
                "the running sub-agents and delegate in a later turn"
            )
        return None

    def remaining(self, awaiting: Awaiting) -> tuple[int, int]:
        """Iterations and tokens the current attempt of the step has left, less what the
        running children of ``awaiting`` reserved and the iterations its finished ones used
        (counted in the step once the iteration is observed)."""
        m, record = self.m, self.record
        step = record.step()
        config = m.config()
        used = record.iteration - step.attempt_start_iteration + awaiting.child_iterations
        held, held_tokens = self.reserved(awaiting)
        return (
            config.max_iterations - used - held,
            config.max_total_tokens - step.attempt_usage.total_tokens - held_tokens,
        )

    def reserved(self, awaiting: Awaiting) -> tuple[int, int]:
        """Iterations and tokens reserved by the children ``awaiting`` still waits on."""
        running = [c for c in self.record.children if self.awaits(awaiting, c)]
        return (
            sum(c.reserved_iterations for c in running),
            sum(c.reserved_tokens for c in running),
        )

    def submit(
        self, awaiting: Awaiting, call: ToolCallAction, arguments: DelegateArguments
    ) -> None:
        """The child task, to the intake in this commit, and its record in the parent's."""
        m, record = self.m, self.record
        fence = awaiting.fence.for_call(call.call_id)
        task_id = child_task_id(record.task_id, len(record.children) + 1)
        task: dict[str, object] = {
            "goal": arguments.goal,
            "agent": arguments.agent,
            "idempotency_key": child_idempotency_key(
                record.task_id, fence.step_id, fence.iteration, call.call_id
            ),
        }
        link = self.link(awaiting, fence, arguments)
        task["delegation"] = link.model_dump(mode="json")
        if arguments.steps:
            task["steps"] = [s.model_dump(mode="json", exclude_none=True) for s in arguments.steps]
        m.effects.children.append(ChildSubmission(task_id=task_id, task=_json(task)))
        record.children.append(
            ChildRef(
                task_id=task_id,
                agent=arguments.agent,
                call_id=call.call_id,
                step_id=fence.step_id,
                iteration=fence.iteration,
                goal=arguments.goal[:500],
                reserved_iterations=link.max_iterations or 0,
                reserved_tokens=link.max_total_tokens or 0,
                reserved_cost_usd=link.max_cost_usd or 0.0,
            )
        )
        m.event("delegated", child_task_id=task_id, agent=arguments.agent, call_id=call.call_id)

    def link(self, awaiting: Awaiting, fence: Fence, arguments: DelegateArguments) -> ParentLink:
        """What the child keeps of this task: the call it answers, the context its reviewers
        see, its depth, its workspace's origin and its budget (its reservation: see
        :meth:`budget`)."""
        m, record = self.m, self.record
        iterations, tokens = self.budget(awaiting, arguments)
        asked = arguments.budget.cost_usd if arguments.budget is not None else None
        money = m.budget.share(asked, self.waiting(awaiting))
        parent = record.spec.delegation
        return ParentLink(
            task_id=record.task_id,
            step_id=fence.step_id,
            iteration=fence.iteration,
            call_id=fence.call_id or "",
            attempt=fence.attempt,
            goal=record.spec.goal,
            step_instruction=record.step().spec.instruction,
            depth=(parent.depth if parent is not None else 0) + 1,
            workspace=m.workspace(),
            workspace_base=m.workspace_base(),
            copy_from=m.workspace() if self.workspace_used() else m.workspace_template(),
            max_iterations=iterations,
            max_total_tokens=tokens,
            max_cost_usd=money,
        )

    def budget(self, awaiting: Awaiting, arguments: DelegateArguments) -> tuple[int, int]:
        """The iterations and tokens a new child reserves: what it asked for, else an even
        share among this turn's delegations not yet created (itself included); never more
        than the step has left after its running siblings' reservations."""
        iterations, tokens = self.remaining(awaiting)
        waiting = self.waiting(awaiting)
        asked = arguments.budget or DelegationBudget()
        return (
            _share(asked.iterations, iterations, waiting),
            _share(asked.tokens, tokens, waiting),
        )

    @staticmethod
    def waiting(awaiting: Awaiting) -> int:
        """This turn's delegations not yet created, the one being created included."""
        return 1 + sum(
            1
            for c in awaiting.calls
            if is_delegate(c.name) and c.call_id not in awaiting.dispatched
        )

    def workspace_used(self) -> bool:
        """Whether a tool has run in this task's workspace (which exists from then on)."""
        return any(
            m.role is MessageRole.TOOL and m.tool_name != DELEGATE_TOOL
            for m in self.record.conversation.messages
        )

    def refuse(self, awaiting: Awaiting, call: ToolCallAction, reason: str) -> None:
        error = Observation.tool_error(DELEGATE_TOOL, reason).with_call_id(call.call_id)
        awaiting.results[call.call_id] = error
        self.m.event("delegation_refused", call_id=call.call_id, reason=reason[:300])

    # -- a child's end --------------------------------------------------------------------

    def finished(self, message: ChildFinishedMessage) -> bool:
        """Apply a child's end; False when it is no child of this task's or already applied."""
        m, record = self.m, self.record
        ref = next((c for c in record.children if c.task_id == message.child_task_id), None)
        if ref is None or ref.finished or ref.call_id != message.fence.call_id:
            return False
        ref.status = message.status
        record.usage = record.usage + message.usage
        m.event("child_finished", child_task_id=ref.task_id, status=message.status)
        awaiting = record.awaiting
        if record.terminal or awaiting is None or not self.awaits(awaiting, ref):
            return True  # the parent moved on: the child's end is recorded, not applied
        step = record.step()
        step.usage = step.usage + message.usage
        step.attempt_usage = step.attempt_usage + message.usage
        awaiting.results[ref.call_id] = message.observation.with_call_id(ref.call_id)
        awaiting.child_iterations += message.iterations
        if not awaiting.missing_calls():
            m.observing.all_observed(awaiting)
        return True

    @staticmethod
    def awaits(awaiting: Awaiting, ref: ChildRef) -> bool:
        """Whether the awaited iteration is the one that created ``ref`` and still needs it."""
        return (
            awaiting.kind is AwaitKind.TOOLS
            and awaiting.fence.step_id == ref.step_id
            and awaiting.fence.iteration == ref.iteration
            and ref.call_id in awaiting.delegated()
            and ref.call_id not in awaiting.results
        )

    def look_later(self, awaiting: Awaiting) -> None:
        """A task waiting only on its children is not late: nothing is re-sent."""
        awaiting.deadline = self.m.now + CHILD_LOOK_S

    def abandon(self, awaiting: Awaiting) -> None:
        """The iteration waiting on children is given up (a sibling call was dead-lettered):
        its children still running are cancelled, as nothing will read their results."""
        record = self.record
        for ref in record.children:
            if not ref.finished and self.awaits(awaiting, ref):
                self.cancel(ref, f"the iteration of task {record.task_id} that created it failed")

    def cancel(self, ref: ChildRef, reason: str) -> None:
        self.m.effects.cancels.append(
            {"action": "cancel", "task_id": ref.task_id, "reason": reason}
        )

    # -- this task's end ------------------------------------------------------------------

    def ended(self, status: TaskStatus, error: str | None) -> None:
        """Cancel the children still running; report to the parent, if this is a child."""
        m, record = self.m, self.record
        for ref in record.children:
            if not ref.finished:
                self.cancel(ref, f"its parent task {record.task_id} ended ({status.value})")
        if record.spec.delegation is not None:
            m.effects.child_results.append(child_result(record.task_id, record, status, error))


def child_result(
    task_id: str, record: TaskRecord, status: TaskStatus, error: str | None
) -> ChildFinishedMessage:
    """What a child's end tells its parent's ``delegate`` call."""
    link = record.spec.delegation
    assert link is not None
    agent = record.spec.agent or record.spec.agent_id
    milestones = ", ".join(record.milestones) or "none"
    if status is TaskStatus.COMPLETED:
        content = (
            f"sub-agent {agent!r} (task {task_id}) completed.\nanswer: {record.output}\n"
            f"milestones: {milestones}"
        )
    else:
        partial = f"\npartial output: {record.output}" if record.output else ""
        content = (
            f"sub-agent {agent!r} (task {task_id}) {status.value}: {error or 'no reason given'}"
            f"\nmilestones kept: {milestones}{partial}"
        )
    observation = Observation(
        source=DELEGATE_TOOL,
        content=content,
        is_error=status is not TaskStatus.COMPLETED,
        call_id=link.call_id,
        metadata={"kind": "other", "child_task_id": task_id, "child_status": status.value},
    )
    return ChildFinishedMessage(
        fence=_parent_fence(link),
        child_task_id=task_id,
        status=_ENDS.get(status, "aborted"),
        observation=observation,
        usage=record.usage,
        iterations=sum(s.iterations for s in record.steps),
        milestones=list(record.milestones),
    )


def rejected_child(task_id: str, link: ParentLink, error: str) -> ChildFinishedMessage:
    """What the intake tells a parent whose child it refused (an unknown agent, a bad step)."""
    observation = Observation(
        source=DELEGATE_TOOL,
        content=f"the sub-agent was not created: {error}",
        is_error=True,
        call_id=link.call_id,
        metadata={"kind": "other", "child_task_id": task_id, "child_status": "rejected"},
    )
    return ChildFinishedMessage(
        fence=_parent_fence(link),
        child_task_id=task_id,
        status="rejected",
        observation=observation,
    )


def _parent_fence(link: ParentLink) -> Fence:
    return Fence(
        task_id=link.task_id,
        step_id=link.step_id,
        iteration=link.iteration,
        attempt=link.attempt,
        call_id=link.call_id,
    )


def _share(asked: int | None, left: int, waiting: int) -> int:
    """What one of ``waiting`` new children reserves of ``left``: what it asked for, capped;
    else an even share (at least 1)."""
    return min(asked, left) if asked is not None else max(1, left // waiting)


def _json(data: dict[str, object]) -> str:
    return json.dumps(data, separators=(",", ":"))
