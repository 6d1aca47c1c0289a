"""OpenAI-compatible chat completions (OpenAI, OpenRouter, vLLM, Ollama, llama.cpp server).

Request (``POST {base_url}/chat/completions``): ``model``, ``messages``
(``Conversation.to_openai_messages()``), ``max_tokens``, ``temperature``; ``tools`` and
``tool_choice`` only when tools are given (auto → ``"auto"``, any → ``"required"``, tool →
``{type: function, function: {name}}``); ``response_format`` unless it is plain text; then
``options.extra``, merged last so it can override anything (Symbiont never sent it to OpenAI).

Reply: ``choices[0].message``. Unlike Symbiont, tool-call arguments sent as a JSON object are
re-serialised instead of dropped, a tool call without id or name is a ``ResponseParseError``
instead of vanishing, and ``message.refusal`` gives ``FinishReason.REFUSAL`` (its text becomes the
content when there is no other). A missing ``usage.total_tokens`` is computed;
``usage.prompt_tokens_details.cached_tokens`` is kept as ``cache_read_tokens`` (priced at the
cache-read rate).

Inside :func:`~workers.providers.streaming.streaming_to` the request adds ``stream: true`` and
``stream_options: {include_usage: true}``, and the chunks are assembled into the same reply
(:mod:`workers.providers.streaming`); a server that refuses them with a 400 is asked again
once for a whole answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from pydantic import SecretStr

from shared.conversation import Conversation
from shared.inference import (
    FinishReason,
    InferenceOptions,
    InferenceResponse,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
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
from workers.providers.base import (
    AuthenticationError,
    InvalidRequestError,
    ProviderError,
    ResponseParseError,
)
from workers.providers.rate_limit import ProviderThrottle
from workers.providers.retry import RetryPolicy, SleepFn
from workers.providers.streaming import (
    OpenAIStreamAssembler,
    StreamReader,
    TokenSink,
    current_sink,
)

__all__ = [
    "OPENAI_BASE_URL",
    "OPENAI_DEFAULT_MODEL",
    "OpenAICompatProvider",
    "build_openai_body",
    "parse_openai_response",
]

_log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENAI_DEFAULT_MODEL = "gpt-4o"

_FINISH_REASONS = {
    "tool_calls": FinishReason.TOOL_CALLS,
    "length": FinishReason.MAX_TOKENS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


class OpenAICompatProvider:
    """An ``InferenceProvider`` for any server speaking OpenAI chat completions.

    ``api_key`` may be None for keyless local servers (no ``Authorization`` header is sent).
    ``api_key_env`` is only named in error messages. ``name`` is what ``provider_name()``
    returns (``openai``, ``openrouter``, ``vllm``...). ``headers`` are added to every request
    (OpenRouter's ``HTTP-Referer`` and ``X-Title``).
    """

    def __init__(
        self,
        *,
        base_url: str = OPENAI_BASE_URL,
        model: str = OPENAI_DEFAULT_MODEL,
        api_key: SecretStr | str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        name: str = "openai",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        sleep: SleepFn = asyncio.sleep,
        rand: Callable[[], float] | None = None,
        session: aiohttp.ClientSession | SessionSource | None = None,
        throttle: ProviderThrottle | None = None,
    ) -> None:
        self._model = model
        self._name = name
        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        self._headers = dict(headers or {})
        self._endpoint = Endpoint(name, base_url.rstrip("/"), api_key_env, self._api_key)
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
            f"OpenAICompatProvider(name={self._name!r}, "
            f"base_url={self._endpoint.shown_base_url!r}, model={self._model!r}, "
            f"api_key={'set' if self._api_key else 'none'})"
        )

    def provider_name(self) -> str:
        """The name given at construction (``openai`` by default)."""
        return self._name

    def default_model(self) -> str:
        """The model used when the options name none."""
        return self._model

    async def complete(
        self, conversation: Conversation, options: InferenceOptions
    ) -> InferenceResponse:
        """One chat-completions call."""
        model = options.model or self._model
        body = build_openai_body(conversation, options, model)
        sink = current_sink()
        if sink is not None:  # streamed: the text goes to the sink as it comes
            try:
                return await self._streamed(body, model, sink)
            except AuthenticationError:
                raise
            except InvalidRequestError as exc:
                # Some compatible servers refuse ``stream`` or ``stream_options`` (HTTP 400):
                # ask once more for a whole answer, which fails the same way if that was not it.
                _log.info("inference.stream_refused", extra={"provider": self._name,
                                                             "error": str(exc)[:300]})  # fmt: skip
        data = await self._poster.post(
            "chat/completions", headers=self._request_headers(), body=body, model=model
        )
        return parse_openai_response(data, model, provider=self._name)

    async def _streamed(
        self, body: dict[str, Any], model: str, sink: TokenSink
    ) -> InferenceResponse:
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        reader = StreamReader(
            lambda: OpenAIStreamAssembler(self._name), sink, self._endpoint.redact
        )
        data = await self._poster.post(
            "chat/completions",
            headers=self._request_headers(),
            body=streamed,
            model=model,
            consume=reader,
        )
        return parse_openai_response(data, model, provider=self._name)

    def _request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", **self._headers}
        if self._api_key is not None and self._api_key.get_secret_value():
            headers["authorization"] = f"Bearer {self._api_key.get_secret_value()}"
        return headers


# -- request --------------------------------------------------------------------------------


def build_openai_body(
    conversation: Conversation, options: InferenceOptions, model: str
) -> dict[str, Any]:
    """The chat-completions request body for ``conversation`` under ``options``."""
    body: dict[str, Any] = {
        "model": model,
        "messages": conversation.to_openai_messages(),
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
    }
    if options.tool_definitions:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in options.tool_definitions
        ]
        if options.tool_choice is not None:
            body["tool_choice"] = _tool_choice(options.tool_choice)
    response_format = _response_format(options)
    if response_format is not None:
        body["response_format"] = response_format
    body.update(options.extra)
    return body


def _tool_choice(choice: ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool) -> Any:
    if isinstance(choice, ToolChoiceTool):
        return {"type": "function", "function": {"name": choice.name}}
    return "required" if isinstance(choice, ToolChoiceAny) else "auto"


def _response_format(options: InferenceOptions) -> dict[str, Any] | None:
    fmt = options.response_format
    if isinstance(fmt, ResponseFormatJsonObject):
        return {"type": "json_object"}
    if isinstance(fmt, ResponseFormatJsonSchema):
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.name or "response", "schema": fmt.schema_},
        }
    return None


# -- reply ----------------------------------------------------------------------------------


def parse_openai_response(
    data: Mapping[str, Any], requested_model: str, *, provider: str = "openai"
) -> InferenceResponse:
    """An ``InferenceResponse`` from a chat-completions reply, or ``ResponseParseError``."""
    choice = _first_choice(data, provider)
    message = _message(choice, provider)
    tool_calls = _tool_calls(message.get("tool_calls"))
    refusal = message.get("refusal")
    refused = isinstance(refusal, str) and bool(refusal)
    content = _content(message.get("content"))
    return InferenceResponse(
        content=content or (str(refusal) if refused else ""),
        tool_calls=tool_calls,
        finish_reason=_finish_reason(choice.get("finish_reason"), tool_calls, refused=refused),
        usage=_usage(data.get("usage")),
        model=str(data.get("model") or requested_model),
    )


def _first_choice(data: Mapping[str, Any], provider: str) -> Mapping[str, Any]:
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    error = json_error_message(data) if "error" in data else None
    if error is not None:
        raise ProviderError(f"{provider} answered an error instead of a completion: {error}")
    raise ResponseParseError(f"no choices in the {provider} response: {_describe(data)}")


def _message(choice: Mapping[str, Any], provider: str) -> Mapping[str, Any]:
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ResponseParseError(
            f"choices[0] of the {provider} response has no message object: {shown(dict(choice))}"
        )
    return message


def _content(value: Any) -> str:
    """A string as is; content parts joined (text parts only); anything else is empty."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(t for t in texts if isinstance(t, str))
    return ""


def _tool_calls(raw: Any) -> list[ToolCall]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ResponseParseError(f"message.tool_calls must be a list, got {shown(raw)}")
    return [_tool_call(index, entry) for index, entry in enumerate(raw)]


def _tool_call(index: int, entry: Any) -> ToolCall:
    where = f"message.tool_calls[{index}]"
    if not isinstance(entry, dict):
        raise ResponseParseError(f"{where} must be an object, got {shown(entry)}")
    function = entry.get("function")
    if not isinstance(function, dict):
        raise ResponseParseError(f"{where} has no 'function' object: {shown(entry)}")
    call_id, name = entry.get("id"), function.get("name")
    missing = [
        label
        for label, value in (("id", call_id), ("function.name", name))
        if not isinstance(value, str) or not value
    ]
    if missing:
        raise ResponseParseError(f"{where} has no {' and no '.join(missing)}: {shown(entry)}")
    return ToolCall(id=call_id, name=name, arguments=_arguments(where, function.get("arguments")))


def _arguments(where: str, value: Any) -> str:
    """JSON text as sent; a JSON object (some servers send one) is re-serialised."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value if value.strip() else "{}"
    if isinstance(value, dict):
        return json.dumps(value)
    raise ResponseParseError(
        f"{where}.function.arguments must be JSON text or an object, got {shown(value)}"
    )


def _finish_reason(raw: Any, tool_calls: list[ToolCall], *, refused: bool) -> FinishReason:
    """§12: tool_calls, length, content_filter; else tool calls or stop. A refusal wins."""
    if refused:
        return FinishReason.REFUSAL
    mapped = _FINISH_REASONS.get(raw) if isinstance(raw, str) else None
    if mapped is not None:
        return mapped
    return FinishReason.TOOL_CALLS if tool_calls else FinishReason.STOP


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    prompt = json_count(raw.get("prompt_tokens"))
    completion = json_count(raw.get("completion_tokens"))
    total = json_count(raw.get("total_tokens")) or prompt + completion
    details = raw.get("prompt_tokens_details")
    cached = json_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cache_read_tokens=min(cached, prompt),
    )


def _describe(data: Mapping[str, Any]) -> str:
    return f"keys {sorted(data)}" if data else "an empty object"
