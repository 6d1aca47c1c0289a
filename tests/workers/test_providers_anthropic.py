"""The Anthropic provider against a fake Messages API server, and its parser."""

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
    ToolCall,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceTool,
    ToolDefinition,
    Usage,
)
from tests.fakes.llm_server import FakeAnthropicServer, RecordingSleep, load_fixture
from workers.providers import AnthropicProvider, InferenceProvider
from workers.providers.anthropic import (
    build_anthropic_body,
    map_anthropic_stop_reason,
    parse_anthropic_response,
)
from workers.providers.base import ProviderError, ResponseParseError

KEY = "sk-ant-test-0123456789abcdef"
SEARCH = ToolDefinition(
    name="web_search",
    description="Search the web",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}},
)
READ = ToolDefinition(name="file_read", description="Read a file")
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def server() -> Iterator[FakeAnthropicServer]:
    """A fake Messages API server expecting ``KEY``."""
    with FakeAnthropicServer(api_key=KEY) as fake:
        yield fake
    assert not fake.errors, fake.errors


def provider_for(server: FakeAnthropicServer, **kwargs: Any) -> AnthropicProvider:
    """A provider pointed at ``server`` that never sleeps for real."""
    options: dict[str, Any] = {"base_url": server.base_url, "api_key": KEY}
    options.update(kwargs)
    return AnthropicProvider(sleep=RecordingSleep(), **options)


def complete(
    provider: InferenceProvider,
    conversation: Conversation | None = None,
    options: InferenceOptions | None = None,
) -> InferenceResponse:
    """Run one completion synchronously."""
    conv = conversation or Conversation(messages=[ConversationMessage.user("hi")])
    return asyncio.run(provider.complete(conv, options or InferenceOptions()))


def agent_conversation() -> Conversation:
    """System prompt, knowledge, user, a tool call with its result, and a late system note."""
    conversation = Conversation.with_system("You are a coding agent.")
    conversation.inject_knowledge_context("The project uses pytest.")
    conversation.push(ConversationMessage.user("Find rust crates"))
    call = ToolCall(id="toolu_1", name="web_search", arguments='{"query": "rust crates"}')
    conversation.push(ConversationMessage.assistant_tool_calls([call], "Searching."))
    conversation.push(ConversationMessage.tool_result("toolu_1", "web_search", "serde, tokio"))
    conversation.push(ConversationMessage.system("[PRE_HYDRATED_CONTEXT]\nREADME: hello"))
    return conversation


# -- request -------------------------------------------------------------------------------


def test_every_system_message_reaches_the_system_prompt(server: FakeAnthropicServer) -> None:
    """The system prompt, knowledge and pre-hydrated context all reach Anthropic (§6.3 fixed)."""
    server.respond_fixture("anthropic_text.json")
    complete(provider_for(server), agent_conversation())
    system = server.last_request.body["system"]
    assert len(system) == 1
    text = system[0]["text"]
    assert text.startswith("You are a coding agent.")
    assert "[KNOWLEDGE_CONTEXT]\nThe project uses pytest." in text
    assert text.endswith("[PRE_HYDRATED_CONTEXT]\nREADME: hello")
    assert system[0]["cache_control"] == EPHEMERAL


def test_tool_calls_and_results_use_tool_use_and_tool_result_blocks(
    server: FakeAnthropicServer,
) -> None:
    """Messages alternate user/assistant; the call is tool_use, its result a tool_result."""
    server.respond_fixture("anthropic_text.json")
    complete(provider_for(server), agent_conversation())
    messages = server.last_request.body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Searching."},
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "web_search",
            "input": {"query": "rust crates"},
        },
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "serde, tokio"}
    ]


def test_temperature_zero_is_sent_as_zero(server: FakeAnthropicServer) -> None:
    """Symbiont skipped temperature 0 (so the API used 1.0); it is sent here."""
    server.respond_fixture("anthropic_text.json")
    complete(provider_for(server), options=InferenceOptions(temperature=0.0, max_tokens=321))
    body = server.last_request.body
    assert "temperature" in body
    assert body["temperature"] == 0
    assert body["max_tokens"] == 321
    assert body["model"] == "claude-sonnet-4-20250514"


def test_the_request_headers_carry_the_key_and_version(server: FakeAnthropicServer) -> None:
    """``x-api-key`` and ``anthropic-version: 2023-06-01``; no bearer token."""
    server.respond_fixture("anthropic_text.json")
    complete(provider_for(server))
    headers = server.last_request.headers
    assert server.last_request.path == "/v1/messages"
    assert headers["x-api-key"] == KEY
    assert headers["anthropic-version"] == "2023-06-01"
    assert headers["content-type"] == "application/json"
    assert "authorization" not in headers


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (ToolChoiceAuto(), {"type": "auto"}),
        (ToolChoiceAny(), {"type": "any"}),
        (ToolChoiceTool(name="web_search"), {"type": "tool", "name": "web_search"}),
    ],
)
def test_tools_use_input_schema_and_tool_choice_maps(
    server: FakeAnthropicServer, choice: Any, expected: Any
) -> None:
    """Tools are ``{name, description, input_schema}``; tool_choice maps auto/any/tool."""
    server.respond_fixture("anthropic_tool_use.json")
    options = InferenceOptions(tool_definitions=[SEARCH], tool_choice=choice)
    complete(provider_for(server), Conversation.with_system("sys"), options)
    body = server.last_request.body
    assert body["tools"] == [
        {"name": "web_search", "description": "Search the web", "input_schema": SEARCH.parameters}
    ]
    assert body["tool_choice"] == expected


def test_no_tool_choice_without_tools() -> None:
    """A tool_choice with no tools is not sent."""
    options = InferenceOptions(tool_choice=ToolChoiceAny())
    body = build_anthropic_body(Conversation(), options, "m")
    assert "tools" not in body
    assert "tool_choice" not in body


def test_without_a_system_prompt_the_last_tool_is_cached() -> None:
    """§13.15: no ``system`` key, and only the last tool carries cache_control."""
    conversation = Conversation(messages=[ConversationMessage.user("hi")])
    body = build_anthropic_body(
        conversation, InferenceOptions(tool_definitions=[SEARCH, READ]), "m"
    )
    assert "system" not in body
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == EPHEMERAL


def test_with_a_system_prompt_no_tool_is_cached() -> None:
    """§13.15: the system block carries cache_control, the tools do not."""
    options = InferenceOptions(tool_definitions=[SEARCH])
    body = build_anthropic_body(Conversation.with_system("sys"), options, "m")
    assert body["system"] == [{"type": "text", "text": "sys", "cache_control": EPHEMERAL}]
    assert "cache_control" not in body["tools"][0]


def test_prompt_caching_can_be_turned_off() -> None:
    """Without prompt caching no block is marked."""
    options = InferenceOptions(tool_definitions=[SEARCH])
    body = build_anthropic_body(Conversation(), options, "m", prompt_caching=False)
    assert "cache_control" not in body["tools"][0]
    with_system = build_anthropic_body(
        Conversation.with_system("s"), options, "m", prompt_caching=False
    )
    assert with_system["system"] == [{"type": "text", "text": "s"}]


def test_extra_is_merged_last(server: FakeAnthropicServer) -> None:
    """§13.15: ``output_config`` from extra reaches the body; extra overrides computed keys."""
    server.respond_fixture("anthropic_text.json")
    options = InferenceOptions(extra={"output_config": {"effort": "high"}, "max_tokens": 99})
    complete(provider_for(server), options=options)
    assert server.last_request.body["output_config"] == {"effort": "high"}
    assert server.last_request.body["max_tokens"] == 99


def test_response_format_is_not_sent() -> None:
    """The Messages API has no response_format; none is sent."""
    options = InferenceOptions(response_format=ResponseFormatJsonObject())
    assert "response_format" not in build_anthropic_body(Conversation(), options, "m")


# -- reply ---------------------------------------------------------------------------------


def test_the_recorded_tool_use_reply_is_parsed(server: FakeAnthropicServer) -> None:
    """§13.15: text, one call with JSON arguments, TOOL_CALLS, usage 15/20/35."""
    server.respond_fixture("anthropic_tool_use.json")
    response = complete(provider_for(server))
    assert response.content == "I'll search for that."
    assert response.tool_calls == [
        ToolCall(id="toolu_123", name="web_search", arguments=json.dumps({"query": "rust crates"}))
    ]
    assert json.loads(response.tool_calls[0].arguments) == {"query": "rust crates"}
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.usage == Usage(prompt_tokens=15, completion_tokens=20, total_tokens=35)
    assert response.model == "claude-sonnet-4-20250514"


def test_a_text_reply_is_parsed(server: FakeAnthropicServer) -> None:
    """A single text block with end_turn is a STOP reply."""
    server.respond_fixture("anthropic_text.json")
    response = complete(provider_for(server))
    assert response.content == "Hello! How can I help you today?"
    assert response.finish_reason is FinishReason.STOP
    assert response.usage == Usage(prompt_tokens=12, completion_tokens=12, total_tokens=24)


def test_text_blocks_are_joined_and_cache_tokens_counted() -> None:
    """Text blocks join with a newline, thinking is skipped, cached input counts as prompt."""
    response = parse_anthropic_response(load_fixture("anthropic_max_tokens.json"), "m")
    assert response.content == "The first part of a long\nanswer that was cut"
    assert response.finish_reason is FinishReason.MAX_TOKENS
    assert response.usage == Usage(
        prompt_tokens=2600,
        completion_tokens=64,
        total_tokens=2664,
        cache_write_tokens=2000,
        cache_read_tokens=500,
    )


def test_a_refusal_is_mapped(server: FakeAnthropicServer) -> None:
    """stop_reason refusal gives REFUSAL and empty content."""
    server.respond_fixture("anthropic_refusal.json")
    response = complete(provider_for(server))
    assert (response.content, response.finish_reason) == ("", FinishReason.REFUSAL)


@pytest.mark.parametrize(
    ("stop_reason", "has_calls", "expected"),
    [
        ("refusal", False, FinishReason.REFUSAL),
        ("refusal", True, FinishReason.REFUSAL),
        ("tool_use", False, FinishReason.TOOL_CALLS),
        ("max_tokens", False, FinishReason.MAX_TOKENS),
        ("model_context_window_exceeded", False, FinishReason.MAX_TOKENS),
        ("end_turn", True, FinishReason.TOOL_CALLS),
        ("end_turn", False, FinishReason.STOP),
        ("pause_turn", False, FinishReason.STOP),
        ("stop_sequence", False, FinishReason.STOP),
        (None, False, FinishReason.STOP),
        (None, True, FinishReason.TOOL_CALLS),
    ],
)
def test_stop_reason_table(
    stop_reason: str | None, has_calls: bool, expected: FinishReason
) -> None:
    """§13.15's table, plus a missing value (end_turn) and the context-window stop."""
    assert map_anthropic_stop_reason(stop_reason, has_calls) is expected


def message(*blocks: dict[str, Any], stop_reason: str = "end_turn") -> dict[str, Any]:
    """A minimal Messages API reply."""
    return {"type": "message", "content": list(blocks), "stop_reason": stop_reason}


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ({"type": "tool_use", "name": "f", "input": {}}, r"content\[0\] \(tool_use\) has no id"),
        ({"type": "tool_use", "id": "t1", "input": {}}, r"has no name"),
        ({"type": "tool_use", "id": "t1", "name": "f", "input": [1]}, "input must be an object"),
    ],
)
def test_malformed_tool_use_blocks_are_parse_errors(block: dict[str, Any], match: str) -> None:
    """A tool_use block without id or name, or with a non-object input, names the problem."""
    with pytest.raises(ResponseParseError, match=match):
        parse_anthropic_response(message(block, stop_reason="tool_use"), "m")


def test_a_tool_use_without_input_has_empty_arguments() -> None:
    """A missing input is an empty object."""
    response = parse_anthropic_response(message({"type": "tool_use", "id": "t", "name": "f"}), "m")
    assert response.tool_calls == [ToolCall(id="t", name="f", arguments="{}")]


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        ({"type": "message"}, ResponseParseError, "no content list"),
        ({"content": ["text"]}, ResponseParseError, r"content\[0\] must be an object"),
        (load_fixture("anthropic_error_overloaded.json"), ProviderError, "Overloaded"),
    ],
)
def test_replies_that_are_not_messages_fail_clearly(
    data: dict[str, Any], error: type[Exception], match: str
) -> None:
    """No content list is a parse error; an error object in a 200 is a provider error."""
    with pytest.raises(error, match=match):
        parse_anthropic_response(data, "m")


def test_the_provider_implements_the_protocol_and_hides_the_key() -> None:
    """It is an InferenceProvider; repr never shows the key."""
    provider = AnthropicProvider(api_key=KEY)
    assert isinstance(provider, InferenceProvider)
    assert provider.provider_name() == "anthropic"
    assert provider.default_model() == "claude-sonnet-4-20250514"
    assert KEY not in repr(provider)
