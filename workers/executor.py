"""The Act phase: run the approved tool calls of one iteration (Symbiont §5, fixed).

``ToolExecutor.execute`` runs the calls concurrently, at most ``config.max_concurrent_tools``
at a time, each under ``min(config.tool_timeout, context.timeout_s)``, and returns their
observations **in input order**, each carrying its ``call_id``, the tool's ``metadata`` and
``metadata.tool_name``. Failures go through the recovery strategies of :mod:`workers.recovery`.

Per call:

* unknown tool: an error observation listing the known tools (``error_type="unknown_tool"``);
* arguments that are not a JSON object: an error observation (``error_type="invalid_arguments"``);
* the call's circuit breaker is checked right before the tool runs (so a breaker tripped by an
  earlier call of the same batch already applies). It is the task's own breaker of the tool
  (``context.task_id``) unless the tool's breaker scope is ``deployment`` (``web_fetch``: see
  :mod:`workers.circuit_breaker`); an open circuit gives an error observation
  (``error_type="circuit_open"``) and, unlike Symbiont, does **not** count as another failure:
  the tool did not run, and counting rejections would keep the breaker open forever;
* the tool raising (``error_type="exception"``) or timing out (``error_type="timeout"``,
  ``Tool 'x' timed out after 30s``) is a failure recorded in its breaker; anything else is a
  success. An error *output* (``ToolOutput.is_error``: a missing file, a non-zero exit code) is
  an answer for the model and a success for the breaker, unless the executor is built with
  ``treat_error_outputs_as_failures=True``. Tools signal an unhealthy endpoint by raising.
* every success whose output is not an error is stored in the result cache, when one is given
  and the tool's recovery strategy is CachedResult (the only reader), under the call's scope
  (its task and workspace, :func:`workers.result_cache.call_scope`): a task never gets a result
  another task or workspace produced.

Exceptions of the infrastructure (the breaker store or the cache unreachable) propagate: the
calls still running are cancelled and the caller decides (a Celery task retries).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from shared.actions import Observation, ToolCallAction
from shared.aio import finish_uncancelled
from shared.durations import format_duration
from shared.events import RecoveryTriggered
from shared.inference import ToolDefinition
from shared.loop_types import CachedResult, LoopConfig, RecoveryStrategy
from workers.applied_calls import AppliedCalls, applies_once, call_key
from workers.circuit_breaker import (
    Breaker,
    CircuitBreakerRegistry,
    CircuitOpenError,
    breaker_scope_of,
)
from workers.recovery import (
    Attempt,
    CallOutcome,
    DeadLetterSink,
    EscalationSignal,
    FailedCall,
    InMemoryDeadLetterSink,
    RecoveryEnvironment,
    RecoveryLedger,
    RecoveryOutcome,
    apply_recovery,
    resolve_strategy,
)
from workers.result_cache import ResultCache, call_scope
from workers.tools.base import Tool, ToolContext, ToolOutput

__all__ = ["EventCallback", "ExecutionReport", "ToolExecutor", "ToolLookup"]

logger = logging.getLogger(__name__)

EventCallback = Callable[[RecoveryTriggered], Awaitable[None] | None]
"""Receives each ``RecoveryTriggered`` as it happens; may be sync or async."""

Sleep = Callable[[float], Awaitable[None]]

_T = TypeVar("_T")


class ToolLookup(Protocol):
    """The tools by name: a ``Mapping[str, Tool]`` or a registry with ``get`` and ``__iter__``."""

    def get(self, name: str, /) -> Tool | None:
        """The tool called ``name``, or None."""
        ...

    def __iter__(self) -> Iterator[str]:
        """The names of the tools."""
        ...


class ExecutionReport(BaseModel):
    """What the Act phase produced: observations in input order, recovery events, escalations."""

    model_config = ConfigDict(frozen=True)

    observations: tuple[Observation, ...] = ()
    events: tuple[RecoveryTriggered, ...] = ()
    escalations: tuple[EscalationSignal, ...] = ()

    @property
    def escalation(self) -> EscalationSignal | None:
        """The first escalation of the batch, or None: the caller turns it into a review item."""
        return self.escalations[0] if self.escalations else None


class ToolExecutor:
    """Runs tool calls with bounded concurrency, timeouts, circuit breakers and recovery.

    ``ledger`` counts LlmRecovery attempts for the runs that do not pass their own to
    ``execute``: build one executor per run, or pass one ledger per run.
    ``dead_letter`` defaults to an :class:`InMemoryDeadLetterSink` (``executor.dead_letter``).
    Raises ConfigError when a tool declares a ``breaker_scope`` other than task or deployment.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool] | ToolLookup,
        breakers: CircuitBreakerRegistry,
        cache: ResultCache | None = None,
        sleep: Sleep = asyncio.sleep,
        dead_letter: DeadLetterSink | None = None,
        *,
        treat_error_outputs_as_failures: bool = False,
        ledger: RecoveryLedger | None = None,
        applied: AppliedCalls | None = None,
    ) -> None:
        self.tools = tools
        self.breakers = breakers
        self.cache = cache
        self.sleep = sleep
        self.dead_letter: DeadLetterSink = (
            dead_letter if dead_letter is not None else InMemoryDeadLetterSink()
        )
        self.treat_error_outputs_as_failures = treat_error_outputs_as_failures
        self.ledger = ledger if ledger is not None else RecoveryLedger()
        self.applied = applied
        """Where a tool that ``applies_once`` keeps its results by idempotency key (None: such
        tools run on every delivery)."""
        for name in tools:
            breaker_scope_of(name, tools.get(name))

    def breaker(self, tool_name: str, context: ToolContext) -> Breaker:
        """The circuit breaker a call of ``tool_name`` in ``context`` goes through."""
        declared = breaker_scope_of(tool_name, self.tools.get(tool_name))
        return self.breakers.breaker(tool_name, context.task_id, declared)

    def tool_definitions(self) -> list[ToolDefinition]:
        """The definitions of every tool, for the model."""
        return [
            tool.definition for name in self.tools if (tool := self.tools.get(name)) is not None
        ]

    async def execute(
        self,
        actions: Sequence[ToolCallAction],
        config: LoopConfig,
        context: ToolContext,
        recovery: RecoveryStrategy | None = None,
        on_event: EventCallback | None = None,
        *,
        tool_recovery: Mapping[str, RecoveryStrategy] | None = None,
        iteration: int = 0,
        ledger: RecoveryLedger | None = None,
    ) -> ExecutionReport:
        """Run ``actions`` and report their observations in input order.

        ``recovery`` overrides ``config.default_recovery`` for this batch; ``tool_recovery``
        overrides both for the tools it names. ``iteration`` goes into the events; ``ledger``
        (default: the executor's) counts LlmRecovery attempts across iterations of a run.
        """
        if not actions:
            return ExecutionReport()
        batch = _Batch(
            self,
            config,
            context,
            recovery=recovery,
            tool_recovery=tool_recovery,
            iteration=iteration,
            ledger=ledger if ledger is not None else self.ledger,
            on_event=on_event,
        )
        outcomes = await _run_all([batch.run_call(action) for action in actions])
        return ExecutionReport(
            observations=tuple(outcome.observation for outcome in outcomes),
            events=tuple(batch.events),
            escalations=tuple(o.escalation for o in outcomes if o.escalation is not None),
        )


async def _run_all(coroutines: list[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Await all, in order; on the first exception cancel the others and re-raise it."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class _Batch:
    """The state of one ``execute`` call: its limits, its events and its recovery settings."""

    def __init__(
        self,
        executor: ToolExecutor,
        config: LoopConfig,
        context: ToolContext,
        *,
        recovery: RecoveryStrategy | None,
        tool_recovery: Mapping[str, RecoveryStrategy] | None,
        iteration: int,
        ledger: RecoveryLedger,
        on_event: EventCallback | None,
    ) -> None:
        self.executor = executor
        self.config = config
        self.context = context
        self.recovery = recovery
        self.tool_recovery = tool_recovery
        self.iteration = iteration
        self.ledger = ledger
        self.timeout_s = min(config.tool_timeout.total_seconds(), context.timeout_s)
        self.semaphore = asyncio.Semaphore(config.max_concurrent_tools)
        self.events: list[RecoveryTriggered] = []
        self.on_event = on_event

    def _environment(self) -> RecoveryEnvironment:
        """What a recovery may do, built for a failed call only: held by the batch, its bound
        methods would make a reference cycle of every batch, freed by the garbage collector
        rather than when the batch ends (docs/performance.md, "no reference cycle per call")."""
        executor = self.executor
        return RecoveryEnvironment(
            invoke=self.invoke,
            sleep=executor.sleep,
            emit=self.emit,
            dead_letter=executor.dead_letter,
            ledger=self.ledger,
            cache=executor.cache,
        )

    async def run_call(self, action: ToolCallAction) -> RecoveryOutcome:
        """One call: validate, run, and recover from a failure."""
        if self.executor.tools.get(action.name) is None:
            return RecoveryOutcome(self._unknown_tool(action.name, action.call_id))
        try:
            arguments = action.parsed_arguments()
        except ValueError as error:
            return RecoveryOutcome(_invalid_arguments(action, error))
        attempt = await self.invoke(action.name, action.call_id, arguments)
        if not attempt.recoverable:
            return RecoveryOutcome(attempt.observation)
        strategy = resolve_strategy(action.name, self.config, self.recovery, self.tool_recovery)
        failed = FailedCall(action, arguments, attempt, self.iteration, self.context)
        return await apply_recovery(strategy, failed, self._environment())

    async def invoke(self, tool_name: str, call_id: str, arguments: Mapping[str, Any]) -> Attempt:
        """One attempt: breaker check, the tool under its timeout, then the records."""
        tool = self.executor.tools.get(tool_name)
        if tool is None:
            return Attempt(self._unknown_tool(tool_name, call_id), CallOutcome.INVALID)
        breaker = self.executor.breaker(tool_name, self.context)
        async with self.semaphore:
            try:
                await breaker.check()
            except CircuitOpenError as error:
                return Attempt(_circuit_open(tool_name, call_id, error), CallOutcome.REJECTED)
            attempt = await self._run_tool(tool_name, tool, call_id, arguments)
        await self._record(breaker, tool_name, arguments, attempt)
        return attempt

    async def emit(self, event: RecoveryTriggered) -> None:
        """Keep the event for the report and hand it to the callback."""
        self.events.append(event)
        logger.info(
            "recovery.triggered",
            extra={"tool": event.tool_name, "strategy": event.strategy.strategy},
        )
        if self.on_event is not None:
            result = self.on_event(event)
            if inspect.isawaitable(result):
                await result

    async def _run_tool(
        self, tool_name: str, tool: Tool, call_id: str, arguments: Mapping[str, Any]
    ) -> Attempt:
        """Run the tool; one that ``applies_once`` runs once per idempotency key."""
        context = self.context
        if context.idempotency_key is not None:
            full = call_key(context.idempotency_key, tool_name, arguments)
            context = context.model_copy(update={"idempotency_key": full})
        key, applied = context.idempotency_key, self.executor.applied
        if key is None or applied is None or not applies_once(tool):
            return await self._run_in(tool_name, tool, call_id, arguments, context)
        kept = await applied.get(key)
        if kept is not None:
            replayed = kept.model_copy(update={"metadata": {**kept.metadata, "replayed": "true"}})
            return self._answered(tool_name, call_id, replayed)
        attempt = await self._run_in(tool_name, tool, call_id, arguments, context)
        if attempt.outcome is CallOutcome.SUCCEEDED and not attempt.observation.is_error:
            # The tool applied: its record is written whole even when the call is cancelled
            # now (a cold shutdown), so a redelivery replays it instead of applying it again.
            await finish_uncancelled(applied.put(key, _output_of(attempt.observation)))
        return attempt

    async def _run_in(
        self,
        tool_name: str,
        tool: Tool,
        call_id: str,
        arguments: Mapping[str, Any],
        context: ToolContext,
    ) -> Attempt:
        scope = asyncio.timeout(self.timeout_s)
        try:
            async with scope:
                output = await tool.run(dict(arguments), context)
        except TimeoutError as error:
            if scope.expired():
                return Attempt(_timed_out(tool_name, call_id, self.timeout_s), CallOutcome.FAILED)
            return Attempt(_raised(tool_name, call_id, error), CallOutcome.FAILED)
        except Exception as error:
            return Attempt(_raised(tool_name, call_id, error), CallOutcome.FAILED)
        return self._answered(tool_name, call_id, output)

    def _answered(self, tool_name: str, call_id: str, output: ToolOutput) -> Attempt:
        metadata = {**output.metadata, "tool_name": tool_name}
        observation = Observation(
            source=tool_name,
            content=output.content,
            is_error=output.is_error,
            call_id=call_id,
            metadata=metadata,
        )
        if output.is_error and self.executor.treat_error_outputs_as_failures:
            metadata.setdefault("error_type", "tool_error")
            return Attempt(
                observation.model_copy(update={"metadata": metadata}), CallOutcome.FAILED
            )
        return Attempt(observation, CallOutcome.SUCCEEDED)

    async def _record(
        self, breaker: Breaker, tool_name: str, arguments: Mapping[str, Any], attempt: Attempt
    ) -> None:
        if attempt.outcome is CallOutcome.FAILED:
            await breaker.record_failure()
            return
        await breaker.record_success()
        self.ledger.reset(tool_name)
        observation, cache = attempt.observation, self.executor.cache
        if cache is not None and not observation.is_error and self._reads_cache(tool_name):
            await cache.put(
                tool_name,
                arguments,
                observation.content,
                observation.metadata,
                scope=call_scope(self.context.task_id, self.context.workspace),
            )

    def _reads_cache(self, tool_name: str) -> bool:
        """Only a tool whose recovery is CachedResult ever reads its cached results."""
        strategy = resolve_strategy(tool_name, self.config, self.recovery, self.tool_recovery)
        return isinstance(strategy, CachedResult)

    def _unknown_tool(self, tool_name: str, call_id: str) -> Observation:
        known = ", ".join(sorted(self.executor.tools)) or "(none)"
        content = f"Unknown tool {tool_name!r}; known tools: {known}"
        return _error(tool_name, call_id, content, "unknown_tool")


def _output_of(observation: Observation) -> ToolOutput:
    """What a tool returned, from its observation (without the executor's ``tool_name``)."""
    metadata = {k: v for k, v in observation.metadata.items() if k != "tool_name"}
    return ToolOutput(content=observation.content, is_error=observation.is_error, metadata=metadata)


def _error(tool_name: str, call_id: str, content: str, error_type: str) -> Observation:
    return Observation(
        source=tool_name,
        content=content,
        is_error=True,
        call_id=call_id,
        metadata={"tool_name": tool_name, "error_type": error_type},
    )


def _invalid_arguments(action: ToolCallAction, error: ValueError) -> Observation:
    content = (
        f"Invalid arguments for tool {action.name!r}: {error}; send the arguments as a JSON object"
    )
    return _error(action.name, action.call_id, content, "invalid_arguments")


def _circuit_open(tool_name: str, call_id: str, error: CircuitOpenError) -> Observation:
    content = (
        f"Tool circuit is open: {error}. "
        "The tool endpoint has been failing and is temporarily disabled."
    )
    return _error(tool_name, call_id, content, "circuit_open")


def _timed_out(tool_name: str, call_id: str, timeout_s: float) -> Observation:
    logger.warning("tool.timed_out", extra={"tool": tool_name, "call_id": call_id})
    after = format_duration(timedelta(seconds=timeout_s))
    return _error(tool_name, call_id, f"Tool {tool_name!r} timed out after {after}", "timeout")


def _raised(tool_name: str, call_id: str, error: BaseException) -> Observation:
    logger.warning(
        "tool.raised", extra={"tool": tool_name, "call_id": call_id, "error": repr(error)}
    )
    content = f"Tool {tool_name!r} failed: {type(error).__name__}: {error}"
    return _error(tool_name, call_id, content, "exception")
