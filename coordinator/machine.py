"""The coordinator's decisions for one task, as pure transitions: no Redis, no Celery, no clock.

Every entry point takes the persisted :class:`TaskRecord`, the input (an observation, a deadline,
a review decision) and ``now``, mutates the record, and returns the :class:`Effects` the service
must carry out *atomically with saving the record*: dispatches, journal entries, lifecycle
events, review items and dead letters. Because the record and the effects are committed together
and every observation is checked against the fence the task awaits, an observation delivered
twice is applied once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from coordinator.liveness import Liveness, LivenessSettings, Verdict
from coordinator.state import (
    Awaiting,
    AwaitKind,
    ReviewDecision,
    ReviewItem,
    ReviewSource,
    StepRecord,
    StepStatus,
    TaskRecord,
    TaskStatus,
)
from shared import keys
from shared.actions import Observation, ToolCallAction
from shared.context_manager import DefaultContextManager
from shared.conversation import Conversation, ConversationMessage
from shared.events import (
    AttemptFailed,
    DispatchFailed,
    Escalated,
    JournalEntry,
    LoopEvent,
    ObservationsCollected,
    PolicyEvaluated,
    ProviderWaited,
    ReasoningComplete,
    ReviewDecided,
    StagnationDetected,
    Started,
    StepLimitReached,
    Terminated,
    ToolsDispatched,
    VerificationRun,
)
from shared.inference import Usage
from shared.loop_types import LoopConfig, TerminationKind, TerminationReason
from shared.pre_hydration import ExtractedReference, PreHydrationEngine, ResolutionResult
from shared.progress_tracker import LimitAction, ProgressTracker
from shared.protocol import (
    ConversationRef,
    Fence,
    ReasonedMessage,
    ReasonRequest,
    ToolObservedMessage,
    ToolRequest,
    WorkerFailedMessage,
)
from shared.stagnation import StagnationDetector, StagnationLevel, StagnationVerdict, ToolEvent
from shared.task_spec import StepSpec, task_workspace
from shared.tracing import phase_span, task_context, traceparent

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Effects", "MachineSettings", "TaskMachine", "decide"]

DEFAULT_SYSTEM_PROMPT = (
    "You are an autonomous software agent working in a sandboxed workspace. Work through the "
    "current step with the tools you have; when the step is done, answer with a short summary "
    "of what you did and why it is done."
)

PLAN_FENCE_STEP = "__plan__"
"""The fence step of the planning call: not a valid step id, so it never collides with one."""

PLAN_PROMPT = (
    "Break the goal into a short list of concrete steps. Answer with JSON only: "
    '{"steps": [{"id": "short-id", "instruction": "what to do", '
    '"done_when": "optional shell command that exits 0 when the step is done"}]}'
)


@dataclass(frozen=True, slots=True)
class MachineSettings:
    """Deadlines and limits the coordinator applies to every task."""

    observation_deadline_s: float = 30.0
    """When a dispatch is first looked at; then as :mod:`coordinator.liveness` says."""
    max_redeliveries: int = 3
    liveness: LivenessSettings = field(default_factory=LivenessSettings)
    workspace_root: str = field(default_factory=lambda: str(Path.home() / ".orga" / "workspaces"))
    recent_messages_in_snapshot: int = 8
    allow_inline_tools: bool = True
    conversation_by_reference: bool = False
    """Reasoning requests carry a reference to the stored conversation, not its messages
    (the coordinator service, whose store keeps it in Redis); False: the messages travel in
    the request (the in-process driver)."""
    chain_tools: bool = True
    """Let reasoning workers send an iteration's approved calls straight to the tool workers
    (``ReasonRequest.chain_tools``); False: the coordinator dispatches every tool call."""


@dataclass
class Effects:
    """What must happen, atomically with saving the record."""

    reason_dispatches: list[ReasonRequest] = field(default_factory=list)
    tool_dispatches: list[ToolRequest] = field(default_factory=list)
    journal: list[JournalEntry] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    reviews: list[ReviewItem] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    changed: bool = True

    def stamped(self, epoch: int) -> None:
        """Reasoning requests by reference read the stored conversation of ``epoch``."""
        self.reason_dispatches = [
            r.model_copy(update={"conversation_ref": r.conversation_ref.model_copy(
                update={"epoch": epoch})}) if r.conversation_ref is not None else r
            for r in self.reason_dispatches
        ]  # fmt: skip

    def traced(self, parent: str | None) -> None:
        """Every dispatch carries ``parent``, the ``traceparent`` of the span that decided it."""
        if parent is None:
            return
        update = {"trace_parent": parent}
        self.reason_dispatches = [r.model_copy(update=update) for r in self.reason_dispatches]
        self.tool_dispatches = [t.model_copy(update=update) for t in self.tool_dispatches]


class TaskMachine:
    """Applies one input to one task record."""

    def __init__(self, record: TaskRecord, now: float, settings: MachineSettings) -> None:
        self.record = record
        self.now = now
        self.settings = settings
        self.effects = Effects()
        self._tracker: ProgressTracker | None = None
        self._detector: StagnationDetector | None = None

    @property
    def tracker(self) -> ProgressTracker:
        """The step's progress tracker, restored from the record on first use."""
        if self._tracker is None:
            spec = self.record.spec
            self._tracker = ProgressTracker.from_state(spec.step_iteration, self.record.tracker)
        return self._tracker

    @property
    def detector(self) -> StagnationDetector:
        """The task's stagnation detector, restored from the record on first use (an input
        that does not observe anything, such as a reasoning answer, neither restores nor
        saves its state, which is the largest part of the record)."""
        if self._detector is None:
            spec = self.record.spec
            self._detector = StagnationDetector.from_state(spec.stagnation, self.record.detector)
        return self._detector

    # -- entry points ---------------------------------------------------------------------

    def start(self) -> Effects:
        """A new task: plan it when it has no steps, else start its first step (ignored when
        it has started already: a task is started once, whoever applies it)."""
        record = self.record
        if record.status is not TaskStatus.PENDING:
            return self._ignored()
        self._workspace()  # fixed now, with the task
        record.conversation = Conversation.with_system(
            record.spec.system_prompt or DEFAULT_SYSTEM_PROMPT, pin=True
        )
        record.conversation.push(ConversationMessage.user(f"Goal: {record.spec.goal}", pin=True))
        self._event("accepted", goal=record.spec.goal[:200])
        if record.spec.steps:
            record.steps = [StepRecord(spec=s) for s in record.spec.steps]
            record.status = TaskStatus.RUNNING
            self._start_step(0)
        else:
            record.status = TaskStatus.PLANNING
            self._dispatch_plan()
        return self._done()

    def on_answer(
        self, message: ReasonedMessage | ToolObservedMessage | WorkerFailedMessage
    ) -> Effects:
        """Any answer of a worker, routed by its kind."""
        if isinstance(message, ReasonedMessage):
            return self.on_reasoned(message)
        if isinstance(message, ToolObservedMessage):
            return self.on_tool_observed(message)
        return self.on_worker_failed(message)

    def on_reasoned(self, message: ReasonedMessage) -> Effects:
        """A reasoning worker answered."""
        awaiting = self.record.awaiting
        if awaiting is None or awaiting.kind not in (AwaitKind.REASON, AwaitKind.PLAN):
            return self._ignored()
        if message.fence != awaiting.fence:
            return self._ignored()
        self.record.model_calls += 1
        if message.provider_waits:
            self._journal_waits(message)
        if awaiting.kind is AwaitKind.PLAN:
            self._apply_plan(message)
        else:
            self._apply_reasoning(message)
        return self._done()

    def on_tool_observed(self, message: ToolObservedMessage) -> Effects:
        """A tool worker answered one call."""
        awaiting = self.record.awaiting
        call_id = message.fence.call_id
        if awaiting is not None and awaiting.kind is AwaitKind.REASON and awaiting.chained:
            return self._observed_early(awaiting, message)
        if awaiting is None or awaiting.kind not in _TOOL_KINDS or call_id is None:
            return self._ignored()
        expected = {c.call_id for c in awaiting.calls}
        if message.fence.for_call("") != awaiting.fence.for_call("") or call_id not in expected:
            return self._ignored()
        if call_id in awaiting.results:
            return self._ignored()
        awaiting.results[call_id] = message.observation
        self._remember_recovery(message)
        if awaiting.missing_calls():
            self._dispatch_more(awaiting)
            return self._done()
        self._all_observed(awaiting)
        return self._done()

    def _observed_early(self, awaiting: Awaiting, message: ToolObservedMessage) -> Effects:
        """A chained call answered before the ``reasoned`` message that lists it was applied
        (another coordinator took that one): kept until it is, checked against its calls then."""
        call_id = message.fence.call_id
        if (
            call_id is None
            or message.fence.for_call("") != awaiting.fence.acting().for_call("")
            or call_id in awaiting.results
        ):
            return self._ignored()
        awaiting.results[call_id] = message.observation
        self._remember_recovery(message)
        return self._done()

    def on_worker_failed(self, message: WorkerFailedMessage) -> Effects:
        """A worker could not process a dispatch."""
        awaiting = self.record.awaiting
        if awaiting is None or message.fence.for_call("") != awaiting.fence.for_call(""):
            # Also a chained call's worker failing before its iteration's ``reasoned`` message
            # was applied: that call is then awaited like any other, re-dispatched at its deadline.
            return self._ignored()
        config = message.error_kind == "config"
        retried = (
            not config
            and message.retryable
            and awaiting.redeliveries < self.settings.max_redeliveries
        )
        self._journal(
            DispatchFailed(
                fence=message.fence.token(),
                error=message.error[:2000],
                retried=retried,
                error_kind=message.error_kind,
            )
        )
        if config:
            self._config_failure(awaiting, message.error)
        elif retried:
            self._redispatch(awaiting)
        else:
            self._dead_letter(awaiting, message.error)
        return self._done()

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
            return self._ignored()
        if record.status is TaskStatus.PENDING:
            return self.start()
        review = record.review
        if record.status is TaskStatus.AWAITING_REVIEW and review is not None:
            if review.deadline <= self.now:
                self._decide(review.default_decision, None, "deadline")
                return self._done()
            return self._ignored()
        awaiting = record.awaiting
        if awaiting is None or awaiting.deadline > self.now:
            return self._ignored()
        return self._late(awaiting, liveness)

    def _late(self, awaiting: Awaiting, liveness: Liveness | None) -> Effects:
        """A dispatch past its deadline: still alive, re-sent, or (too often) dead-lettered."""
        if liveness is not None and self._still_alive(awaiting, liveness):
            return self._done()
        if awaiting.redeliveries >= self.settings.max_redeliveries:
            self._dead_letter(
                awaiting,
                f"no observation after {awaiting.redeliveries + 1} dispatches of "
                f"{awaiting.fence.token()} (deadline {self.settings.observation_deadline_s}s each)",
            )
        else:
            self._redispatch(awaiting)
        return self._done()

    def _still_alive(self, awaiting: Awaiting, liveness: Liveness) -> bool:
        """Move a late dispatch's deadline on when it runs, is answered or is queued; False
        when it is lost (journaled as an event either way it changes)."""
        judgement = liveness.judge(
            self.liveness_ids(),
            self.now,
            awaiting.dispatched_at,
            awaiting.unstarted_looks,
            self.settings.liveness,
        )
        if judgement.look_again_at is None:
            self._event("dispatch_lost", fence=awaiting.fence.token(), reason=judgement.reason)
            return False
        if judgement.verdict is Verdict.UNSTARTED:
            awaiting.unstarted_looks += 1
        awaiting.deadline = judgement.look_again_at
        if judgement.verdict is Verdict.NO_CONSUMER:
            self._event("no_consumer", fence=awaiting.fence.token(), reason=judgement.reason)
        return True

    def on_review_decision(
        self, review_id: str, decision: ReviewDecision, hint: str | None, decided_by: str
    ) -> Effects:
        """A human decided an escalation; raises ValueError when it is not the awaited one."""
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
        self._decide(decision, hint, decided_by)
        return self._done()

    def cancel(self, reason: str) -> Effects:
        """Abort the task at an operator's request, keeping its milestones."""
        if self.record.terminal:
            return self._ignored()
        self._finish(TaskStatus.ABORTED, f"cancelled: {reason}")
        return self._done()

    # -- planning -------------------------------------------------------------------------

    def _dispatch_plan(self) -> None:
        conversation = Conversation.with_system(PLAN_PROMPT)
        conversation.push(ConversationMessage.user(f"Goal: {self.record.spec.goal}"))
        self.record.dispatches += 1
        fence = Fence(
            task_id=self.record.task_id,
            step_id=PLAN_FENCE_STEP,
            iteration=0,
            attempt=self.record.dispatches,
            nonce=uuid.uuid4().hex[:12],
        )
        self._await(AwaitKind.PLAN, fence)
        self.effects.reason_dispatches.append(
            self._reason_request(fence, conversation, purpose="plan")
        )

    def _apply_plan(self, message: ReasonedMessage) -> None:
        record = self.record
        record.usage = record.usage + message.usage
        steps = parse_plan(message.terminal_output or "") or [
            StepSpec(id="main", instruction=record.spec.goal)
        ]
        record.steps = [StepRecord(spec=s) for s in steps]
        record.status = TaskStatus.RUNNING
        self._event("planned", steps=",".join(s.id for s in steps))
        self._start_step(0)

    # -- steps ----------------------------------------------------------------------------

    def _start_step(self, index: int) -> None:
        record = self.record
        record.current = index
        record.iteration = 0
        step = record.step()
        step.status = StepStatus.RUNNING
        step.started_at = self.now
        self.tracker.begin_step(step.spec.id)
        if index > 0:
            record.conversation.unpin(self._step_message(index - 1))
        record.conversation.push(ConversationMessage.user(self._step_message(index), pin=True))
        self._journal(Started(agent_id=record.spec.agent_id, config=self._config()))
        self._event("step_started", step_id=step.spec.id)
        if index == 0 and record.spec.pre_hydration is not None and self._pre_hydrate():
            return
        self._dispatch_reason()

    def _step_message(self, index: int) -> str:
        step = self.record.steps[index].spec
        text = f"Step {index + 1} of {len(self.record.steps)} ({step.id}): {step.instruction}"
        if step.done_when is not None:
            text += (
                f"\nThis step is verified by running `{step.done_when.command}`, which must "
                f"exit with code {step.done_when.expect_exit_code}."
            )
        return text

    def _complete_step(self, output: str, verified: bool) -> None:
        record = self.record
        step = record.step()
        step.status = StepStatus.COMPLETED
        step.output = output
        step.verified = verified
        if verified:
            name = f"step:{step.spec.id}"
            record.milestones.append(name)
            self.detector.milestone(name)
        self._end_step_loop(TerminationReason.completed())
        self._event("step_completed", step_id=step.spec.id, verified=str(verified).lower())
        self._next_step()

    def _skip_step(self, note: str) -> None:
        step = self.record.step()
        step.status = StepStatus.SKIPPED
        step.note = note
        self._end_step_loop(TerminationReason(kind=TerminationKind.ERROR, message=note))
        self._event("step_skipped", step_id=step.spec.id, reason=note[:300])
        self._next_step()

    def _next_step(self) -> None:
        record = self.record
        if record.current + 1 < len(record.steps):
            self._start_step(record.current + 1)
            return
        done = [s for s in record.steps if s.status is StepStatus.COMPLETED]
        record.output = done[-1].output if done else ""
        if done:
            self._finish(TaskStatus.COMPLETED, None)
        else:
            self._finish(
                TaskStatus.FAILED, f"no step completed: all {len(record.steps)} were skipped"
            )

    def _end_step_loop(self, reason: TerminationReason) -> None:
        step = self.record.step()
        self._journal(
            Terminated(
                reason=reason,
                iterations=step.iterations,
                total_usage=step.usage,
                duration=timedelta(seconds=max(self.now - (step.started_at or self.now), 0)),
            )
        )

    def _finish(self, status: TaskStatus, error: str | None) -> None:
        record = self.record
        if record.status in (TaskStatus.RUNNING, TaskStatus.AWAITING_REVIEW) and record.steps:
            step = record.step()
            if step.status is StepStatus.RUNNING:
                step.status = StepStatus.FAILED
                step.note = error
                kind = TerminationKind.ERROR
                self._end_step_loop(TerminationReason(kind=kind, message=error))
        record.status = status
        record.error = error
        record.awaiting = None
        if record.review is not None and record.review.decision is None:
            self._event("review_closed", review_id=record.review.review_id)
            record.review = None
        self._event(status.value, error=(error or "")[:500], milestones=",".join(record.milestones))

    # -- reasoning ------------------------------------------------------------------------

    def _dispatch_reason(self) -> None:
        record = self.record
        manager = DefaultContextManager(record.spec.context)
        fit = manager.fit(record.conversation, record.spec.limits.context_token_budget)
        if fit.compacted:
            self.detector.compacted()
        if fit.pinned_over_budget:
            self._event(
                "context_over_budget",
                pinned_tokens=str(fit.pinned_tokens),
                budget=str(fit.max_tokens),
            )
        fence = self._fence()
        awaiting = self._await(AwaitKind.REASON, fence)
        record.iteration_started_at = self.now
        request = self._reason_request(fence, record.conversation, purpose="act")
        awaiting.chained = request.chain_tools
        self.effects.reason_dispatches.append(request)

    def _reason_request(
        self, fence: Fence, conversation: Conversation, purpose: str
    ) -> ReasonRequest:
        record = self.record
        act_inline = record.spec.tool_dispatch == "inline" and self.settings.allow_inline_tools
        by_reference = self.settings.conversation_by_reference and purpose != "plan"
        return ReasonRequest(
            fence=fence,
            purpose="plan" if purpose == "plan" else "act",
            agent_id=record.spec.agent_id,
            conversation=Conversation() if by_reference else conversation,
            conversation_ref=(
                ConversationRef(length=len(conversation), created_at=record.created_at)
                if by_reference
                else None
            ),
            config=self._attempt_config(),
            provider=record.spec.provider,
            policy=record.spec.policy,
            workspace=self._workspace(),
            usage=record.step().attempt_usage if record.steps else record.usage,
            allowed_tools=record.spec.tools,
            model_calls=record.model_calls,
            act_inline=act_inline,
            workspace_template=record.spec.workspace_template,
            recovery=record.spec.recovery,
            tool_recovery=record.spec.tool_recovery,
            chain_tools=purpose == "act" and not act_inline and self.settings.chain_tools,
        )

    def _apply_reasoning(self, message: ReasonedMessage) -> None:
        record = self.record
        step = record.step()
        asked = record.awaiting
        assert asked is not None  # on_reasoned checked it is this message's dispatch
        for new in message.new_messages:
            record.conversation.push(new.unpinned_copy())
        record.usage = record.usage + message.usage
        step.usage = step.usage + message.usage
        step.attempt_usage = step.attempt_usage + message.usage
        if message.termination is not None:
            self._attempt_failed(str(message.termination))
            return
        record.iteration += 1
        step.iterations += 1
        self._journal(
            ReasoningComplete(
                iteration=record.iteration, actions=message.actions, usage=message.usage
            )
        )
        self._journal(
            PolicyEvaluated(
                iteration=record.iteration,
                action_count=len(message.actions),
                denied_count=message.denied_count,
            )
        )
        if message.terminal_output is not None:
            self._journal_empty_act()
            self._step_answered(message.terminal_output)
        elif message.approved_calls and message.acted is not None:
            self._acted_inline(message.approved_calls, message.acted)
        elif message.approved_calls and message.chained and asked.chained:
            self._chained(message.approved_calls, message.chained, asked)
        elif message.approved_calls:
            self._dispatch_tools(message.approved_calls, AwaitKind.TOOLS, "act")
        else:
            self._journal_empty_act()
            self._next_iteration()

    def _chained(
        self, calls: Sequence[ToolCallAction], chained: Sequence[str], asked: Awaiting
    ) -> None:
        """The reasoning worker sent ``chained`` to the tool workers under its own fence."""
        awaiting = self._await(AwaitKind.TOOLS, asked.fence.acting())
        awaiting.calls = list(calls)
        known = {c.call_id for c in calls}
        awaiting.dispatched = [c for c in chained if c in known]
        awaiting.results = {k: v for k, v in asked.results.items() if k in known}
        awaiting.escalations = {k: v for k, v in asked.escalations.items() if k in known}
        awaiting.tool_ms = asked.tool_ms
        if awaiting.missing_calls():
            self._dispatch_more(awaiting)
        else:
            self._all_observed(awaiting)

    def _acted_inline(
        self, calls: Sequence[ToolCallAction], acted: Sequence[ToolObservedMessage]
    ) -> None:
        """The reasoning worker ran the calls itself: observe them now."""
        awaiting = self._await(AwaitKind.TOOLS, self._fence())
        awaiting.calls = list(calls)
        for outcome in acted:
            call_id = outcome.fence.call_id
            if call_id is not None and call_id not in awaiting.results:
                awaiting.results[call_id] = outcome.observation
                self._remember_recovery(outcome)
        for call in awaiting.missing_calls():
            awaiting.results[call.call_id] = Observation.tool_error(
                call.name, "the reasoning worker returned no result for this call"
            ).with_call_id(call.call_id)
        self._all_observed(awaiting)

    def _journal_waits(self, message: ReasonedMessage) -> None:
        """The model call waited out rate limits or provider errors: journaled, and not a
        failed attempt (the worker retried within its deadline)."""
        waits = message.provider_waits
        total = round(sum(w.wait_s for w in waits), 3)
        self._journal(
            ProviderWaited(iteration=self.record.iteration, waits=waits, total_wait_s=total)
        )

    def _journal_empty_act(self) -> None:
        iteration = self.record.iteration
        zero = timedelta(0)
        self._journal(ToolsDispatched(iteration=iteration, tool_count=0, duration=zero))
        self._journal(ObservationsCollected(iteration=iteration, observation_count=0))

    def _step_answered(self, output: str) -> None:
        check = self.record.step().spec.done_when
        if check is None:
            self._complete_step(output, verified=False)
            return
        arguments = {"command": check.command, "timeout_s": check.timeout.total_seconds()}
        call = ToolCallAction(
            call_id=f"verify-{self.record.current}-{self.record.iteration}",
            name="run_command",
            arguments=json.dumps(arguments),
        )
        self._dispatch_tools([call], AwaitKind.VERIFY, "verify", terminal_output=output)

    def _next_iteration(self) -> None:
        record = self.record
        step = record.step()
        limit = self._config().max_iterations
        elapsed = self.now - (step.started_at or self.now)
        if record.iteration - step.attempt_start_iteration >= limit:
            self._attempt_failed(
                f"step '{step.spec.id}' used its {limit} iterations without finishing"
            )
        elif elapsed > record.spec.limits.step_timeout.total_seconds():
            self._attempt_failed(
                f"step '{step.spec.id}' exceeded its timeout of "
                f"{record.spec.limits.step_timeout.total_seconds():.0f}s"
            )
        else:
            self._dispatch_reason()

    # -- tools ----------------------------------------------------------------------------

    def _dispatch_tools(
        self,
        calls: Sequence[ToolCallAction],
        kind: AwaitKind,
        purpose: str,
        terminal_output: str | None = None,
    ) -> None:
        fence = self._fence()
        awaiting = self._await(kind, fence)
        awaiting.calls = list(calls)
        awaiting.purpose = purpose
        awaiting.terminal_output = terminal_output
        self._dispatch_more(awaiting)

    def _dispatch_more(self, awaiting: Awaiting) -> None:
        """Dispatch waiting calls while fewer than ``max_concurrent_tools`` are in flight.

        Pre-hydration resolutions go out together in one dispatch: one worker resolves them
        concurrently, so the wall time is the slowest resolution, not the worker count's share.
        """
        if awaiting.kind is AwaitKind.PREHYDRATE:
            self._dispatch_batch(awaiting)
            return
        limit = self._config().max_concurrent_tools
        in_flight = [c for c in awaiting.dispatched if c not in awaiting.results]
        for call in awaiting.calls:
            if len(in_flight) >= limit:
                return
            if call.call_id in awaiting.dispatched:
                continue
            awaiting.deadline = self.now + self._deadline_s()
            awaiting.dispatched.append(call.call_id)
            in_flight.append(call.call_id)
            request = self._tool_request(awaiting.fence, call, awaiting.purpose)
            self.effects.tool_dispatches.append(request)

    def _dispatch_batch(self, awaiting: Awaiting) -> None:
        waiting = [c for c in awaiting.calls if c.call_id not in awaiting.dispatched]
        if not waiting:
            return
        awaiting.deadline = self.now + self._deadline_s()
        awaiting.dispatched.extend(c.call_id for c in waiting)
        request = self._tool_request(awaiting.fence, waiting[0], awaiting.purpose)
        self.effects.tool_dispatches.append(request.model_copy(update={"also": waiting[1:]}))

    def _tool_request(self, fence: Fence, call: ToolCallAction, purpose: str) -> ToolRequest:
        spec = self.record.spec
        return ToolRequest(
            fence=fence.for_call(call.call_id),
            purpose="verify"
            if purpose == "verify"
            else ("prehydrate" if purpose == "prehydrate" else "act"),
            agent_id=spec.agent_id,
            action=call,
            workspace=self._workspace(),
            workspace_template=spec.workspace_template,
            config=self._config(),
            recovery=spec.tool_recovery.get(call.name, spec.recovery),
            gated=purpose == "prehydrate",
            policy=spec.policy,
            allowed_tools=spec.tools,
        )

    def _remember_recovery(self, message: ToolObservedMessage) -> None:
        awaiting = self.record.awaiting
        assert awaiting is not None
        for event in message.recovery_events:
            self._journal(event.model_copy(update={"iteration": self.record.iteration}))
        # The calls of an iteration run concurrently: the batch took as long as its longest.
        awaiting.tool_ms = max(awaiting.tool_ms, message.duration_ms)
        if message.escalation_reason is not None:
            awaiting.escalations[message.fence.call_id or ""] = message.escalation_reason

    def _all_observed(self, awaiting: Awaiting) -> None:
        if awaiting.kind is AwaitKind.VERIFY:
            self._verified(awaiting)
        elif awaiting.kind is AwaitKind.PREHYDRATE:
            self._pre_hydrated(awaiting)
        else:
            self._observe(awaiting)

    def _observe(self, awaiting: Awaiting) -> None:
        record = self.record
        observations = [awaiting.results[c.call_id] for c in awaiting.calls]
        for observation in observations:
            record.conversation.push(observation.as_tool_message())
        duration = timedelta(milliseconds=awaiting.tool_ms)
        count = len(observations)
        self._journal(
            ToolsDispatched(iteration=record.iteration, tool_count=count, duration=duration)
        )
        self._journal(ObservationsCollected(iteration=record.iteration, observation_count=count))
        record.awaiting = None
        if awaiting.escalations:
            self._escalate("recovery", next(iter(awaiting.escalations.values())))
            return
        verdict = self._consult_detector(awaiting.calls, observations)
        if verdict is not None and self._apply_verdict(verdict):
            return
        self._next_iteration()

    def _consult_detector(
        self, calls: Sequence[ToolCallAction], observations: Sequence[Observation]
    ) -> StagnationVerdict | None:
        events = [
            ToolEvent.from_observation(call, observation, strict=False)
            for call, observation in zip(calls, observations, strict=True)
        ]
        return self.detector.observe_batch(events) if events else None

    def _apply_verdict(self, verdict: StagnationVerdict) -> bool:
        """Apply a stagnation verdict; True when it ended or suspended the step."""
        if verdict.level is StagnationLevel.NONE:
            return False
        if verdict.escalated:
            self._journal(StagnationDetected.from_verdict(verdict))
            self._event("stagnation", level=verdict.level.value, kind=str(verdict.kind or ""))
        if verdict.level in (StagnationLevel.NUDGE, StagnationLevel.REPLAN):
            if verdict.escalated:
                self.record.conversation.push(ConversationMessage.user(verdict.message))
            return False
        if verdict.level is StagnationLevel.ASK_HUMAN:
            self._escalate("detector", verdict.message)
        else:
            self._finish(
                TaskStatus.ABORTED, f"stagnation detector aborted the task: {verdict.message}"
            )
        return True

    def _verified(self, awaiting: Awaiting) -> None:
        record = self.record
        check = record.step().spec.done_when
        assert check is not None
        observation = awaiting.results[awaiting.calls[0].call_id]
        record.awaiting = None
        exit_code = observation.metadata.get("exit_code")
        passed = _exit_code(exit_code) == check.expect_exit_code
        self._journal(
            VerificationRun(
                step_id=record.step().spec.id,
                command=check.command,
                exit_code=_exit_code(exit_code),
                expected=check.expect_exit_code,
                passed=passed,
            )
        )
        if passed:
            self._complete_step(awaiting.terminal_output or "", verified=True)
            return
        tail = observation.content[-1500:]
        feedback = (
            f"[Verification failed] `{check.command}` exited with {exit_code} "
            f"(expected {check.expect_exit_code}):\n{tail}"
        )
        record.conversation.push(ConversationMessage.user(feedback))
        self._attempt_failed(feedback)

    # -- pre-hydration --------------------------------------------------------------------

    def _pre_hydrate(self) -> bool:
        """Dispatch the resolutions of the references in the goal; False when none are due."""
        engine, references = self._references()
        if not references:
            return False
        calls = [
            ToolCallAction(call_id=call_id, name=tool, arguments=json.dumps({"input": value}))
            for call_id, tool, value in engine.planned_calls(references)
        ]
        if not calls:
            self._pre_hydrated_with({})
            return False
        self._dispatch_tools(calls, AwaitKind.PREHYDRATE, "prehydrate")
        return True

    def _references(self) -> tuple[PreHydrationEngine, list[ExtractedReference]]:
        record = self.record
        assert record.spec.pre_hydration is not None
        engine = PreHydrationEngine(record.spec.pre_hydration)
        text = f"{record.spec.goal}\n{record.steps[0].spec.instruction}"
        return engine, engine.extract_references(text)

    def _pre_hydrated(self, awaiting: Awaiting) -> None:
        self.record.awaiting = None
        self._pre_hydrated_with(awaiting.results)
        self._dispatch_reason()

    def _pre_hydrated_with(self, observations: dict[str, Observation]) -> None:
        engine, references = self._references()
        results = {
            call_id: ResolutionResult(call_id=call_id, content=o.content, is_error=o.is_error)
            for call_id, o in observations.items()
            if o.metadata.get("timed_out") != "true"
        }
        timed_out = [k for k, o in observations.items() if o.metadata.get("timed_out") == "true"]
        hydrated = engine.assemble(references, results, timed_out)
        text = engine.format_context(hydrated)
        if text:
            self.record.conversation.push(ConversationMessage.system(text))
        self._journal(hydrated.completion_event())

    # -- limits, reviews, redelivery ------------------------------------------------------

    def _attempt_failed(self, error: str) -> None:
        record = self.record
        step = record.step()
        step.attempts += 1
        record.awaiting = None
        self._journal(
            AttemptFailed(step_id=step.spec.id, attempt=step.attempts, error=error[:2000])
        )
        decision = self.tracker.record_and_check(step.spec.id, error)
        if not decision.stop:
            self._new_attempt(step)
            record.conversation.push(
                ConversationMessage.user(
                    f"[Coordinator] Attempt {step.attempts} of step '{step.spec.id}' failed: "
                    f"{error[:1500]}\nTry a different approach."
                )
            )
            self._dispatch_reason()
            return
        attempts = self.tracker.attempt_count(step.spec.id)
        self._journal(StepLimitReached.from_decision(step.spec.id, attempts, decision))
        # The tracker says why it stopped; the last error says what failed (the review's
        # context, the skip note, the abort error all show it).
        reason = f"{decision.reason}; last error: {error[:500]}" if decision.reason else error
        action = self.tracker.limit_action
        if action is LimitAction.SKIP_STEP:
            self._skip_step(reason)
        elif action is LimitAction.ABORT_TASK:
            self._finish(TaskStatus.ABORTED, reason)
        else:
            self._escalate("tracker", reason)

    def _new_attempt(self, step: StepRecord) -> None:
        """A fresh iteration and token budget; iteration numbers keep growing within the step,
        so a fence is never reused and a late observation of an old attempt stays stale."""
        step.attempt_start_iteration = self.record.iteration
        step.started_at = self.now
        step.attempt_usage = Usage()

    def _escalate(self, source: ReviewSource, reason: str) -> None:
        record = self.record
        review_spec = record.spec.review
        item = ReviewItem(
            review_id=uuid.uuid4().hex[:12],
            task_id=record.task_id,
            step_id=record.step().spec.id,
            source=source,
            reason=reason,
            created_at=self.now,
            deadline=self.now + review_spec.deadline.total_seconds(),
            default_decision=review_spec.default_decision,
            snapshot=self._snapshot(),
        )
        record.status = TaskStatus.AWAITING_REVIEW
        record.awaiting = None
        record.review = item
        self.effects.reviews.append(item)
        self._journal(
            Escalated(
                review_id=item.review_id,
                source=source,
                reason=reason,
                deadline=datetime.fromtimestamp(item.deadline, UTC),
                default_decision=item.default_decision,
            )
        )
        self._event("escalated", review_id=item.review_id, reason=reason[:500], source=source)

    def _snapshot(self) -> dict[str, Any]:
        record = self.record
        step = record.step()
        recent = record.conversation.messages[-self.settings.recent_messages_in_snapshot :]
        return {
            "goal": record.spec.goal,
            "step": {"id": step.spec.id, "instruction": step.spec.instruction},
            "iteration": record.iteration,
            "attempts": step.attempts,
            "milestones": list(record.milestones),
            "counters": self.detector.counters(),
            "recent": [
                {
                    "role": m.role.value,
                    "content": m.content[:500],
                    "tool": m.tool_name or "",
                    "tool_calls": [f"{c.name}({c.arguments[:200]})" for c in m.tool_calls],
                }
                for m in recent
            ],
        }

    def _decide(self, decision: ReviewDecision, hint: str | None, decided_by: str) -> None:
        record = self.record
        review = record.review
        assert review is not None
        review.decision = decision
        review.hint = hint
        review.decided_by = decided_by
        self._event("review_decided", review_id=review.review_id, decision=decision, by=decided_by)
        self._journal(
            ReviewDecided(
                review_id=review.review_id, decision=decision, decided_by=decided_by, hint=hint
            )
        )
        record.review = None
        if decision == "abort":
            self._finish(
                TaskStatus.ABORTED, f"aborted by review {review.review_id}: {review.reason}"
            )
            return
        record.status = TaskStatus.RUNNING
        if decision == "skip":
            self._skip_step(f"skipped by review {review.review_id}: {review.reason}")
            return
        step = record.step()
        self.tracker.begin_step(step.spec.id)
        self.detector.reset_window()
        self._new_attempt(step)
        if hint:
            record.conversation.push(ConversationMessage.user(f"[Human reviewer] {hint}"))
        self._dispatch_reason()

    def _redispatch(self, awaiting: Awaiting) -> None:
        self.record.dispatches += 1
        fence = awaiting.fence.model_copy(
            update={"attempt": self.record.dispatches, "nonce": uuid.uuid4().hex[:12]}
        )
        awaiting.fence = fence
        awaiting.redeliveries += 1
        awaiting.deadline = self.now + self._deadline_s()
        awaiting.dispatched_at = self.now
        awaiting.unstarted_looks = 0
        self._event("redispatched", fence=fence.token(), kind=awaiting.kind.value)
        if awaiting.kind in (AwaitKind.REASON, AwaitKind.PLAN):
            awaiting.results.clear()  # results of the abandoned dispatch's chained calls
            conversation = self.record.conversation
            if awaiting.kind is AwaitKind.PLAN:
                conversation = Conversation.with_system(PLAN_PROMPT)
                conversation.push(ConversationMessage.user(f"Goal: {self.record.spec.goal}"))
            self.effects.reason_dispatches.append(
                self._reason_request(fence, conversation, purpose=awaiting.kind.value)
            )
            return
        awaiting.dispatched = [c for c in awaiting.dispatched if c in awaiting.results]
        self._dispatch_more(awaiting)

    def _config_failure(self, awaiting: Awaiting, error: str) -> None:
        """A worker said the task or the deployment is misconfigured: no attempt can succeed,
        so the task fails at once with the worker's own message (no retry, no review)."""
        self._event("config_error", fence=awaiting.fence.token(), error=error[:500])
        self._finish(TaskStatus.FAILED, f"configuration error: {error}")

    def _dead_letter(self, awaiting: Awaiting, error: str) -> None:
        self.effects.dead_letters.append(
            {
                "task_id": self.record.task_id,
                "fence": awaiting.fence.token(),
                "kind": awaiting.kind.value,
                "error": error[:2000],
                "at": datetime.fromtimestamp(self.now, UTC).isoformat(),
            }
        )
        if awaiting.kind is AwaitKind.PLAN:
            self.record.awaiting = None
            self._apply_plan(ReasonedMessage(fence=awaiting.fence, terminal_output=""))
            return
        self._attempt_failed(f"dispatch {awaiting.fence.token()} dead-lettered: {error}")

    # -- helpers --------------------------------------------------------------------------

    def _config(self) -> LoopConfig:
        record = self.record
        step = record.step().spec if record.steps else None
        return record.spec.loop_config(step)

    def _attempt_config(self) -> LoopConfig:
        """The step's config with the iteration limit of the current attempt, in the step's
        running iteration numbers (a worker compares it with the fence's iteration)."""
        config = self._config()
        if not self.record.steps:
            return config
        start = self.record.step().attempt_start_iteration
        return config.model_copy(update={"max_iterations": config.max_iterations + start})

    def _workspace(self) -> str:
        """The task's workspace, fixed the first time it is asked for (at the start) and kept
        in the record: a later decision taken under another ``ORGA_WORKSPACE_ROOT`` (or none)
        resumes in the same folder."""
        record = self.record
        if record.workspace is None:
            root = self.settings.workspace_root
            record.workspace = record.spec.workspace or task_workspace(root, record.task_id)
        return record.workspace

    def _fence(self) -> Fence:
        """A fence no earlier dispatch of this task had: ``attempt`` counts every dispatch."""
        record = self.record
        record.dispatches += 1
        return Fence(
            task_id=record.task_id,
            step_id=record.step().spec.id,
            iteration=record.iteration,
            attempt=record.dispatches,
            nonce=uuid.uuid4().hex[:12],
        )

    def _deadline_s(self) -> float:
        return self.settings.observation_deadline_s

    def _await(self, kind: AwaitKind, fence: Fence) -> Awaiting:
        awaiting = Awaiting(
            kind=kind, fence=fence, deadline=self.now + self._deadline_s(), dispatched_at=self.now
        )
        self.record.awaiting = awaiting
        return awaiting

    def _journal(self, event: LoopEvent) -> None:
        record = self.record
        step_id = record.step().spec.id if record.steps else None
        self.effects.journal.append(
            JournalEntry(
                sequence=record.journal_seq,
                timestamp=datetime.fromtimestamp(self.now, UTC),
                agent_id=record.spec.agent_id,
                iteration=record.iteration,
                event=event,
                task_id=record.task_id,
                step_id=step_id,
            )
        )
        record.journal_seq += 1

    def _event(self, event_name: str, **fields: str) -> None:
        self.effects.events.append(
            {"task_id": self.record.task_id, "event": event_name, "at": f"{self.now:.3f}", **fields}
        )

    def _ignored(self) -> Effects:
        self.effects.changed = False
        return self.effects

    def _done(self) -> Effects:
        record = self.record
        if self._tracker is not None:
            record.tracker = self._tracker.to_state()
        if self._detector is not None:
            record.detector = self._detector.to_state()
        record.updated_at = self.now
        record.applied += 1
        return self.effects


_TOOL_KINDS = (AwaitKind.TOOLS, AwaitKind.VERIFY, AwaitKind.PREHYDRATE)


def decide(machine: TaskMachine, step: Callable[[TaskMachine], Effects]) -> Effects:
    """Apply one input in the task's trace: an ``orga.decide`` span, and every dispatch it
    sends carries that span's ``traceparent`` (both drivers apply inputs through this)."""
    record = machine.record
    with phase_span(
        "decide",
        task_id=record.task_id,
        step_id=record.step().spec.id if record.steps else None,
        iteration=record.iteration,
        agent_id=record.spec.agent_id,
        parent=task_context(record.task_id),
    ) as span:
        effects = step(machine)
        effects.traced(traceparent(span))
    return effects


def _exit_code(value: str | None) -> int | None:
    """The integer exit code a tool reported, or None when absent or malformed."""
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def parse_plan(text: str) -> list[StepSpec]:
    """Steps from a model's plan (``{"steps": [...]}`` or a bare list); [] when unusable."""
    start, end = text.find("{"), text.rfind("}")
    candidates = [text]
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        items = data.get("steps") if isinstance(data, dict) else data
        if not isinstance(items, list) or not items:
            continue
        try:
            steps = [StepSpec.model_validate(item) for item in items[:20]]
        except (ValueError, OverflowError, RecursionError):
            continue
        if len({s.id for s in steps}) == len(steps):
            return steps
    return []
