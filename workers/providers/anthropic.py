"""Anthropic Messages API (``POST {base_url}/messages``).

Request: headers ``x-api-key`` and ``anthropic-version: 2023-06-01``; ``model``, ``max_tokens``,
``temperature`` (always sent: 0 is sent as 0, where Symbiont fell back to the API default of
1.0), ``messages`` and ``system`` from ``Conversation.to_anthropic_messages()`` (every system
message, merged in order, so knowledge and pre-hydrated context reach the model), ``tools`` as
``{name, description, input_schema}`` with ``tool_choice`` (auto, any, ``{type: tool, name}``)
when tools are given; ``options.extra`` merged last. With ``prompt_caching`` (the default) the
system prompt is one text block marked ``cache_control: ephemeral``, or, without a system prompt,
the last tool is. ``response_format`` has no Messages API equivalent and is not sent.

Reply: text blocks joined with ``\\n``; ``tool_use`` blocks become ``ToolCall(id, name,
json.dumps(input))`` (a block without id or name is a ``ResponseParseError``); ``stop_reason``
``refusal`` → REFUSAL, ``tool_use`` → TOOL_CALLS, ``max_tokens`` and
``model_context_window_exceeded`` → MAX_TOKENS, anything else (``end_turn``, ``stop_sequence``,
``pause_turn``, missing) → TOOL_CALLS when there are tool calls, else STOP. Usage: prompt tokens
are ``input_tokens`` plus any cache-read and cache-creation tokens (kept apart too, as
``cache_read_tokens`` and ``cache_write_tokens``: priced at their own rates), total = prompt +
output.

Inside :func:`~workers.providers.streaming.streaming_to` the request adds ``stream: true`` and
the event stream is assembled into the same reply (:mod:`workers.providers.streaming`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from pydantic import SecretStr

from shared.conversation import Conversation
from shared.inference import (
    FinishReason,
    InferenceOptions,
    InferenceResponse,
    ToolCall,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceTool,
    Usage,
)
from workers.http_pool import SessionSource
from workers.providers._http import (
    Endpoint,
    JsonPoster,
    json_count,
    json_error_message,
    shown,
)
from workers.providers.base import ProviderError, ResponseParseError
from workers.providers.rate_limit import ProviderThrottle
from workers.providers.retry import RetryPolicy, SleepFn
from workers.providers.streaming import AnthropicStreamAssembler, StreamReader, current_sink

__all__ = [
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_DEFAULT_MODEL",
    "ANTHROPIC_VERSION",
    "AnthropicProvider",
    "build_anthropic_body",
    "map_anthropic_stop_reason",
    "parse_anthropic_response",
]

ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"
ANTHROPIC_DEFAULT_MODEL = "claude-sonnet-4-20250514"
ANTHROPIC_VERSION = "2023-06-01"

_STOP_REASONS = {
    "refusal": FinishReason.REFUSAL,
    "tool_use": FinishReason.TOOL_CALLS,
    "max_tokens": FinishReason.MAX_TOKENS,
    "model_context_window_exceeded": FinishReason.MAX_TOKENS,
}
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicProvider:
    """An ``InferenceProvider`` for the Anthropic Messages API."""

    def __init__(
        self,
        *,
        api_key: SecretStr | str,
        base_url: str = ANTHROPIC_BASE_URL,
        model: str = ANTHROPIC_DEFAULT_MODEL,
        api_key_env: str = "ANTHROPIC_API_KEY",
        prompt_caching: bool = True,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        sleep: SleepFn = asyncio.sleep,
        rand: Callable[[], float] | None = None,
        session: aiohttp.ClientSession | SessionSource | None = None,
        throttle: ProviderThrottle | None = None,
    ) -> None:
        self._model = model
        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        self._prompt_caching = prompt_caching
        self._headers = dict(headers or {})
        self._endpoint = Endpoint("anthropic", base_url.rstrip("/"), api_key_env, self._api_key)
        self._poster = JsonPoster(
            self._endpoint,
            timeout_s=timeout_s,
            retry=retry if retry is not None else RetryPolicy(),
            sleep=sleep,
            rand=rand,
            session=session,
            throttle=throttle,
        )

    def __repr__(self) -> str:
        return (
            f"AnthropicProvider(base_url={self._endpoint.shown_base_url!r}, model={self._model!r}, "
            "api_key=set)"
        )

    def provider_name(self) -> str:
        """Always ``anthropic``."""
        return "anthropic"

    def default_model(self) -> str:
        """The model used when the options name none."""
        return self._model

    async def complete(
        self, conversation: Conversation, options: InferenceOptions
    ) -> InferenceResponse:
        """One Messages API call."""
        model = options.model or self._model
        body = build_anthropic_body(
            conversation, options, model, prompt_caching=self._prompt_caching
        )
        sink, reader = current_sink(), None
        if sink is not None:  # streamed: the text goes to the sink as it comes
            body = {**body, "stream": True}
            reader = StreamReader(AnthropicStreamAssembler, sink, self._endpoint.redact)
        data = await self._poster.post(
            "messages", headers=self._request_headers(), body=body, model=model, consume=reader
        )
        return parse_anthropic_response(data, model)

    def _request_headers(self) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
            **self._headers,
            "x-api-key": self._api_key.get_secret_value(),
        }


# -- request --------------------------------------------------------------------------------


def build_anthropic_body(
    conversation: Conversation,
    options: InferenceOptions,
    model: str,
    *,
    prompt_caching: bool = True,
) -> dict[str, Any]:
    """The Messages API request body for ``conversation`` under ``options``."""
    system, messages = conversation.to_anthropic_messages()
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "messages": messages,
    }
    if system:
        body["system"] = _system_blocks(system, prompt_caching)
    if options.tool_definitions:
        body["tools"] = _tools(options, cache_last=prompt_caching and not system)
        if options.tool_choice is not None:
            body["tool_choice"] = _tool_choice(options.tool_choice)
    body.update(options.extra)
    return body


def _system_blocks(system: str, prompt_caching: bool) -> list[dict[str, Any]]:
    block: dict[str, Any] = {"type": "text", "text": system}
    if prompt_caching:
        block["cache_control"] = dict(_EPHEMERAL)
    return [block]


def _tools(options: InferenceOptions, *, cache_last: bool) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
        for tool in options.tool_definitions
    ]
    if cache_last:
        tools[-1]["cache_control"] = dict(_EPHEMERAL)
    return tools


def _tool_choice(choice: ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool) -> dict[str, str]:
    if isinstance(choice, ToolChoiceTool):
        return {"type": "tool", "name": choice.name}
    return {"type": choice.type}


# -- reply ----------------------------------------------------------------------------------


def parse_anthropic_response(data: Mapping[str, Any], requested_model: str) -> InferenceResponse:
    """An ``InferenceResponse`` from a Messages API reply, or ``ResponseParseError``."""
    blocks = _content_blocks(data)
    texts = [str(b["text"]) for b in blocks if b.get("type") == "text" and "text" in b]
    tool_calls = [
        _tool_call(index, block)
        for index, block in enumerate(blocks)
        if block.get("type") == "tool_use"
    ]
    stop_reason = data.get("stop_reason")
    return InferenceResponse(
        content="\n".join(texts),
        tool_calls=tool_calls,
        finish_reason=map_anthropic_stop_reason(
            stop_reason if isinstance(stop_reason, str) else None, bool(tool_calls)
        ),
        usage=_usage(data.get("usage")),
        model=str(data.get("model") or requested_model),
    )


def map_anthropic_stop_reason(stop_reason: str | None, has_tool_calls: bool) -> FinishReason:
    """§13.15: refusal, tool_use, max_tokens map directly; the rest depend on the tool calls."""
    mapped = _STOP_REASONS.get(stop_reason or "end_turn")
    if mapped is not None:
        return mapped
    return FinishReason.TOOL_CALLS if has_tool_calls else FinishReason.STOP


def _content_blocks(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    if data.get("type") == "error":
        raise ProviderError(
            f"anthropic answered an error instead of a message: {json_error_message(data)}"
        )
    content = data.get("content")
    if not isinstance(content, list):
        raise ResponseParseError(
            f"the anthropic response has no content list: {sorted(data) or 'empty object'}"
        )
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise ResponseParseError(f"content[{index}] must be an object, got {shown(block)}")
    return content


def _tool_call(index: int, block: Mapping[str, Any]) -> ToolCall:
    call_id, name, tool_input = block.get("id"), block.get("name"), block.get("input")
    missing = [
        label
        for label, value in (("id", call_id), ("name", name))
        if not isinstance(value, str) or not value
    ]
    if missing:
        raise ResponseParseError(
            f"content[{index}] (tool_use) has no {' and no '.join(missing)}: {shown(dict(block))}"
        )
    tool_input = {} if tool_input is None else tool_input
    if not isinstance(tool_input, dict):
        raise ResponseParseError(
            f"content[{index}] (tool_use) input must be an object, got {shown(tool_input)}"
        )
    return ToolCall(id=str(call_id), name=str(name), arguments=json.dumps(tool_input))


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    written = json_count(raw.get("cache_creation_input_tokens"))
    read = json_count(raw.get("cache_read_input_tokens"))
    prompt = json_count(raw.get("input_tokens")) + written + read
    completion = json_count(raw.get("output_tokens"))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cache_write_tokens=written,
        cache_read_tokens=read,
    )
