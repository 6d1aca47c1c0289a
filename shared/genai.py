"""OpenTelemetry's GenAI semantic conventions, beside the ``orga.*`` phase spans.

Spans, through the OpenTelemetry API only (no-ops without an SDK, as in :mod:`shared.tracing`):

- ``chat {model}`` for every model call (the task's, a plan's, a critic's): the operation, the
  provider, the requested and answering model, the tokens used and the finish reason, with the
  call's cost as ``orga.cost_usd``;
- ``execute_tool {tool}`` for every tool call a worker runs: the tool's name and call id;
- ``invoke_agent {agent}`` for a task or sub-agent, from its submission to its end (opened by
  the coordinator when the task ends: a task outlives every process that worked on it).

Message contents (the prompt, the answer, a tool's arguments and result) go on the spans only
when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``: the process edge reads it
(:class:`shared.settings.TelemetrySettings`) and calls :func:`capture_content`.

The Prometheus histograms of the same conventions, ``gen_ai_client_token_usage`` and
``gen_ai_client_operation_duration_seconds``, use :data:`TOKEN_USAGE_BUCKETS` and
:data:`OPERATION_DURATION_BUCKETS_S`, the boundaries the conventions advise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context

from shared.conversation import Conversation
from shared.inference import InferenceResponse, Usage
from shared.tracing import TRACER_NAME, tracing_installed

__all__ = [
    "OPERATION_DURATION_BUCKETS_S",
    "TOKEN_USAGE_BUCKETS",
    "agent_span",
    "capture_content",
    "capturing_content",
    "chat_span",
    "record_chat_response",
    "record_tool_result",
    "tool_span",
]

TOKEN_USAGE_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""``gen_ai.client.token.usage``'s advised bucket boundaries (tokens)."""

OPERATION_DURATION_BUCKETS_S: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""``gen_ai.client.operation.duration``'s advised bucket boundaries (seconds)."""

_MAX_CAPTURED_CHARS: Final = 64_000
_capture = False


def capture_content(enabled: bool) -> None:
    """Whether spans carry message contents (set once, at the process edge)."""
    global _capture  # noqa: PLW0603
    _capture = enabled


def capturing_content() -> bool:
    """Whether spans carry message contents."""
    return _capture


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


@contextmanager
def chat_span(
    provider: str,
    model: str,
    conversation: Conversation | None = None,
    *,
    task_id: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> Iterator[trace.Span]:
    """The ``chat {model}`` span of one model call (exceptions recorded, and raised on)."""
    if not tracing_installed():  # the API's no-op: skip building what it would drop
        yield trace.INVALID_SPAN
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
    }
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if temperature is not None:
        attributes["gen_ai.request.temperature"] = temperature
    if task_id is not None:
        attributes["orga.task_id"] = task_id
    with _tracer().start_as_current_span(
        f"chat {model}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ) as span:
        if _capture and conversation is not None and span.is_recording():
            span.set_attribute("gen_ai.input.messages", _messages(conversation))
        yield span


def record_chat_response(
    span: trace.Span, response: InferenceResponse, usage: Usage | None = None
) -> None:
    """The answer's model, tokens, finish reason and cost (``usage``: priced; default the
    response's) on its ``chat`` span."""
    if not span.is_recording():
        return
    usage = response.usage if usage is None else usage
    span.set_attributes(
        {
            "gen_ai.response.model": response.model,
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "gen_ai.response.finish_reasons": [response.finish_reason.value],
            "orga.cost_usd": usage.cost_usd,
        }
    )
    if _capture:
        output: dict[str, Any] = {"role": "assistant", "content": response.content}
        if response.tool_calls:
            output["tool_calls"] = [c.model_dump() for c in response.tool_calls]
        span.set_attribute("gen_ai.output.messages", _clip(json.dumps([output])))


@contextmanager
def tool_span(
    name: str, call_id: str | None, arguments: str | None = None, *, task_id: str | None = None
) -> Iterator[trace.Span]:
    """The ``execute_tool {name}`` span of one tool call."""
    if not tracing_installed():
        yield trace.INVALID_SPAN
        return
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if task_id is not None:
        attributes["orga.task_id"] = task_id
    with _tracer().start_as_current_span(
        f"execute_tool {name}", kind=trace.SpanKind.INTERNAL, attributes=attributes
    ) as span:
        if _capture and arguments is not None and span.is_recording():
            span.set_attribute("gen_ai.tool.call.arguments", _clip(arguments))
        yield span


def record_tool_result(span: trace.Span, content: str, is_error: bool) -> None:
    """A tool call's outcome on its span (its content only when contents are captured)."""
    if not span.is_recording():
        return
    if is_error:
        span.set_attribute("error.type", "tool_error")
    if _capture:
        span.set_attribute("gen_ai.tool.call.result", _clip(content))


def agent_span(
    agent: str,
    task_id: str,
    *,
    start_ns: int,
    end_ns: int,
    parent: Context | None,
    attributes: dict[str, Any],
) -> None:
    """The ``invoke_agent {agent}`` span of a whole task, opened and closed at its end."""
    span = _tracer().start_span(
        f"invoke_agent {agent}",
        context=parent,
        kind=trace.SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.agent.id": task_id,
            "orga.task_id": task_id,
            **attributes,
        },
        start_time=start_ns,
    )
    span.end(end_time=end_ns)


def _messages(conversation: Conversation) -> str:
    return _clip(json.dumps(conversation.to_openai_messages()))


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_CAPTURED_CHARS else text[:_MAX_CAPTURED_CHARS] + "..."
