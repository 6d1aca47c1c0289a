"""Loop configuration, recovery strategies, termination and results (Symbiont §2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from shared.conventions import KnowledgeSpec
from shared.conversation import Conversation
from shared.durations import Duration
from shared.inference import ToolChoice, ToolDefinition, Usage
from shared.mcp import McpServerSpec
from shared.pre_hydration import PreHydrationConfig
from shared.progress_tracker import StepIterationConfig
from shared.stagnation.config import StagnationConfig
from shared.tool_profile import ToolProfile
from shared.wire import OmitNoneModel

__all__ = [
    "CachedResult",
    "DeadLetter",
    "Escalate",
    "Fallback",
    "LlmRecovery",
    "LoopConfig",
    "LoopResult",
    "LoopState",
    "RecoveryStrategy",
    "Retry",
    "TerminationKind",
    "TerminationReason",
]


# -- recovery strategies -------------------------------------------------------------------


class Retry(BaseModel):
    """Retry the failed tool with exponential backoff: ``base_delay * 2**attempt``."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["retry"] = "retry"
    max_attempts: int = Field(default=2, ge=0)
    base_delay: Duration = timedelta(milliseconds=500)


class Fallback(BaseModel):
    """Try the alternative tools, in order, with the same arguments."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["fallback"] = "fallback"
    alternatives: list[str] = Field(default_factory=list)


class CachedResult(BaseModel):
    """Answer with the last successful result of the same call, if younger than the limit."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)
    strategy: Literal["cached_result"] = "cached_result"
    max_staleness: Duration = Field(
        default=timedelta(minutes=5), validation_alias=AliasChoices("max_staleness", "max_age")
    )


class LlmRecovery(BaseModel):
    """Give the error back to the model so that it changes course (at most N times per tool)."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["llm_recovery"] = "llm_recovery"
    max_recovery_attempts: int = Field(default=1, ge=0)


class Escalate(BaseModel):
    """Stop and ask a human: the caller turns this into a review item."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["escalate"] = "escalate"
    queue: str = "human_review"
    context_snapshot: bool = True


class DeadLetter(BaseModel):
    """Record the failed call on a dead-letter stream and go on without its result."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["dead_letter"] = "dead_letter"


_STRATEGY_TAGS = {
    "Retry": "retry",
    "Fallback": "fallback",
    "CachedResult": "cached_result",
    "LlmRecovery": "llm_recovery",
    "Escalate": "escalate",
    "DeadLetter": "dead_letter",
}


def _from_externally_tagged(value: Any) -> Any:
    """Accept Symbiont's serde shapes: ``{"Retry": {...}}`` and ``"DeadLetter"``."""
    if isinstance(value, str) and value in _STRATEGY_TAGS:
        return {"strategy": _STRATEGY_TAGS[value]}
    if isinstance(value, dict) and len(value) == 1:
        ((tag, body),) = value.items()
        if tag in _STRATEGY_TAGS and isinstance(body, dict):
            return {"strategy": _STRATEGY_TAGS[tag], **body}
    return value


RecoveryStrategy = Annotated[
    Retry | Fallback | CachedResult | LlmRecovery | Escalate | DeadLetter,
    Field(discriminator="strategy"),
    BeforeValidator(_from_externally_tagged),
]


# -- termination ---------------------------------------------------------------------------


class TerminationKind(StrEnum):
    """Why a loop ended."""

    COMPLETED = "completed"
    MAX_ITERATIONS = "max_iterations"
    MAX_TOKENS = "max_tokens"
    TIMEOUT = "timeout"
    POLICY_DENIAL = "policy_denial"
    ERROR = "error"
    ESCALATED = "escalated"
    STAGNATED = "stagnated"
    BUDGET_EXHAUSTED = "budget_exhausted"


_SYMBIONT_KINDS = {
    "Completed": TerminationKind.COMPLETED,
    "MaxIterations": TerminationKind.MAX_ITERATIONS,
    "MaxTokens": TerminationKind.MAX_TOKENS,
    "Timeout": TerminationKind.TIMEOUT,
    "PolicyDenial": TerminationKind.POLICY_DENIAL,
    "Error": TerminationKind.ERROR,
}


class TerminationReason(BaseModel):
    """The kind of termination and, where there is one, the message the caller can act on.

    ``escalated`` means a human must decide (detector ASK_HUMAN, tracker Escalate, the Escalate
    recovery strategy); ``stagnated`` means the stagnation detector aborted the run.
    """

    model_config = ConfigDict(frozen=True)

    kind: TerminationKind
    message: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _accept_symbiont_shape(cls, value: Any) -> Any:
        if isinstance(value, str):
            kind = _SYMBIONT_KINDS.get(value, value)
            return {"kind": kind}
        if isinstance(value, dict) and len(value) == 1:
            ((tag, body),) = value.items()
            if tag in _SYMBIONT_KINDS and isinstance(body, dict):
                message = body.get("message", body.get("reason"))
                return {"kind": _SYMBIONT_KINDS[tag], "message": message}
        return value

    @classmethod
    def completed(cls) -> TerminationReason:
        """The model gave its final answer."""
        return cls(kind=TerminationKind.COMPLETED)

    @classmethod
    def error(cls, message: str) -> TerminationReason:
        """The run failed; the message says why."""
        return cls(kind=TerminationKind.ERROR, message=message)

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}" if self.message else self.kind.value


# -- config and result ---------------------------------------------------------------------


class LoopConfig(OmitNoneModel):
    """Limits and options of one reasoning loop; the defaults are Symbiont's."""

    model_config = ConfigDict(frozen=True)
    omit_when_none = frozenset(
        {
            "tool_choice",
            "tool_profile",
            "step_iteration",
            "pre_hydration",
            "stagnation",
            "knowledge",
            "max_cost_usd",
            "mcp_servers",
        }
    )

    max_iterations: int = Field(default=25, ge=0)
    max_total_tokens: int = Field(default=100_000, ge=0)
    timeout: Duration = timedelta(minutes=5)
    default_recovery: RecoveryStrategy = Field(default_factory=Retry)
    tool_timeout: Duration = timedelta(seconds=30)
    max_concurrent_tools: int = Field(default=5, ge=1)
    context_token_budget: int = Field(default=32_000, ge=1)
    temperature: float = Field(default=0.3, ge=0.0, le=2.0)
    max_output_tokens: int = Field(default=16_384, ge=1)
    max_delegation_depth: int = Field(default=3, ge=0)
    delegation_depth: int = Field(default=0, ge=0)
    delegation_chain: list[str] = Field(default_factory=list)
    tool_definitions: list[ToolDefinition] = Field(default_factory=list)
    tool_choice: ToolChoice | None = None
    tool_profile: ToolProfile | None = None
    step_iteration: StepIterationConfig | None = None
    pre_hydration: PreHydrationConfig | None = None
    stagnation: StagnationConfig | None = None
    knowledge: KnowledgeSpec | None = None
    """The task's knowledge block: the bridge is on for the task when set."""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """The money the task has left for model calls (USD; None: no limit): its limit less
    what it spent and what its running sub-agents reserved, when the call was dispatched."""
    mcp_servers: list[McpServerSpec] | None = None
    """The task's MCP servers (the deployment's are added by the worker): :mod:`shared.mcp`."""


class LoopState(BaseModel):
    """The mutable state of one loop, JSON-serialisable so a coordinator can persist it.

    ``metadata`` may be written by tool results (untrusted); ``trusted_context`` only by the
    runtime.
    """

    agent_id: str
    iteration: int = Field(default=0, ge=0)
    total_usage: Usage = Field(default_factory=Usage)
    conversation: Conversation = Field(default_factory=Conversation)
    started_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    current_phase: str = "initialized"
    metadata: dict[str, Any] = Field(default_factory=dict)
    trusted_context: dict[str, Any] = Field(default_factory=dict)
    milestones: list[str] = Field(default_factory=list)

    def add_usage(self, usage: Usage) -> None:
        """Add one call's usage to the running total."""
        self.total_usage = self.total_usage + usage

    def elapsed(self) -> timedelta:
        """Time since the loop started."""
        return datetime.now(UTC) - self.started_at


class LoopResult(BaseModel):
    """What a run returns, whatever ended it: the output so far, usage and the conversation.

    ``milestones`` lists the verified milestones reached, kept whatever ended the run.
    """

    output: str = ""
    iterations: int = 0
    total_usage: Usage = Field(default_factory=Usage)
    termination_reason: TerminationReason
    duration: Duration = timedelta(0)
    conversation: Conversation = Field(default_factory=Conversation)
    milestones: list[str] = Field(default_factory=list)
