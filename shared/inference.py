"""Types the inference providers and the loop agree on (Symbiont's ``inference.rs``)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "FinishReason",
    "InferenceOptions",
    "InferenceResponse",
    "ModelCall",
    "ProviderWait",
    "ResponseFormat",
    "ResponseFormatJsonObject",
    "ResponseFormatJsonSchema",
    "ResponseFormatText",
    "ToolCall",
    "ToolChoice",
    "ToolChoiceAny",
    "ToolChoiceAuto",
    "ToolChoiceTool",
    "ToolDefinition",
    "Usage",
]


class ToolDefinition(BaseModel):
    """A tool the model may call: a name, a description and a JSON Schema for its arguments."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolCall(BaseModel):
    """A tool call requested by the model; ``arguments`` is JSON text, as providers send it."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = "{}"


class FinishReason(StrEnum):
    """Why the model stopped producing output."""

    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    MAX_TOKENS = "max_tokens"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"


class Usage(BaseModel):
    """Token counts of one call or of a whole run, and what they cost in US dollars
    (``cost_usd``: 0 when no price of the model is known; :mod:`shared.pricing`).

    ``cache_write_tokens`` and ``cache_read_tokens`` are the part of ``prompt_tokens`` the
    provider wrote to or read from its prompt cache (Anthropic's ``cache_creation_input_tokens``
    and ``cache_read_input_tokens``), priced at the cache-write and cache-read rates."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
        )

    def delta_since(self, earlier: Usage) -> Usage:
        """The usage added since ``earlier`` (never negative)."""
        return Usage(
            prompt_tokens=max(self.prompt_tokens - earlier.prompt_tokens, 0),
            completion_tokens=max(self.completion_tokens - earlier.completion_tokens, 0),
            total_tokens=max(self.total_tokens - earlier.total_tokens, 0),
            cost_usd=max(self.cost_usd - earlier.cost_usd, 0.0),
            cache_write_tokens=max(self.cache_write_tokens - earlier.cache_write_tokens, 0),
            cache_read_tokens=max(self.cache_read_tokens - earlier.cache_read_tokens, 0),
        )


class ProviderWait(BaseModel):
    """A wait before a model call: the provider answered a transient error (``status`` 429,
    5xx; 0 for a timeout or an unreachable server) and asked for or earned ``wait_s`` seconds,
    or (``shared``) another worker's 429 on the same provider and key made this call wait.
    Waits do not count as failed attempts; the journal records them (``ProviderWaited``)."""

    model_config = ConfigDict(frozen=True)

    provider: str
    status: int = Field(default=0, ge=0)
    wait_s: float = Field(ge=0)
    retry_after: bool = False
    """The wait is the server's ``Retry-After`` (else a backoff)."""
    shared: bool = False
    """The wait was set by another call's 429 (the deployment-wide limiter)."""


class ToolChoiceAuto(BaseModel):
    """The model decides whether to call a tool."""

    model_config = ConfigDict(frozen=True)
    type: Literal["auto"] = "auto"


class ToolChoiceAny(BaseModel):
    """The model must call some tool."""

    model_config = ConfigDict(frozen=True)
    type: Literal["any"] = "any"


class ToolChoiceTool(BaseModel):
    """The model must call the named tool."""

    model_config = ConfigDict(frozen=True)
    type: Literal["tool"] = "tool"
    name: str


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool, Field(discriminator="type")]


class ResponseFormatText(BaseModel):
    """Plain text output."""

    model_config = ConfigDict(frozen=True)
    type: Literal["text"] = "text"


class ResponseFormatJsonObject(BaseModel):
    """Any JSON object."""

    model_config = ConfigDict(frozen=True)
    type: Literal["json_object"] = "json_object"


class ResponseFormatJsonSchema(BaseModel):
    """JSON matching a schema."""

    model_config = ConfigDict(frozen=True)
    type: Literal["json_schema"] = "json_schema"
    schema_: dict[str, Any] = Field(alias="schema")
    name: str | None = None


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
    Field(discriminator="type"),
]


class InferenceOptions(BaseModel):
    """Options of one inference call."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = 4096
    temperature: float = 0.3
    tool_definitions: list[ToolDefinition] = Field(default_factory=list)
    tool_choice: ToolChoice | None = None
    response_format: ResponseFormat = Field(default_factory=ResponseFormatText)
    model: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class InferenceResponse(BaseModel):
    """What a provider returns for one call."""

    model_config = ConfigDict(frozen=True)

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: FinishReason = FinishReason.STOP
    usage: Usage = Field(default_factory=Usage)
    model: str = ""

    def has_tool_calls(self) -> bool:
        """True when the model asked for at least one tool call."""
        return bool(self.tool_calls)


class ModelCall(BaseModel):
    """One model call as the metrics report it: who answered, which model, how long the call
    took (its retries included)."""

    model_config = ConfigDict(frozen=True)

    provider: str
    model: str
    """The model asked for."""
    response_model: str = ""
    duration_ms: float = Field(default=0.0, ge=0)
