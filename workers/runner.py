"""The in-process ORGA loop: ``ReasoningLoopRunner(...).run(agent_id, conversation, config)``.

Order of operations (Symbiont §1.2/§1.3, with its bugs fixed):

1. tool definitions: the caller's, else the executor's; then the knowledge tools are appended
   (Symbiont appends them first, so the executor's tools were never populated);
2. the tool profile filters them;
3. ``Started`` is journaled;
4. under ``config.timeout``: pre-hydration, *through the schema check and the gate*; then
   Reason, Gate, Act, Observe until a final answer, a limit, or a stagnation verdict that ends
   the run;
5. every termination, timeouts and limits included, journals ``Terminated`` and returns the
   partial output, usage, conversation and milestones.

The stagnation detector is consulted after each Observe: NUDGE and REPLAN texts are added to the
conversation for the model; ASK_HUMAN ends the run as ``escalated`` and ABORT as ``stagnated``,
both keeping the milestones reached.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from shared.actions import Observation, ProposedAction, ToolCallAction
from shared.context_manager import ContextManager, DefaultContextManager
from shared.conversation import Conversation, ConversationMessage
from shared.events import (
    JournalEntry,
    LoopEvent,
    ObservationsCollected,
    PolicyEvaluated,
    ReasoningComplete,
    StagnationDetected,
    Started,
    Terminated,
    ToolsDispatched,
)
from shared.inference import ToolDefinition
from shared.journal import BufferedJournal, JournalWriter
from shared.loop_types import (
    LoopConfig,
    LoopResult,
    LoopState,
    RecoveryStrategy,
    TerminationKind,
    TerminationReason,
)
from shared.pre_hydration import PreHydrationEngine, ResolutionResult
from shared.stagnation import (
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    StagnationVerdict,
    ToolEvent,
)
from shared.tracing import phase_span
from workers.circuit_breaker import CircuitBreakerRegistry, InMemoryBreakerStore
from workers.executor import ToolExecutor
from workers.gates.base import GateContext, ReasoningPolicyGate
from workers.gates.default import DefaultPolicyGate
from workers.gates.schema import denial_message, schema_failure_message, validate_tool_arguments
from workers.handlers import resolution_arguments
from workers.knowledge import KnowledgeBridge
from workers.phases import (
    ActionDispatcher,
    DispatchReport,
    EscalationRequest,
    LoopTermination,
    Observing,
    PolicyCheck,
    Reasoning,
    ToolDispatching,
)
from workers.providers.base import InferenceProvider
from workers.result_cache import InMemoryResultCache
from workers.tools.base import ToolContext
from workers.tools.command import RunCommandTool
from workers.tools.registry import ToolRegistry, default_registry

log = logging.getLogger("orga.runner")

__all__ = [
    "CommandMilestones",
    "ExecutorDispatcher",
    "KnowledgeAwareDispatcher",
    "MilestoneProbe",
    "ReasoningLoopRunner",
    "local_dispatcher",
]


class MilestoneProbe(Protocol):
    """Checks, after each Observe, which verified milestones the run has newly reached."""

    async def reached(self, state: LoopState, observations: Sequence[Observation]) -> list[str]:
        """Names of milestones reached since the last call (empty when none)."""
        ...


@dataclass(slots=True)
class ExecutorDispatcher:
    """The Act phase on a :class:`ToolExecutor`: bounded concurrency, breakers, recovery."""

    executor: ToolExecutor
    tool_recovery: Mapping[str, RecoveryStrategy] | None = None

    def tool_definitions(self) -> list[ToolDefinition]:
        """The executor's tools."""
        return self.executor.tool_definitions()

    async def dispatch(
        self,
        actions: Sequence[ToolCallAction],
        config: LoopConfig,
        context: ToolContext,
        iteration: int,
    ) -> DispatchReport:
        """Run ``actions``; an Escalate recovery becomes an escalation request."""
        report = await self.executor.execute(
            actions, config, context, tool_recovery=self.tool_recovery, iteration=iteration
        )
        signal = report.escalation
        escalation = (
            EscalationRequest(
                queue=signal.queue,
                reason=f"{signal.tool_name}: {signal.error}",
                tool_name=signal.tool_name,
            )
            if signal is not None
            else None
        )
        return DispatchReport(list(report.observations), list(report.events), escalation)


def local_dispatcher(
    registry: ToolRegistry | None = None,
    tool_recovery: Mapping[str, RecoveryStrategy] | None = None,
) -> ExecutorDispatcher:
    """The built-in tools with in-memory breakers and cache, for a single process."""
    tools = registry if registry is not None else default_registry(include_entry_points=True)
    executor = ToolExecutor(
        {t.definition.name: t for t in tools},
        CircuitBreakerRegistry(InMemoryBreakerStore()),
        cache=InMemoryResultCache(),
    )
    return ExecutorDispatcher(executor, tool_recovery)


@dataclass(slots=True)
class CommandMilestones:
    """Verified milestones from shell checks: a milestone is reached once its command exits 0.

    Each check runs (in the workspace, through ``run_command``) after every Observe until it
    passes; a passing check is never run again.
    """

    checks: Mapping[str, str]
    workspace: Path
    timeout_s: float = 60.0
    _passed: set[str] = field(default_factory=set)

    async def reached(self, state: LoopState, observations: Sequence[Observation]) -> list[str]:
        """Names of the checks that pass now and did not before."""
        tool = RunCommandTool()
        context = ToolContext(workspace=self.workspace, timeout_s=self.timeout_s)
        reached = []
        for name, command in self.checks.items():
            if name in self._passed:
                continue
            output = await tool.run({"command": command}, context)
            if output.metadata.get("exit_code") == "0":
                self._passed.add(name)
                reached.append(name)
        return reached


@dataclass(slots=True)
class KnowledgeAwareDispatcher:
    """Routes ``recall_knowledge``/``store_knowledge`` to the bridge, the rest to ``inner``.

    Unlike Symbiont's wrapper, knowledge observations carry the tool name as their source and
    the call id as their call id, and they keep the input order of the batch.
    """

    inner: ActionDispatcher
    bridge: KnowledgeBridge
    agent_id: str

    def tool_definitions(self) -> list[ToolDefinition]:
        """The inner dispatcher's tools (the runner appends the knowledge tools itself)."""
        return self.inner.tool_definitions()

    async def dispatch(
        self,
        actions: Sequence[ToolCallAction],
        config: LoopConfig,
        context: ToolContext,
        iteration: int,
    ) -> DispatchReport:
        """Answer knowledge calls from the bridge and run the others in one batch."""
        others = [a for a in actions if not self.bridge.is_knowledge_tool(a.name)]
        report = await self.inner.dispatch(others, config, context, iteration)
        by_id = {o.call_id: o for o in report.observations}
        for action in actions:
            if self.bridge.is_knowledge_tool(action.name):
                by_id[action.call_id] = await self._knowledge(action)
        ordered = [by_id[a.call_id] for a in actions if a.call_id in by_id]
        return DispatchReport(ordered, report.recovery_events, report.escalation)

    async def _knowledge(self, action: ToolCallAction) -> Observation:
        try:
            arguments = action.parsed_arguments()
            content = await self.bridge.handle_tool_call(self.agent_id, action.name, arguments)
        except Exception as exc:
            return Observation.tool_error(action.name, str(exc)).with_call_id(action.call_id)
        observation = Observation.tool_result(action.name, content).with_call_id(action.call_id)
        return observation.with_metadata(kind="read", tool_name=action.name)


@dataclass(slots=True)
class _GatedResolver:
    """Pre-hydration resolutions as tool calls that pass the schema check and the gate."""

    runner: ReasoningLoopRunner
    config: LoopConfig
    gate_context: GateContext
    tool_context: ToolContext
    definitions: list[ToolDefinition]

    async def resolve(
        self, call_id: str, tool_name: str, arguments: dict[str, Any]
    ) -> ResolutionResult:
        """Validate, gate and run one resolution."""
        arguments = resolution_arguments(self.definitions, tool_name, arguments)
        action = ToolCallAction(call_id=call_id, name=tool_name, arguments=json.dumps(arguments))
        failure = validate_tool_arguments(action, self.definitions)
        if failure is not None:
            return ResolutionResult(
                call_id=call_id, content=schema_failure_message(failure), is_error=True
            )
        decision = await self.runner.gate.evaluate_action(action, self.gate_context)
        if decision.decision == "deny":
            return ResolutionResult(
                call_id=call_id, content=denial_message(decision.reason), is_error=True
            )
        if decision.decision == "modify" and isinstance(decision.action, ToolCallAction):
            action = decision.action.model_copy(update={"call_id": call_id})
        report = await self.runner.executor.dispatch([action], self.config, self.tool_context, 0)
        observation = report.observations[0]
        return ResolutionResult(
            call_id=call_id, content=observation.content, is_error=observation.is_error
        )


@dataclass
class ReasoningLoopRunner:
    """Runs the ORGA loop in one process; the Celery tasks compose the same phases."""

    provider: InferenceProvider
    executor: ActionDispatcher
    gate: ReasoningPolicyGate = field(default_factory=DefaultPolicyGate)
    context_manager: ContextManager = field(default_factory=DefaultContextManager)
    journal: JournalWriter = field(default_factory=BufferedJournal)
    knowledge: KnowledgeBridge | None = None
    workspace: Path | None = None
    milestone_probe: MilestoneProbe | None = None
    stagnation: StagnationConfig | None = None
    task_id: str | None = None
    step_id: str | None = None

    async def run(
        self, agent_id: str, conversation: Conversation, config: LoopConfig
    ) -> LoopResult:
        """Run until a final answer, a limit, the timeout, or a stagnation verdict.

        The system prompt and the task (the opening system and user messages) are pinned, so
        no context strategy drops them, unless the caller pinned messages itself.
        """
        conversation.pin_task()
        config = self._prepare_config(config)
        state = LoopState(agent_id=agent_id, conversation=conversation)
        await self.emit(state, Started(agent_id=agent_id, config=config))
        run = _Run(self, state, config)
        try:
            async with asyncio.timeout(config.timeout.total_seconds()):
                result = await run.execute()
        except TimeoutError:
            result = run.stopped(
                TerminationReason(
                    kind=TerminationKind.TIMEOUT,
                    message=f"the run exceeded its timeout of {config.timeout.total_seconds()}s",
                )
            )
        await self.emit(
            state,
            Terminated(
                reason=result.termination_reason,
                iterations=result.iterations,
                total_usage=result.total_usage,
                duration=result.duration,
            ),
            iteration=result.iterations,
        )
        return result

    def _prepare_config(self, config: LoopConfig) -> LoopConfig:
        tools = list(config.tool_definitions) or self.executor.tool_definitions()
        if self.knowledge is not None:
            known = {t.name for t in tools}
            tools += [t for t in self.knowledge.tool_definitions() if t.name not in known]
        if config.tool_profile is not None:
            tools = config.tool_profile.filter_tools(tools)
        return config.model_copy(update={"tool_definitions": tools})

    def dispatcher(self, agent_id: str) -> ActionDispatcher:
        """The executor, wrapped by the knowledge bridge when there is one."""
        if self.knowledge is None:
            return self.executor
        return KnowledgeAwareDispatcher(self.executor, self.knowledge, agent_id)

    def gate_context(self, state: LoopState, config: LoopConfig) -> GateContext:
        """What the gate sees besides the action."""
        return GateContext(
            agent_id=state.agent_id,
            workspace=self.workspace,
            task_id=self.task_id,
            step_id=self.step_id,
            iteration=state.iteration,
            delegation_depth=config.delegation_depth,
        )

    def tool_context(self, state: LoopState, config: LoopConfig) -> ToolContext:
        """Where and under which limits tools run."""
        return ToolContext(
            workspace=self.workspace or Path.cwd(),
            timeout_s=config.tool_timeout.total_seconds(),
            agent_id=state.agent_id,
            task_id=self.task_id,
        )

    async def emit(self, state: LoopState, event: LoopEvent, iteration: int | None = None) -> None:
        entry = JournalEntry(
            sequence=await self.journal.next_sequence(),
            agent_id=state.agent_id,
            iteration=state.iteration if iteration is None else iteration,
            event=event,
            task_id=self.task_id,
            step_id=self.step_id,
        )
        await self.journal.append(entry)


@dataclass
class _Run:
    """One run's moving parts: the state, the detector, the phases in order."""

    runner: ReasoningLoopRunner
    state: LoopState
    config: LoopConfig
    detector: StagnationDetector | None = None

    def __post_init__(self) -> None:
        settings = self.config.stagnation or self.runner.stagnation
        if settings is not None:
            self.detector = StagnationDetector(settings)

    async def execute(self) -> LoopResult:
        await self._pre_hydrate()
        phase = Reasoning(self.state, self.config)
        while True:
            try:
                outcome = await self._iteration(phase)
            except LoopTermination as stop:
                return self.stopped(stop.reason)
            if isinstance(outcome, LoopResult):
                await self._persist_learnings()
                return outcome
            phase = outcome

    def stopped(self, reason: TerminationReason) -> LoopResult:
        """The result of a run that ended without a final answer: what it had so far."""
        last = self.state.conversation.last_assistant_message()
        return LoopResult(
            output=last.content if last is not None else "",
            iterations=self.state.iteration,
            total_usage=self.state.total_usage,
            termination_reason=reason,
            duration=self.state.elapsed(),
            conversation=self.state.conversation,
            milestones=list(self.state.milestones),
        )

    async def _iteration(self, phase: Reasoning) -> Reasoning | LoopResult:
        if self.runner.knowledge is not None:
            inject = self.runner.knowledge.inject_context(
                self.state.agent_id, self.state.conversation
            )
            await _best_effort(inject)
        checking = await self._reason(phase)
        dispatching = await self._gate(checking)
        observing = await self._act(dispatching)
        with self._span("orga.observe"):
            return await self._observe(observing, actions=checking.proposed_actions)

    async def _reason(self, phase: Reasoning) -> PolicyCheck:
        state = self.state
        before = state.total_usage
        with self._span("orga.reason"):
            checking = await phase.produce_output(self.runner.provider, self.runner.context_manager)
        if checking.compacted and self.detector is not None:
            self.detector.compacted()
        usage = state.total_usage.delta_since(before)
        event = ReasoningComplete(
            iteration=state.iteration, actions=checking.proposed_actions, usage=usage
        )
        await self.runner.emit(state, event)
        return checking

    async def _gate(self, checking: PolicyCheck) -> ToolDispatching:
        state = self.state
        with self._span("orga.gate"):
            context = self.runner.gate_context(state, self.config)
            dispatching = await checking.check_policy(self.runner.gate, context)
        count, denied = dispatching.policy_summary()
        event = PolicyEvaluated(iteration=state.iteration, action_count=count, denied_count=denied)
        await self.runner.emit(state, event)
        return dispatching

    async def _act(self, dispatching: ToolDispatching) -> Observing:
        state, runner = self.state, self.runner
        started = time.monotonic()
        with self._span("orga.act"):
            observing = await dispatching.dispatch_tools(
                runner.dispatcher(state.agent_id), runner.tool_context(state, self.config)
            )
        elapsed = timedelta(seconds=time.monotonic() - started)
        for event in observing.report.recovery_events:
            await runner.emit(state, event)
        count = observing.observation_count()
        await runner.emit(
            state, ToolsDispatched(iteration=state.iteration, tool_count=count, duration=elapsed)
        )
        await runner.emit(
            state, ObservationsCollected(iteration=state.iteration, observation_count=count)
        )
        return observing

    async def _observe(
        self, observing: Observing, actions: Sequence[Any]
    ) -> Reasoning | LoopResult:
        outcome = observing.observe_results()
        if isinstance(outcome, LoopResult):
            return outcome
        if observing.report.escalation is not None:
            escalation = observing.report.escalation
            raise LoopTermination(
                TerminationReason(
                    kind=TerminationKind.ESCALATED,
                    message=f"escalated to {escalation.queue!r}: {escalation.reason}",
                )
            )
        await self._check_milestones(observing.observations)
        verdict = self._consult_detector(observing.observations, actions)
        if verdict is not None:
            await self._apply_verdict(verdict)
        return outcome

    async def _check_milestones(self, observations: Sequence[Observation]) -> None:
        probe = self.runner.milestone_probe
        if probe is None:
            return
        for name in await probe.reached(self.state, observations):
            if name not in self.state.milestones:
                self.state.milestones.append(name)
                if self.detector is not None:
                    self.detector.milestone(name)

    def _consult_detector(
        self, observations: Sequence[Observation], actions: Sequence[ProposedAction]
    ) -> StagnationVerdict | None:
        if self.detector is None:
            return None
        calls = {a.call_id: a for a in actions if isinstance(a, ToolCallAction)}
        events = [
            ToolEvent.from_observation(calls[o.call_id], o, strict=False)
            for o in observations
            if o.call_id is not None and o.call_id in calls
        ]
        return self.detector.observe_batch(events) if events else None

    async def _apply_verdict(self, verdict: StagnationVerdict) -> None:
        if verdict.level is StagnationLevel.NONE:
            return
        if verdict.escalated:
            await self.runner.emit(self.state, StagnationDetected.from_verdict(verdict))
        if verdict.level in (StagnationLevel.NUDGE, StagnationLevel.REPLAN):
            if verdict.escalated:
                self.state.conversation.push(ConversationMessage.user(verdict.message))
            return
        kind = (
            TerminationKind.ESCALATED
            if verdict.level is StagnationLevel.ASK_HUMAN
            else TerminationKind.STAGNATED
        )
        raise LoopTermination(TerminationReason(kind=kind, message=verdict.message))

    async def _pre_hydrate(self) -> None:
        settings = self.config.pre_hydration
        last_user = self.state.conversation.last_user_message()
        if settings is None or last_user is None or not last_user.content.strip():
            return
        engine = PreHydrationEngine(settings)
        references = engine.extract_references(last_user.content)
        if not references:
            return
        resolver = _GatedResolver(
            runner=self.runner,
            config=self.config,
            gate_context=self.runner.gate_context(self.state, self.config),
            tool_context=self.runner.tool_context(self.state, self.config),
            definitions=self.runner.executor.tool_definitions(),
        )
        with self._span("orga.pre_hydrate"):
            hydrated = await engine.hydrate(references, resolver)
        text = engine.format_context(hydrated)
        if text:
            self.state.conversation.push(ConversationMessage.system(text))
        await self.runner.emit(self.state, hydrated.completion_event())

    async def _persist_learnings(self) -> None:
        knowledge = self.runner.knowledge
        if knowledge is not None:
            await _best_effort(
                knowledge.persist_learnings(self.state.agent_id, self.state.conversation)
            )

    def _span(self, phase: str) -> Any:
        return phase_span(
            phase,
            task_id=self.runner.task_id,
            step_id=self.runner.step_id,
            iteration=self.state.iteration,
            agent_id=self.state.agent_id,
        )


async def _best_effort(awaitable: Any) -> None:
    """Knowledge injection and persistence never stop the loop: the failure is logged."""
    try:
        await awaitable
    except Exception:
        log.warning("knowledge.failed", exc_info=True)
