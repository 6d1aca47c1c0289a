"""The OpenAI-compatible provider against a fake chat-completions server, and its parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.conversation import Conversation, ConversationMessage
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
    ToolDefinition,
    Usage,
)
from shared.pricing import table_price
from tests.fakes.llm_server import FakeOpenAIServer, RecordingSleep, load_fixture
from workers.providers import InferenceProvider, OpenAICompatProvider
from workers.providers.base import ProviderError, ResponseParseError
from workers.providers.openai_compat import build_openai_body, parse_openai_response

KEY = "sk-test-openai-0123456789abcdef"
SEARCH = ToolDefinition(
    name="web_search",
    description="Search the web",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}},
)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A fake chat-completions server expecting ``KEY``."""
    with FakeOpenAIServer(api_key=KEY) as fake:
        yield fake
    assert not fake.errors, fake.errors


def provider_for(server: FakeOpenAIServer, **kwargs: Any) -> OpenAICompatProvider:
    """A provider pointed at ``server`` that never sleeps for real."""
    options: dict[str, Any] = {"base_url": server.base_url, "api_key": KEY}
    options.update(kwargs)
    return OpenAICompatProvider(sleep=RecordingSleep(), **options)


def complete(
    provider: InferenceProvider,
    conversation: Conversation | None = None,
    options: InferenceOptions | None = None,
) -> InferenceResponse:
    """Run one completion synchronously."""
    conv = conversation or Conversation(messages=[ConversationMessage.user("hi")])
    return asyncio.run(provider.complete(conv, options or InferenceOptions()))


def agent_conversation() -> Conversation:
    """System prompt, knowledge, user, a tool call and its result."""
    conversation = Conversation.with_system("You are a coding agent.")
    conversation.inject_knowledge_context("The project uses pytest.")
    conversation.push(ConversationMessage.user("Find rust crates"))
    call = ToolCall(id="tc1", name="web_search", arguments='{"query": "rust crates"}')
    conversation.push(ConversationMessage.assistant_tool_calls([call]))
    conversation.push(ConversationMessage.tool_result("tc1", "web_search", "serde, tokio"))
    return conversation


# -- request -------------------------------------------------------------------------------


def test_the_request_carries_model_messages_max_tokens_and_temperature(
    server: FakeOpenAIServer,
) -> None:
    """The body holds the converted messages, max_tokens and temperature, and nothing unasked."""
    server.respond_fixture("openai_text.json")
    conversation = agent_conversation()
    complete(provider_for(server), conversation, InferenceOptions(max_tokens=256, temperature=0))
    request = server.last_request
    assert request.path == "/v1/chat/completions"
    assert request.body == {
        "model": "gpt-4o",
        "messages": conversation.to_openai_messages(),
        "max_tokens": 256,
        "temperature": 0,
    }
    assert [m["role"] for m in request.body["messages"]] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
    ]


def test_the_request_sends_the_key_as_a_bearer_token_and_json(server: FakeOpenAIServer) -> None:
    """Authorization is ``Bearer <key>`` and the content type is JSON."""
    server.respond_fixture("openai_text.json")
    complete(provider_for(server))
    headers = server.last_request.headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["content-type"] == "application/json"


def test_a_keyless_provider_sends_no_authorization_header() -> None:
    """Local servers (Ollama, llama.cpp) get no Authorization header at all."""
    with FakeOpenAIServer() as server:
        server.respond_fixture("openai_text.json")
        complete(provider_for(server, api_key=None))
        assert "authorization" not in server.last_request.headers


def test_extra_headers_reach_the_server(server: FakeOpenAIServer) -> None:
    """Headers given at construction (OpenRouter's referer and title) are sent."""
    server.respond_fixture("openai_text.json")
    headers = {"HTTP-Referer": "https://example.org", "X-Title": "orga"}
    complete(provider_for(server, headers=headers, name="openrouter"))
    assert server.last_request.headers["http-referer"] == "https://example.org"
    assert server.last_request.headers["x-title"] == "orga"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (ToolChoiceAuto(), "auto"),
        (ToolChoiceAny(), "required"),
        (
            ToolChoiceTool(name="web_search"),
            {"type": "function", "function": {"name": "web_search"}},
        ),
    ],
)
def test_tools_and_tool_choice_use_the_function_shape(
    server: FakeOpenAIServer, choice: Any, expected: Any
) -> None:
    """Tools are ``{type: function, function: {...}}`` and each tool_choice maps as §12."""
    server.respond_fixture("openai_tool_call.json")
    complete(
        provider_for(server),
        options=InferenceOptions(tool_definitions=[SEARCH], tool_choice=choice),
    )
    body = server.last_request.body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "web_search",
                "description": "Search the web",
                "parameters": SEARCH.parameters,
            },
        }
    ]
    assert body["tool_choice"] == expected


def test_tool_choice_is_not_sent_without_tools(server: FakeOpenAIServer) -> None:
    """A tool_choice with no tools is dropped (the real API would answer 400)."""
    server.respond_fixture("openai_text.json")
    complete(provider_for(server), options=InferenceOptions(tool_choice=ToolChoiceAny()))
    assert "tools" not in server.last_request.body
    assert "tool_choice" not in server.last_request.body


def test_tools_without_a_choice_send_no_tool_choice(server: FakeOpenAIServer) -> None:
    """With tools and no choice, the server's default applies."""
    server.respond_fixture("openai_text.json")
    complete(provider_for(server), options=InferenceOptions(tool_definitions=[SEARCH]))
    assert "tool_choice" not in server.last_request.body


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        (ResponseFormatJsonObject(), {"type": "json_object"}),
        (
            ResponseFormatJsonSchema(schema={"type": "object"}, name="Plan"),
            {"type": "json_schema", "json_schema": {"name": "Plan", "schema": {"type": "object"}}},
        ),
        (
            ResponseFormatJsonSchema(schema={"type": "object"}),
            {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": {"type": "object"}},
            },
        ),
    ],
)
def test_response_format_is_sent_for_json_outputs(response_format: Any, expected: Any) -> None:
    """JSON object and JSON schema formats are sent; the schema name defaults to ``response``."""
    body = build_openai_body(Conversation(), InferenceOptions(response_format=response_format), "m")
    assert body["response_format"] == expected


def test_extra_options_are_merged_last(server: FakeOpenAIServer) -> None:
    """``extra`` reaches OpenAI bodies (Symbiont dropped it) and overrides computed keys."""
    server.respond_fixture("openai_text.json")
    options = InferenceOptions(temperature=0.3, extra={"seed": 7, "temperature": 0.9})
    complete(provider_for(server), options=options)
    assert server.last_request.body["seed"] == 7
    assert server.last_request.body["temperature"] == 0.9


def test_the_options_model_wins_over_the_default(server: FakeOpenAIServer) -> None:
    """``options.model`` is sent instead of the provider's default model."""
    server.respond_fixture("openai_text.json")
    provider = provider_for(server, model="gpt-4o-mini")
    complete(provider, options=InferenceOptions(model="o3"))
    assert server.last_request.body["model"] == "o3"
    assert provider.default_model() == "gpt-4o-mini"


# -- reply ---------------------------------------------------------------------------------


def test_a_text_reply_is_parsed(server: FakeOpenAIServer) -> None:
    """Content, usage 10/5/15, the served model and finish STOP come from the reply."""
    server.respond_fixture("openai_text.json")
    response = complete(provider_for(server))
    assert response == InferenceResponse(
        content="Hello!",
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15),
        model="gpt-4o-2024-08-06",
    )


def test_the_recorded_tool_call_is_parsed(server: FakeOpenAIServer) -> None:
    """§13.15: call_abc123 web_search with string arguments, TOOL_CALLS, usage 20/10/30."""
    server.respond_fixture("openai_tool_call.json")
    response = complete(provider_for(server), options=InferenceOptions(tool_definitions=[SEARCH]))
    assert response.tool_calls == [
        ToolCall(id="call_abc123", name="web_search", arguments='{"query": "rust crates"}')
    ]
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.content == ""
    assert response.usage == Usage(prompt_tokens=20, completion_tokens=10, total_tokens=30)
    assert response.model == "gpt-4o"


def test_object_arguments_are_reserialised_not_dropped() -> None:
    """Arguments sent as a JSON object (some local servers) become JSON text."""
    response = parse_openai_response(load_fixture("openai_compat_object_arguments.json"), "m")
    assert len(response.tool_calls) == 1
    assert json.loads(response.tool_calls[0].arguments) == {"path": "README.md", "max_bytes": 4096}
    assert response.usage == Usage(prompt_tokens=112, completion_tokens=24, total_tokens=136)


@pytest.mark.parametrize(
    ("fixture", "finish", "content"),
    [
        ("openai_text.json", FinishReason.STOP, "Hello!"),
        ("openai_tool_call.json", FinishReason.TOOL_CALLS, ""),
        (
            "openai_length.json",
            FinishReason.MAX_TOKENS,
            "The first part of a long answer that was cut",
        ),
        ("openai_content_filter.json", FinishReason.CONTENT_FILTER, ""),
        ("openai_refusal.json", FinishReason.REFUSAL, "I'm sorry, I can't help with that request."),
    ],
)
def test_every_recorded_finish_reason_is_mapped(
    server: FakeOpenAIServer, fixture: str, finish: FinishReason, content: str
) -> None:
    """stop, tool_calls, length, content_filter and a refusal map as §12 (refusal fixed)."""
    server.respond_fixture(fixture)
    response = complete(provider_for(server))
    assert response.finish_reason is finish
    assert response.content == content


def completion(
    message: dict[str, Any], finish_reason: Any = "stop", **extra: Any
) -> dict[str, Any]:
    """A minimal chat-completions reply around ``message``."""
    return {
        "model": "gpt-4o",
        "choices": [{"message": message, "finish_reason": finish_reason}],
        **extra,
    }


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("finish_reason", "tool_calls", "expected"),
    [
        ("tool_calls", [CALL], FinishReason.TOOL_CALLS),
        ("length", [], FinishReason.MAX_TOKENS),
        ("content_filter", [], FinishReason.CONTENT_FILTER),
        ("stop", [], FinishReason.STOP),
        ("stop", [CALL], FinishReason.TOOL_CALLS),
        (None, [], FinishReason.STOP),
        (None, [CALL], FinishReason.TOOL_CALLS),
        ("function_call", [CALL], FinishReason.TOOL_CALLS),
        ("eos", [], FinishReason.STOP),
    ],
)
def test_finish_reason_table(
    finish_reason: Any, tool_calls: list[Any], expected: FinishReason
) -> None:
    """Known reasons map directly; anything else depends on whether tool calls were parsed."""
    message = {"role": "assistant", "content": "x", "tool_calls": tool_calls}
    assert parse_openai_response(completion(message, finish_reason), "m").finish_reason is expected


def test_a_refusal_with_content_keeps_the_content() -> None:
    """When both are set, the content is kept and the finish reason is still REFUSAL."""
    message = {"role": "assistant", "content": "Partial", "refusal": "No."}
    response = parse_openai_response(completion(message), "m")
    assert (response.content, response.finish_reason) == ("Partial", FinishReason.REFUSAL)


@pytest.mark.parametrize(
    ("entry", "missing"),
    [
        ({"type": "function", "function": {"name": "f", "arguments": "{}"}}, "no id"),
        ({"id": "c1", "type": "function", "function": {"arguments": "{}"}}, "no function.name"),
        ({"id": "", "function": {"name": "", "arguments": "{}"}}, "no id and no function.name"),
    ],
)
def test_a_tool_call_without_id_or_name_is_a_parse_error(
    entry: dict[str, Any], missing: str
) -> None:
    """Symbiont skipped such entries silently; here the error names what is missing."""
    message = {"role": "assistant", "content": None, "tool_calls": [CALL, entry]}
    with pytest.raises(ResponseParseError, match=r"message\.tool_calls\[1\] has " + missing):
        parse_openai_response(completion(message, "tool_calls"), "m")


@pytest.mark.parametrize(
    ("tool_calls", "match"),
    [
        ({"id": "c1"}, "must be a list"),
        (["call"], r"tool_calls\[0\] must be an object"),
        ([{"id": "c1", "function": "f"}], "no 'function' object"),
        ([{"id": "c1", "function": {"name": "f", "arguments": 3}}], "JSON text or an object"),
    ],
)
def test_malformed_tool_calls_are_parse_errors(tool_calls: Any, match: str) -> None:
    """Wrong shapes in tool_calls name the offending entry."""
    message = {"role": "assistant", "tool_calls": tool_calls}
    with pytest.raises(ResponseParseError, match=match):
        parse_openai_response(completion(message), "m")


@pytest.mark.parametrize("arguments", [None, "", "  "])
def test_absent_arguments_become_an_empty_object(arguments: Any) -> None:
    """Null or blank arguments are ``{}``, which every tool schema can read."""
    call = {"id": "c1", "function": {"name": "f", "arguments": arguments}}
    response = parse_openai_response(completion({"tool_calls": [call]}), "m")
    assert response.tool_calls[0].arguments == "{}"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, ""),
        ("text", "text"),
        (
            [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}],
            "ab",
        ),
        (42, ""),
    ],
)
def test_content_is_a_string_or_joined_text_parts(content: Any, expected: str) -> None:
    """Null content is empty; content-part arrays keep their text parts."""
    assert parse_openai_response(completion({"content": content}), "m").content == expected


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({}, "no choices in the openai response: an empty object"),
        ({"choices": []}, "no choices"),
        ({"choices": [{"finish_reason": "stop"}]}, "has no message object"),
    ],
)
def test_replies_without_a_message_are_parse_errors(data: dict[str, Any], match: str) -> None:
    """Missing choices or message give ResponseParseError."""
    with pytest.raises(ResponseParseError, match=match):
        parse_openai_response(data, "m")


def test_an_error_object_in_a_200_reply_is_a_provider_error() -> None:
    """OpenRouter can answer 200 with ``{error: {...}}``; that is the provider failing."""
    data = {"error": {"message": "Upstream timed out", "code": 502}}
    with pytest.raises(ProviderError, match="Upstream timed out"):
        parse_openai_response(data, "m", provider="openrouter")


def test_usage_defaults_and_model_fallback() -> None:
    """No usage gives zeros; no model in the reply gives the requested model."""
    response = parse_openai_response({"choices": [{"message": {"content": "x"}}]}, "requested")
    assert response.usage == Usage()
    assert response.model == "requested"


def test_cached_prompt_tokens_are_read_for_pricing() -> None:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's automatic prompt caching) is the
    part of the prompt read from the cache; it is priced at the table's cache-read rate."""
    usage = {"prompt_tokens": 2000, "completion_tokens": 10, "total_tokens": 2010,
             "prompt_tokens_details": {"cached_tokens": 1536}}  # fmt: skip
    data = {"choices": [{"message": {"content": "x"}}], "usage": usage}
    response = parse_openai_response(data, "gpt-4o")
    assert response.usage == Usage(
        prompt_tokens=2000, completion_tokens=10, total_tokens=2010, cache_read_tokens=1536
    )
    price = table_price("gpt-4o", "openai")
    assert price is not None and price.cache_read_per_mtok == 1.25
    assert price.cost(response.usage) == pytest.approx((464 * 2.5 + 1536 * 1.25 + 10 * 10) / 1e6)
    junk = {**usage, "prompt_tokens_details": {"cached_tokens": "many"}}
    assert parse_openai_response({**data, "usage": junk}, "m").usage.cache_read_tokens == 0


def test_the_provider_implements_the_protocol_and_hides_the_key() -> None:
    """It is an InferenceProvider; repr names the endpoint, never the key."""
    provider = OpenAICompatProvider(api_key=KEY, name="openrouter", model="m")
    assert isinstance(provider, InferenceProvider)
    assert (provider.provider_name(), provider.default_model()) == ("openrouter", "m")
    assert KEY not in repr(provider)
    assert "api_key=set" in repr(provider)


def test_a_base_url_with_a_trailing_slash_is_joined_by_one_slash(server: FakeOpenAIServer) -> None:
    """``base_url/`` and ``chat/completions`` make ``/v1/chat/completions`` on the wire (the
    fake server answers 404 to any other path)."""
    server.respond_fixture("openai_text.json")
    provider = OpenAICompatProvider(base_url=f"{server.base_url}/", api_key=KEY)
    assert complete(provider).content == "Hello!"
    assert server.last_request.path == "/v1/chat/completions"
