"""Journal events: every phase of the loop leaves one (Symbiont's ``LoopEvent``), plus ours."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.actions import GateModification, Observation, ProposedAction
from shared.durations import Duration
from shared.inference import ProviderWait, Usage
from shared.loop_types import LoopConfig, RecoveryStrategy, TerminationReason
from shared.progress_tracker import StepDecision
from shared.redaction import Redactor
from shared.stagnation.verdict import (
    ReasonCode,
    StagnationKind,
    StagnationLevel,
    StagnationVerdict,
)

__all__ = [
    "JOURNAL_TEXT_CHARS",
    "AttemptFailed",
    "CallDecided",
    "CallHeld",
    "CriticReplyRejected",
    "CriticRequested",
    "CriticVerdict",
    "DispatchFailed",
    "Escalated",
    "GateModified",
    "JournalEntry",
    "LoopEvent",
    "ObservationsCollected",
    "PolicyEvaluated",
    "PreHydrationComplete",
    "ProviderWaited",
    "ReasoningComplete",
    "RecoveryTriggered",
    "ReferenceFailure",
    "ReviewDecided",
    "ServiceUnavailable",
    "StagnationDetected",
    "Started",
    "StepLimitReached",
    "Terminated",
    "ToolResultRecord",
    "ToolsDispatched",
    "VerificationRun",
]

JOURNAL_TEXT_CHARS = 2000
"""A tool's result or a failure's reason is journaled up to this many characters."""


def _capped(text: str, redactor: Redactor | None) -> str:
    """``text`` redacted, then cut to :data:`JOURNAL_TEXT_CHARS` (redacted first, so no cut
    leaves a piece of a secret the redactor would not know)."""
    clean = redactor.redact(text) if redactor is not None else text
    return clean[:JOURNAL_TEXT_CHARS]


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)


class Started(_Event):
    """The loop started with this (post-tool-profile) configuration."""

    type: Literal["Started"] = "Started"
    agent_id: str
    config: LoopConfig


class ReasoningComplete(_Event):
    """The model proposed these actions, using this many tokens in this step."""

    type: Literal["ReasoningComplete"] = "ReasoningComplete"
    iteration: int
    actions: list[ProposedAction]
    usage: Usage


class PolicyEvaluated(_Event):
    """The gate saw ``action_count`` actions and denied ``denied_count``."""

    type: Literal["PolicyEvaluated"] = "PolicyEvaluated"
    iteration: int
    action_count: int
    denied_count: int


class ToolsDispatched(_Event):
    """Tools ran, producing ``tool_count`` observations in ``duration``."""

    type: Literal["ToolsDispatched"] = "ToolsDispatched"
    iteration: int
    tool_count: int
    duration: Duration


class ToolResultRecord(_Event):
    """One tool call's result as the journal keeps it: redacted, at most
    :data:`JOURNAL_TEXT_CHARS` characters of it (``full_chars``: the whole result's length
    when it was cut, else None)."""

    call_id: str | None = None
    tool: str
    is_error: bool = False
    content: str
    full_chars: int | None = None
    error_type: str | None = None
    """``timeout``, ``circuit_open``, ``policy_denied``, ``schema``... for an error."""

    @classmethod
    def of(cls, observation: Observation, redactor: Redactor | None = None) -> ToolResultRecord:
        """The record of ``observation``."""
        return cls(
            call_id=observation.call_id,
            tool=observation.source,
            is_error=observation.is_error,
            content=_capped(observation.content, redactor),
            full_chars=(
                len(observation.content) if len(observation.content) > JOURNAL_TEXT_CHARS else None
            ),
            error_type=observation.metadata.get("error_type"),
        )


class ObservationsCollected(_Event):
    """The observations of an iteration were added to the conversation: how many, and each
    call's result (``results``, in the order of the calls; empty in journals written before
    they were recorded)."""

    type: Literal["ObservationsCollected"] = "ObservationsCollected"
    iteration: int
    observation_count: int
    results: list[ToolResultRecord] = Field(default_factory=list)


class Terminated(_Event):
    """The loop ended; written for every termination, limits and timeouts included."""

    type: Literal["Terminated"] = "Terminated"
    reason: TerminationReason
    iterations: int
    total_usage: Usage
    duration: Duration


class RecoveryTriggered(_Event):
    """A recovery strategy was applied to a failed tool call."""

    type: Literal["RecoveryTriggered"] = "RecoveryTriggered"
    iteration: int
    tool_name: str
    strategy: RecoveryStrategy
    error: str


class StepLimitReached(_Event):
    """The progress tracker stopped a step."""

    type: Literal["StepLimitReached"] = "StepLimitReached"
    step_id: str
    attempts: int
    reason: str

    @classmethod
    def from_decision(cls, step_id: str, attempts: int, decision: StepDecision) -> StepLimitReached:
        """Build the event from a tracker Stop; raises ValueError for a Continue."""
        if not decision.stop or decision.reason is None:
            raise ValueError(
                f"StepLimitReached needs a Stop decision for step {step_id!r}, got Continue"
            )
        return cls(step_id=step_id, attempts=attempts, reason=decision.reason)


class ProviderWaited(_Event):
    """The model call of an iteration waited out transient provider errors (429, 5xx, a
    timeout) or the deployment's shared rate limit, without failing an attempt."""

    type: Literal["ProviderWaited"] = "ProviderWaited"
    iteration: int
    waits: list[ProviderWait]
    total_wait_s: float


class Escalated(_Event):
    """The task now waits for a human: which review, what raised it and why."""

    type: Literal["Escalated"] = "Escalated"
    review_id: str
    source: str
    """``tracker`` (the step's attempts), ``detector`` (stagnation), ``recovery``, ``critic``
    (a human critic's review of a step's result) or ``critic_escalation`` (an agent critic
    asked for more revisions than ``max_rounds``, or could not give a valid verdict)."""
    reason: str
    deadline: datetime
    default_decision: str


class ReviewDecided(_Event):
    """A review was decided: by whom (an operator's name, or ``deadline`` for the default),
    what (``retry``, ``skip``, ``abort``; ``approve`` or ``revise`` for a step's result) and
    the hint given to the model on a retry (the reason, on a revision)."""

    type: Literal["ReviewDecided"] = "ReviewDecided"
    review_id: str
    decision: str
    decided_by: str
    hint: str | None = None


class CallHeld(_Event):
    """The gate asked a human about one tool call (``Ask``): it is held under ``review_id``
    while the turn's other calls run; ``arguments`` are the call's, as proposed."""

    type: Literal["CallHeld"] = "CallHeld"
    review_id: str
    call_id: str
    tool: str
    arguments: str
    reason: str
    deadline: datetime

    @classmethod
    def of(
        cls,
        *,
        review_id: str,
        call_id: str,
        tool: str,
        arguments: str,
        reason: str,
        deadline: datetime,
        redactor: Redactor | None,
    ) -> CallHeld:
        """The event for one held call, its arguments and reason redacted and capped (as a
        tool's result is: a held call's arguments may carry a secret the model read)."""
        return cls(
            review_id=review_id,
            call_id=call_id,
            tool=tool,
            arguments=_capped(arguments, redactor),
            reason=_capped(reason, redactor),
            deadline=deadline,
        )


class CallDecided(_Event):
    """A held call was decided: ``approve`` (run as proposed), ``edit`` (run with
    ``arguments_after``), ``reject`` (``message`` is the call's result the model reads) or
    ``abort``; by whom (``deadline``: the review's default, applied at its deadline)."""

    type: Literal["CallDecided"] = "CallDecided"
    review_id: str
    call_id: str
    tool: str
    decision: str
    decided_by: str
    arguments_before: str
    arguments_after: str | None = None
    message: str | None = None

    @classmethod
    def of(
        cls,
        *,
        review_id: str,
        call_id: str,
        tool: str,
        decision: str,
        decided_by: str,
        arguments_before: str,
        arguments_after: str | None,
        message: str | None,
        redactor: Redactor | None,
    ) -> CallDecided:
        """The event for one decision, its arguments and message redacted and capped."""
        return cls(
            review_id=review_id,
            call_id=call_id,
            tool=tool,
            decision=decision,
            decided_by=_capped(decided_by, redactor),
            arguments_before=_capped(arguments_before, redactor),
            arguments_after=None if arguments_after is None else _capped(arguments_after, redactor),
            message=None if message is None else _capped(message, redactor),
        )


class ReferenceFailure(_Event):
    """A reference pre-hydration could not resolve: its type, its text, and why."""

    ref_type: str
    reference: str
    error: str


class PreHydrationComplete(_Event):
    """References from the task input were resolved before the loop; ``failures`` says which
    failed and why (redacted, capped)."""

    type: Literal["PreHydrationComplete"] = "PreHydrationComplete"
    references_found: int
    references_resolved: int
    references_failed: int
    total_tokens: int
    failures: list[ReferenceFailure] = Field(default_factory=list)


class GateModified(_Event):
    """The policy gate changed a proposed action before it ran: what the model proposed
    (``before``), what runs instead (``after``) and the gate's reason."""

    type: Literal["GateModified"] = "GateModified"
    iteration: int
    call_id: str | None = None
    reason: str
    before: ProposedAction
    after: ProposedAction

    @classmethod
    def of(
        cls, iteration: int, change: GateModification, redactor: Redactor | None = None
    ) -> GateModified:
        """The event for one applied Modify, every string in it redacted."""
        data = change.model_dump(mode="json")
        if redactor is not None:
            data = redactor.redact_value(data)
        before = data["before"]
        return cls.model_validate(
            {
                "iteration": iteration,
                "call_id": before.get("call_id"),
                "reason": _capped(data["reason"], None),
                "before": before,
                "after": data["after"],
            }
        )


class StagnationDetected(_Event):
    """The stagnation detector raised its level: what kind, and the two counters."""

    type: Literal["StagnationDetected"] = "StagnationDetected"
    level: StagnationLevel
    kind: StagnationKind | None = None
    steps_since_milestone: int
    new_state_changes: int
    stale_steps: int = 0
    reason_codes: list[ReasonCode] = Field(default_factory=list)

    @classmethod
    def from_verdict(cls, verdict: StagnationVerdict) -> StagnationDetected:
        """The journal event for a verdict."""
        return cls(
            level=verdict.level,
            kind=verdict.kind,
            steps_since_milestone=verdict.steps_since_milestone,
            new_state_changes=verdict.new_state_changes,
            stale_steps=verdict.stale_steps,
            reason_codes=list(verdict.reason_codes),
        )


class AttemptFailed(_Event):
    """An attempt of a step failed (a failed check, a limit, a provider error, a dead-lettered
    dispatch): what the progress tracker was told."""

    type: Literal["AttemptFailed"] = "AttemptFailed"
    step_id: str
    attempt: int
    error: str


class DispatchFailed(_Event):
    """A worker could not run a dispatch (a provider error, a crash): re-sent or given up."""

    type: Literal["DispatchFailed"] = "DispatchFailed"
    fence: str
    error: str
    retried: bool
    error_kind: str = "internal"
    """The worker's ``error_kind``: ``config`` fails the task at once."""


class ServiceUnavailable(_Event):
    """A worker reported an outage of a service the task needs (its provider, the policy
    engine): no attempt is used up; the dispatch is sent again at ``retry_at``, or, past the
    outage deadline (``retry_at`` None), the task fails naming the outage."""

    type: Literal["ServiceUnavailable"] = "ServiceUnavailable"
    error_kind: Literal["provider_unavailable", "policy_unavailable"]
    service: str
    since: datetime
    """When the first report of this outage came (the worker had tried until its own retry
    deadline by then)."""
    error: str
    reports: int
    """How many dispatches in a row reported it."""
    retry_at: datetime | None = None


class VerificationRun(_Event):
    """A step's ``done_when`` check ran: its command, exit code, and whether it passed."""

    type: Literal["VerificationRun"] = "VerificationRun"
    step_id: str
    command: str
    exit_code: int | None
    expected: int
    passed: bool


class CriticRequested(_Event):
    """A step's result went to its critic: which one (``agent:NAME`` or ``human``), which
    round of review (1 for the first), and the review that holds it for a human critic."""

    type: Literal["CriticRequested"] = "CriticRequested"
    step_id: str
    critic: str
    round: int
    review_id: str | None = None


class CriticVerdict(_Event):
    """The critic answered: ``approve`` or ``revise``, its reason, and who decided (the
    critic, or the human who worked its review)."""

    type: Literal["CriticVerdict"] = "CriticVerdict"
    step_id: str
    critic: str
    round: int
    verdict: Literal["approve", "revise"]
    reason: str
    decided_by: str
    usage: Usage = Field(default_factory=Usage)


class CriticReplyRejected(_Event):
    """The critic's reply was not a valid verdict: what was wrong, and whether the critic is
    asked again (once) or the step escalates."""

    type: Literal["CriticReplyRejected"] = "CriticReplyRejected"
    step_id: str
    critic: str
    round: int
    error: str
    retried: bool
    usage: Usage = Field(default_factory=Usage)


LoopEvent = Annotated[
    Started
    | ReasoningComplete
    | PolicyEvaluated
    | ToolsDispatched
    | ObservationsCollected
    | Terminated
    | RecoveryTriggered
    | StepLimitReached
    | PreHydrationComplete
    | StagnationDetected
    | AttemptFailed
    | DispatchFailed
    | ServiceUnavailable
    | VerificationRun
    | ProviderWaited
    | Escalated
    | ReviewDecided
    | CallHeld
    | CallDecided
    | CriticRequested
    | CriticVerdict
    | CriticReplyRejected
    | GateModified,
    Field(discriminator="type"),
]


class JournalEntry(BaseModel):
    """One journal line: a sequence number, when, whose loop, which iteration, what happened."""

    model_config = ConfigDict(frozen=True)

    sequence: int = Field(ge=0)
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))
    agent_id: str
    iteration: int = Field(default=0, ge=0)
    event: LoopEvent
    task_id: str | None = None
    step_id: str | None = None
