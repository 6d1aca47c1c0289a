"""The machine's entry points: one input (a start, a worker's answer, a tick, a review decision,
a cancel) applied to one task record, by the sections it is made of."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from coordinator.liveness import Liveness
from coordinator.machine.acting import Acting
from coordinator.machine.approvals import Approvals
from coordinator.machine.budget import Budget
from coordinator.machine.core import Effects, MachineCore, Section
from coordinator.machine.critics import Critics
from coordinator.machine.delegation import Delegation
from coordinator.machine.limits import Limits
from coordinator.machine.observing import Observing
from coordinator.machine.outages import Outages
from coordinator.machine.planning import Planning
from coordinator.machine.prehydration import PreHydration
from coordinator.machine.reasoning import Reasoning
from coordinator.machine.redelivery import Redelivery
from coordinator.machine.reviews import Reviews
from coordinator.machine.steps import Steps
from coordinator.state import (
    Awaiting,
    AwaitKind,
    ReviewDecision,
    StepRecord,
    TaskRecord,
    TaskStatus,
)
from shared import keys
from shared.conversation import Conversation, ConversationMessage
from shared.genai import agent_span
from shared.protocol import (
    ChildFinishedMessage,
    ReasonedMessage,
    ToolObservedMessage,
    WorkerFailedMessage,
)
from shared.tracing import (
    phase_span,
    task_context,
    task_traceparent,
    traceparent,
    tracing_installed,
)

__all__ = ["DEFAULT_SYSTEM_PROMPT", "TaskMachine", "decide"]

DEFAULT_SYSTEM_PROMPT = (
    "You are an autonomous software agent working in a sandboxed workspace. Work through the "
    "current step with the tools you have; when the step is done, answer with a short summary "
    "of what you did and why it is done."
)

_TOOL_KINDS = (AwaitKind.TOOLS, AwaitKind.VERIFY, AwaitKind.PREHYDRATE)


class TaskMachine(MachineCore):
    """Applies one input to one task record.

    Each entry point checks the input against what the task awaits (its fence), then hands it
    to the section that decides: :class:`Planning`, :class:`Steps`, :class:`Reasoning` (Reason
    and Gate), :class:`Acting` (Act), :class:`Observing` (Observe, ``done_when``, the
    stagnation detector), :class:`PreHydration`, :class:`Limits`, :class:`Reviews`,
    :class:`Redelivery`, :class:`Delegation` (sub-agents), :class:`Critics` (a step's result
    reviewed before it completes), :class:`Outages` (a provider or policy engine down) and
    :class:`Approvals` (tool calls the gate held for a human).
    """

    # The sections, each built on its first use: an input reaches a few of the fourteen (a
    # machine is built per input the coordinator applies).

    @cached_property
    def planning(self) -> Planning:
        return Planning(self)

    @cached_property
    def steps(self) -> Steps:
        return Steps(self)

    @cached_property
    def reasoning(self) -> Reasoning:
        return Reasoning(self)

    @cached_property
    def acting(self) -> Acting:
        return Acting(self)

    @cached_property
    def observing(self) -> Observing:
        return Observing(self)

    @cached_property
    def prehydration(self) -> PreHydration:
        return PreHydration(self)

    @cached_property
    def limits(self) -> Limits:
        return Limits(self)

    @cached_property
    def reviews(self) -> Reviews:
        return Reviews(self)

    @cached_property
    def redelivery(self) -> Redelivery:
        return Redelivery(self)

    @cached_property
    def delegation(self) -> Delegation:
        return Delegation(self)

    @cached_property
    def critics(self) -> Critics:
        return Critics(self)

    @cached_property
    def outages(self) -> Outages:
        return Outages(self)

    @cached_property
    def approvals(self) -> Approvals:
        return Approvals(self)

    @cached_property
    def budget(self) -> Budget:
        return Budget(self)

    def release_sections(self) -> None:
        """Drop the sections built for this input (:func:`decide` does, once it is applied):
        each holds the machine (``Section.m``), a reference cycle that left every machine,
        its sections and its effects to the garbage collector rather than freed at once
        (docs/performance.md, "no reference cycle per call"). A section used later is built
        again."""
        built = [name for name, value in vars(self).items() if isinstance(value, Section)]
        for name in built:
            del self.__dict__[name]

    def start(self) -> Effects:
        """A new task: plan it when it has no steps, else start its first step (ignored when
        it has started already: a task is started once, whoever applies it)."""
        record = self.record
        if record.status is not TaskStatus.PENDING:
            return self.ignored()
        self.workspace()  # fixed now, with the task
        record.conversation = Conversation.with_system(
            record.spec.system_prompt or DEFAULT_SYSTEM_PROMPT, pin=True
        )
        record.conversation.push(ConversationMessage.user(f"Goal: {record.spec.goal}", pin=True))
        self.event("accepted", goal=record.spec.goal[:200])
        if record.spec.steps:
            record.steps = [StepRecord(spec=s) for s in record.spec.steps]
            record.status = TaskStatus.RUNNING
            self.steps.start(0)
        else:
            record.status = TaskStatus.PLANNING
            self.planning.dispatch()
        return self.done()

    def on_answer(
        self,
        message: ReasonedMessage | ToolObservedMessage | WorkerFailedMessage | ChildFinishedMessage,
    ) -> Effects:
        """Any answer of a worker (or of a sub-agent's task), routed by its kind."""
        if isinstance(message, ReasonedMessage):
            return self.on_reasoned(message)
        if isinstance(message, ToolObservedMessage):
            return self.on_tool_observed(message)
        if isinstance(message, ChildFinishedMessage):
            return self.on_child_finished(message)
        return self.on_worker_failed(message)

    def on_child_finished(self, message: ChildFinishedMessage) -> Effects:
        """A sub-agent's task ended: its end is the result of the ``delegate`` call that
        created it (applied once; recorded even when the task has moved on)."""
        if not self.delegation.finished(message):
            return self.ignored()
        return self.done()

    def on_reasoned(self, message: ReasonedMessage) -> Effects:
        """A reasoning worker answered."""
        awaiting = self.record.awaiting
        if awaiting is None or not awaiting.reasoning:
            return self.ignored()
        if message.fence != awaiting.fence:
            return self.ignored()
        self.outages.answered()
        if awaiting.kind is not AwaitKind.CRITIC:
            self.record.model_calls += 1
        if message.provider_waits:
            self.reasoning.journal_waits(message)
        if awaiting.kind is AwaitKind.CRITIC:
            self.critics.apply(message)
        elif awaiting.kind is AwaitKind.PLAN:
            self.planning.apply(message)
        else:
            self.reasoning.apply(message)
        return self.done()

    def on_tool_observed(self, message: ToolObservedMessage) -> Effects:
        """A tool worker answered one call."""
        awaiting = self.record.awaiting
        call_id = message.fence.call_id
        if awaiting is not None and awaiting.kind is AwaitKind.REASON and awaiting.chained:
            return self._observed_early(awaiting, message)
        if awaiting is None or awaiting.kind not in _TOOL_KINDS or call_id is None:
            return self.ignored()
        expected = {c.call_id for c in awaiting.calls}
        if message.fence.for_call("") != awaiting.fence.for_call("") or call_id not in expected:
            return self.ignored()
        if call_id in awaiting.results:
            return self.ignored()
        awaiting.results[call_id] = message.observation
        self.outages.answered()
        self.acting.remember_recovery(message)
        self.acting.advance(awaiting)
        return self.done()

    def _observed_early(self, awaiting: Awaiting, message: ToolObservedMessage) -> Effects:
        """A chained call answered before the ``reasoned`` message that lists it was applied
        (another coordinator took that one): kept until it is, checked against its calls then."""
        call_id = message.fence.call_id
        if (
            call_id is None
            or message.fence.for_call("") != awaiting.fence.acting().for_call("")
            or call_id in awaiting.results
        ):
            return self.ignored()
        awaiting.results[call_id] = message.observation
        self.acting.remember_recovery(message)
        return self.done()

    def on_worker_failed(self, message: WorkerFailedMessage) -> Effects:
        """A worker could not process a dispatch."""
        awaiting = self.record.awaiting
        if awaiting is None or message.fence.for_call("") != awaiting.fence.for_call(""):
            # Also a chained call's worker failing before its iteration's ``reasoned`` message
            # was applied: that call is then awaited like any other, re-dispatched at its deadline.
            return self.ignored()
        self.redelivery.worker_failed(awaiting, message)
        return self.done()

    def liveness_ids(self) -> list[str]:
        """The ``orga:heartbeats`` members of the dispatch the task waits on (none: it waits
        on nothing)."""
        awaiting = self.record.awaiting
        if awaiting is None or self.record.terminal:
            return []
        return awaiting.liveness_ids()

    def awaited_queue(self) -> str:
        """The Celery queue of the dispatch the task waits on."""
        awaiting = self.record.awaiting
        return awaiting.queue if awaiting is not None else keys.tools_queue

    def on_tick(self, liveness: Liveness | None = None) -> Effects:
        """Deadlines: look at a late dispatch (re-sent only when ``liveness`` says it is lost;
        without it, always), apply undecided reviews' defaults."""
        record = self.record
        if record.terminal:
            return self.ignored()
        if record.status is TaskStatus.PENDING:
            return self.start()
        review = record.review
        awaiting = record.awaiting
        if awaiting is not None and awaiting.held:
            return self._tick_held(awaiting, liveness)
        if record.status is TaskStatus.AWAITING_REVIEW and review is not None:
            return self._tick_review(review.default_decision, review.deadline)
        early = awaiting is not None and awaiting.deadline > self.now
        if awaiting is None or (early and not self._brought_forward(awaiting, liveness)):
            return self.ignored()
        self.redelivery.late(awaiting, liveness)
        return self.done()

    def _brought_forward(self, awaiting: Awaiting, liveness: Liveness | None) -> bool:
        """Whether a tick before the record's look is one a worker asked for: it started the
        dispatch (a beat of its own), and a start brings its task's look to one heartbeat
        timeout after it (:mod:`workers.liveness`), so that a death from then on is noticed in
        time however far the look was (a queued dispatch's goes as far as its queue is long).
        A task holding its dispatch for an outage, or waiting only on sub-agents, keeps its
        look."""
        if liveness is None or self.outages.holding() or awaiting.waits_only_on_children():
            return False
        scores = (liveness.scores.get(i) for i in self.liveness_ids())
        return any(s is not None and s > 0 for s in scores)

    def _tick_review(self, default: ReviewDecision, deadline: float) -> Effects:
        """An open escalation: its default applied once its deadline passed."""
        if deadline > self.now:
            return self.ignored()
        self.reviews.decide(default, None, "deadline")
        return self.done()

    def _tick_held(self, awaiting: Awaiting, liveness: Liveness | None) -> Effects:
        """An iteration with held calls: their deadlines' defaults, and the deadline of the
        calls running beside them."""
        changed = self.approvals.expire(awaiting)
        current = self.record.awaiting
        due = awaiting.deadline <= self.now or self._brought_forward(awaiting, liveness)
        if current is awaiting and awaiting.in_flight() and due:
            self.redelivery.late(awaiting, liveness)
            changed = True
        return self.done() if changed else self.ignored()

    def on_review_decision(
        self,
        review_id: str,
        decision: ReviewDecision,
        hint: str | None,
        decided_by: str,
        arguments: str | None = None,
    ) -> Effects:
        """A human decided an escalation or a held call; raises ValueError when it is not an
        open one, or the decision does not apply to it (``approve``/``revise`` decide a step's
        result; ``approve``/``edit``/``reject``/``abort`` a held call, an edit's ``arguments``
        checked against the tool's input schema)."""
        held = self.approvals.held(review_id)
        if held is not None:
            edited = self.approvals.check(held, decision, arguments)
            self.approvals.decide(held, decision, hint, edited, decided_by)
            return self.done()
        review = self.record.review
        if self.record.status is not TaskStatus.AWAITING_REVIEW or review is None:
            raise ValueError(
                f"task {self.record.task_id} is not waiting for a review "
                f"(status {self.record.status.value})"
            )
        if review.review_id != review_id:
            raise ValueError(
                f"review {review_id!r} is not the open review of task {self.record.task_id} "
                f"(open: {review.review_id!r})"
            )
        self.reviews.check(decision, hint)
        self.reviews.decide(decision, hint, decided_by)
        return self.done()

    def cancel(self, reason: str) -> Effects:
        """Abort the task at an operator's request, keeping its milestones."""
        if self.record.terminal:
            return self.ignored()
        self.steps.finish(TaskStatus.ABORTED, f"cancelled: {reason}")
        return self.done()


def decide(machine: TaskMachine, step: Callable[[TaskMachine], Effects]) -> Effects:
    """Apply one input in the task's trace: an ``orga.decide`` span, and every dispatch it
    sends carries that span's ``traceparent`` (both drivers apply inputs through this).

    Without an SDK installed the span would be the task root's no-op: the dispatches carry
    the root's ``traceparent`` and no span is opened (it cost about 5 % of the coordinator's
    CPU per observation)."""
    try:
        return _decide_traced(machine, step)
    finally:
        machine.release_sections()


def _decide_traced(machine: TaskMachine, step: Callable[[TaskMachine], Effects]) -> Effects:
    record = machine.record
    if not tracing_installed():
        machine.trace_parent = task_traceparent(record.task_id)
        return step(machine)
    was_terminal = record.terminal
    with phase_span(
        "decide",
        task_id=record.task_id,
        step_id=record.step().spec.id if record.steps else None,
        iteration=record.iteration,
        agent_id=record.spec.agent_id,
        parent=task_context(record.task_id),
    ) as span:
        machine.trace_parent = traceparent(span)
        effects = step(machine)
    if machine.record.terminal and not was_terminal:
        invoked(machine.record, machine.now)
    return effects


def invoked(record: TaskRecord, now: float) -> None:
    """The task's ``invoke_agent`` span, from its submission to its end (GenAI conventions),
    in the task's trace (a sub-agent's: under its parent's root as well, by its own id)."""
    usage = record.usage
    agent_span(
        record.spec.agent or record.spec.agent_id,
        record.task_id,
        start_ns=int(record.created_at * 1e9),
        end_ns=int(max(now, record.created_at) * 1e9),
        parent=task_context(record.task_id),
        attributes={
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "orga.cost_usd": usage.cost_usd,
            "orga.status": record.status.value,
            **(
                {"orga.parent_task_id": record.spec.delegation.task_id}
                if record.spec.delegation is not None
                else {}
            ),
        },
    )
