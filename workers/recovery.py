"""Recovery strategies applied by the executor when a tool call fails (Symbiont §2, implemented).

A call *fails* when the tool raises, times out, or (only when the executor is told so) returns
an error output; it is *rejected* when its circuit is open. Both trigger recovery. An unknown
tool or arguments that are not a JSON object are the model's mistake: the error goes straight
back to the model. Policy denials never reach the executor.

Which strategy: a per-tool override, else the per-call ``recovery`` given to the executor, else
``LoopConfig.default_recovery`` (:func:`resolve_strategy`).

=============  =========================================================================
Retry          retry the same tool up to ``max_attempts`` times, sleeping
               ``base_delay * 2**attempt`` before each (0.5 s, 1 s, ...); stops at an open
               circuit (and never retries a rejected call). One ``RecoveryTriggered`` before
               each retry; ``metadata.attempts`` counts the runs when there was a retry.
Fallback       try ``alternatives`` in order with the same arguments; the first that answers
               is the observation (``metadata.answered_by``, and a first line saying which
               tool answered). One event before each alternative.
CachedResult   answer with the last successful result of the same tool and canonical
               arguments, in the same task and workspace, no older than ``max_staleness``
               (``metadata.cache_age_s``); else
               the error, saying no fresh result was cached. One event.
LlmRecovery    the error goes back to the model (``metadata.recovery="llm"``), at most
               ``max_recovery_attempts`` times per tool in a run (a success of the tool
               resets its count, see :class:`RecoveryLedger`). Past that it **escalates**
               (``Escalate()`` defaults): the model already had its chances, and a human is
               better placed than a dead-letter stream that would let the run wander on
               without the tool. One event, with the Escalate strategy when it escalates.
Escalate       the error observation plus an :class:`EscalationSignal` in the report, which
               the caller turns into a review item. One event.
DeadLetter     the failed call goes to a :class:`DeadLetterSink`; the observation says so.
               One event.
=============  =========================================================================

Every event is a ``RecoveryTriggered(iteration, tool_name, strategy, error)`` whose ``error``
is the failure that caused the recovery action.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from shared.actions import Observation, ToolCallAction
from shared.durations import format_duration
from shared.events import RecoveryTriggered
from shared.loop_types import (
    CachedResult,
    DeadLetter,
    Escalate,
    Fallback,
    LlmRecovery,
    LoopConfig,
    RecoveryStrategy,
    Retry,
)
from workers.result_cache import ResultCache, call_scope
from workers.tools.base import ToolContext

__all__ = [
    "Attempt",
    "CallOutcome",
    "DeadLetterRecord",
    "DeadLetterSink",
    "EscalationSignal",
    "FailedCall",
    "InMemoryDeadLetterSink",
    "RecoveryEnvironment",
    "RecoveryLedger",
    "RecoveryOutcome",
    "ToolInvoker",
    "apply_recovery",
    "resolve_strategy",
]


class CallOutcome(StrEnum):
    """How one attempt at a tool call ended."""

    SUCCEEDED = "succeeded"
    """The tool answered (an error output included, unless configured as a failure)."""
    FAILED = "failed"
    """The tool raised or timed out: counts against its breaker, triggers recovery."""
    REJECTED = "rejected"
    """The circuit is open: the tool did not run; triggers recovery."""
    INVALID = "invalid"
    """Unknown tool or bad arguments: the model's mistake, no recovery."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt at a call: the observation and how it ended."""

    observation: Observation
    outcome: CallOutcome

    @property
    def recoverable(self) -> bool:
        """Whether a recovery strategy applies (failed or rejected)."""
        return self.outcome in (CallOutcome.FAILED, CallOutcome.REJECTED)


class ToolInvoker(Protocol):
    """Runs one attempt of ``tool_name`` for the call ``call_id`` (breaker, timeout, records)."""

    async def __call__(
        self, tool_name: str, call_id: str, arguments: Mapping[str, Any]
    ) -> Attempt: ...


class EscalationSignal(BaseModel):
    """A failed call a human must look at; the caller turns it into a review item."""

    model_config = ConfigDict(frozen=True)

    queue: str
    tool_name: str
    error: str
    call_id: str
    context_snapshot: dict[str, str] | None = None


class DeadLetterRecord(BaseModel):
    """A failed tool call handed to a dead-letter sink, with what is needed to replay it."""

    model_config = ConfigDict(frozen=True)

    tool_name: str
    call_id: str
    arguments: str
    error: str
    agent_id: str = ""
    task_id: str | None = None
    iteration: int = 0
    failed_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


@runtime_checkable
class DeadLetterSink(Protocol):
    """Where dead-lettered calls go (a Redis stream in the distributed runtime)."""

    async def put(self, record: DeadLetterRecord) -> None:
        """Keep ``record`` for later inspection or replay."""
        ...


class InMemoryDeadLetterSink:
    """Dead-lettered calls kept in a list, oldest first."""

    def __init__(self) -> None:
        self._records: list[DeadLetterRecord] = []

    @property
    def records(self) -> tuple[DeadLetterRecord, ...]:
        """Every record put so far."""
        return tuple(self._records)

    async def put(self, record: DeadLetterRecord) -> None:
        """Append ``record``."""
        self._records.append(record)


class RecoveryLedger:
    """LlmRecovery attempts per tool for one run; a success of the tool resets its count.

    Carry one ledger per run (task): the coordinator can persist ``snapshot()`` and rebuild it
    with ``RecoveryLedger(counts)`` on whichever worker runs the next iteration.
    """

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self._counts: dict[str, int] = dict(counts or {})

    def llm_attempts(self, tool_name: str) -> int:
        """How often an error of ``tool_name`` went back to the model since its last success."""
        return self._counts.get(tool_name, 0)

    def count_llm_attempt(self, tool_name: str) -> int:
        """Count one more attempt and return the new count."""
        self._counts[tool_name] = self.llm_attempts(tool_name) + 1
        return self._counts[tool_name]

    def reset(self, tool_name: str) -> None:
        """The tool succeeded: its count starts again from zero."""
        self._counts.pop(tool_name, None)

    def snapshot(self) -> dict[str, int]:
        """The counts, to persist."""
        return dict(self._counts)


@dataclass(frozen=True, slots=True)
class FailedCall:
    """A call whose attempt failed or was rejected, with what recovery needs to know."""

    action: ToolCallAction
    arguments: Mapping[str, Any]
    attempt: Attempt
    iteration: int
    context: ToolContext

    @property
    def tool_name(self) -> str:
        """The tool the model called."""
        return self.action.name

    @property
    def error(self) -> str:
        """The error text of the failed attempt."""
        return self.attempt.observation.content


@dataclass(frozen=True, slots=True)
class RecoveryOutcome:
    """The observation the model will see, and an escalation when a human must decide."""

    observation: Observation
    escalation: EscalationSignal | None = None


@dataclass(frozen=True, slots=True)
class RecoveryEnvironment:
    """What the strategies act with; the executor builds one per failed call, on its batch's
    ledger, cache and sinks."""

    invoke: ToolInvoker
    sleep: Callable[[float], Awaitable[None]]
    emit: Callable[[RecoveryTriggered], Awaitable[None]]
    dead_letter: DeadLetterSink
    ledger: RecoveryLedger
    cache: ResultCache | None = None


def resolve_strategy(
    tool_name: str,
    config: LoopConfig,
    recovery: RecoveryStrategy | None = None,
    tool_recovery: Mapping[str, RecoveryStrategy] | None = None,
) -> RecoveryStrategy:
    """The per-tool override, else the per-call strategy, else ``config.default_recovery``."""
    if tool_recovery is not None and tool_name in tool_recovery:
        return tool_recovery[tool_name]
    return recovery if recovery is not None else config.default_recovery


async def apply_recovery(
    strategy: RecoveryStrategy, failed: FailedCall, env: RecoveryEnvironment
) -> RecoveryOutcome:
    """Apply ``strategy`` to ``failed`` and return what the model sees."""
    match strategy:
        case Retry():
            return await _retry(strategy, failed, env)
        case Fallback():
            return await _fallback(strategy, failed, env)
        case CachedResult():
            return await _cached_result(strategy, failed, env)
        case LlmRecovery():
            return await _llm_recovery(strategy, failed, env)
        case Escalate():
            return await _escalate(strategy, failed, env)
        case DeadLetter():
            return await _dead_letter(strategy, failed, env)


def _event(failed: FailedCall, strategy: RecoveryStrategy, error: str) -> RecoveryTriggered:
    return RecoveryTriggered(
        iteration=failed.iteration, tool_name=failed.tool_name, strategy=strategy, error=error
    )


def _failed_observation(failed: FailedCall, content: str, **metadata: str) -> Observation:
    base = failed.attempt.observation
    return base.model_copy(
        update={"content": content, "is_error": True, "metadata": {**base.metadata, **metadata}}
    )


async def _retry(strategy: Retry, failed: FailedCall, env: RecoveryEnvironment) -> RecoveryOutcome:
    attempt, attempts = failed.attempt, 1
    for retry in range(strategy.max_attempts):
        if attempt.outcome is not CallOutcome.FAILED:
            break
        await env.emit(_event(failed, strategy, attempt.observation.content))
        await env.sleep(strategy.base_delay.total_seconds() * 2**retry)
        attempt = await env.invoke(failed.tool_name, failed.action.call_id, failed.arguments)
        attempts += 1
    if attempts == 1:
        return RecoveryOutcome(attempt.observation)
    observation = attempt.observation.with_metadata(recovery="retry", attempts=str(attempts))
    return RecoveryOutcome(observation)


async def _fallback(
    strategy: Fallback, failed: FailedCall, env: RecoveryEnvironment
) -> RecoveryOutcome:
    attempt = failed.attempt
    errors = [f"{failed.tool_name!r}: {failed.error}"]
    for alternative in strategy.alternatives:
        await env.emit(_event(failed, strategy, attempt.observation.content))
        attempt = await env.invoke(alternative, failed.action.call_id, failed.arguments)
        if attempt.outcome is CallOutcome.SUCCEEDED:
            return RecoveryOutcome(_answered_by(failed, alternative, attempt.observation))
        errors.append(f"{alternative!r}: {attempt.observation.content}")
    content = f"Tool {failed.tool_name!r} and its fallbacks failed: " + "; ".join(errors)
    return RecoveryOutcome(_failed_observation(failed, content, recovery="fallback"))


def _answered_by(failed: FailedCall, alternative: str, answer: Observation) -> Observation:
    note = (
        f"[Answered by fallback tool {alternative!r}; {failed.tool_name!r} failed: {failed.error}]"
    )
    metadata = {
        **answer.metadata,
        "tool_name": failed.tool_name,
        "answered_by": alternative,
        "recovery": "fallback",
    }
    return answer.model_copy(
        update={
            "source": failed.tool_name,
            "content": f"{note}\n{answer.content}",
            "metadata": metadata,
        }
    )


async def _cached_result(
    strategy: CachedResult, failed: FailedCall, env: RecoveryEnvironment
) -> RecoveryOutcome:
    await env.emit(_event(failed, strategy, failed.error))
    max_staleness_s = strategy.max_staleness.total_seconds()
    hit = None
    if env.cache is not None:
        scope = call_scope(failed.context.task_id, failed.context.workspace)
        hit = await env.cache.get(failed.tool_name, failed.arguments, max_staleness_s, scope=scope)
    if hit is None:
        why = (
            "no result cache is configured"
            if env.cache is None
            else f"none younger than {format_duration(strategy.max_staleness)}"
        )
        content = (
            f"{failed.error} (no cached result of {failed.tool_name!r} for these arguments: {why})"
        )
        return RecoveryOutcome(_failed_observation(failed, content, recovery="cached_result"))
    note = f"[Cached result from {hit.age_s:.1f}s ago; the live call failed: {failed.error}]"
    metadata = {
        **hit.metadata,
        "tool_name": failed.tool_name,
        "recovery": "cached_result",
        "cache_age_s": f"{hit.age_s:.3f}",
    }
    observation = Observation(
        source=failed.tool_name,
        content=f"{note}\n{hit.content}",
        call_id=failed.action.call_id,
        metadata=metadata,
    )
    return RecoveryOutcome(observation)


async def _llm_recovery(
    strategy: LlmRecovery, failed: FailedCall, env: RecoveryEnvironment
) -> RecoveryOutcome:
    used = env.ledger.llm_attempts(failed.tool_name)
    if used >= strategy.max_recovery_attempts:
        return await _escalate(Escalate(), failed, env)
    attempt = env.ledger.count_llm_attempt(failed.tool_name)
    await env.emit(_event(failed, strategy, failed.error))
    observation = failed.attempt.observation.with_metadata(
        recovery="llm",
        recovery_attempt=str(attempt),
        max_recovery_attempts=str(strategy.max_recovery_attempts),
    )
    return RecoveryOutcome(observation)


def _snapshot(failed: FailedCall) -> dict[str, str]:
    return {
        "call_id": failed.action.call_id,
        "tool_name": failed.tool_name,
        "arguments": failed.action.arguments,
        "error": failed.error,
        "agent_id": failed.context.agent_id,
        "task_id": failed.context.task_id or "",
        "iteration": str(failed.iteration),
        "workspace": str(failed.context.workspace),
    }


async def _escalate(
    strategy: Escalate, failed: FailedCall, env: RecoveryEnvironment
) -> RecoveryOutcome:
    await env.emit(_event(failed, strategy, failed.error))
    signal = EscalationSignal(
        queue=strategy.queue,
        tool_name=failed.tool_name,
        error=failed.error,
        call_id=failed.action.call_id,
        context_snapshot=_snapshot(failed) if strategy.context_snapshot else None,
    )
    content = f"{failed.error}\n[Escalated to human review queue {strategy.queue!r}]"
    observation = _failed_observation(
        failed, content, recovery="escalate", escalation_queue=strategy.queue
    )
    return RecoveryOutcome(observation, signal)


async def _dead_letter(
    strategy: DeadLetter, failed: FailedCall, env: RecoveryEnvironment
) -> RecoveryOutcome:
    await env.emit(_event(failed, strategy, failed.error))
    record = DeadLetterRecord(
        tool_name=failed.tool_name,
        call_id=failed.action.call_id,
        arguments=failed.action.arguments,
        error=failed.error,
        agent_id=failed.context.agent_id,
        task_id=failed.context.task_id,
        iteration=failed.iteration,
    )
    await env.dead_letter.put(record)
    content = f"Tool {failed.tool_name!r} failed and the call was dead-lettered: {failed.error}"
    return RecoveryOutcome(_failed_observation(failed, content, recovery="dead_letter"))
