"""One contract suite run against every provider: the loop can rely on these behaviours."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.inference import (
    FinishReason,
    InferenceOptions,
    InferenceResponse,
    ToolCall,
    ToolDefinition,
    Usage,
)
from tests.fakes.llm_server import FakeAnthropicServer, FakeOpenAIServer, RecordingSleep
from workers.providers import (
    AnthropicProvider,
    FunctionProvider,
    InferenceProvider,
    OpenAICompatProvider,
    ScriptedProvider,
)

KEY = "sk-contract-test"
READ = ToolDefinition(
    name="file_read",
    description="Read a file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)

# A factory takes an ExitStack (to start servers) and returns a provider whose first reply
# asks for file_read {"path": "README.md"} and whose second reply is the text "Done.".
ProviderFactory = Callable[[ExitStack], InferenceProvider]


def scripted(stack: ExitStack) -> InferenceProvider:
    """The scripted provider with the two replies."""
    return ScriptedProvider.from_replies(
        [{"tool_calls": [{"name": "file_read", "arguments": {"path": "README.md"}}]}, "Done."]
    )


def function(stack: ExitStack) -> InferenceProvider:
    """A function provider deciding from the conversation."""

    def reply(conversation: Conversation, options: InferenceOptions) -> InferenceResponse | str:
        if any(m.tool_call_id for m in conversation.messages):
            return "Done."
        call = ToolCall(id="fn_1", name="file_read", arguments='{"path": "README.md"}')
        return InferenceResponse(
            tool_calls=[call], finish_reason=FinishReason.TOOL_CALLS, usage=Usage(total_tokens=1)
        )

    return FunctionProvider(reply)


def openai(stack: ExitStack) -> InferenceProvider:
    """The OpenAI-compatible provider on a fake server."""
    server = stack.enter_context(FakeOpenAIServer(api_key=KEY))
    server.respond_tool_calls([("call_1", "file_read", {"path": "README.md"})])
    server.respond_text("Done.")
    return OpenAICompatProvider(base_url=server.base_url, api_key=KEY, sleep=RecordingSleep())


def anthropic(stack: ExitStack) -> InferenceProvider:
    """The Anthropic provider on a fake server."""
    server = stack.enter_context(FakeAnthropicServer(api_key=KEY))
    server.respond_tool_use([("toolu_1", "file_read", {"path": "README.md"})])
    server.respond_text("Done.")
    return AnthropicProvider(base_url=server.base_url, api_key=KEY, sleep=RecordingSleep())


@pytest.fixture(params=[scripted, function, openai, anthropic], ids=lambda f: f.__name__)
def provider(request: pytest.FixtureRequest) -> Iterator[InferenceProvider]:
    """Each provider, programmed with the same two-turn exchange."""
    with ExitStack() as stack:
        yield request.param(stack)


def test_it_satisfies_the_protocol(provider: InferenceProvider) -> None:
    """Every provider is an InferenceProvider with a name and a default model."""
    assert isinstance(provider, InferenceProvider)
    assert provider.provider_name()
    assert provider.default_model()


def test_a_tool_call_round_trip(provider: InferenceProvider) -> None:
    """Turn one asks for a tool with JSON arguments; after the result, turn two answers."""
    conversation = Conversation.with_system("You are an agent.")
    conversation.push(ConversationMessage.user("Read the README"))
    options = InferenceOptions(tool_definitions=[READ], temperature=0)

    first = asyncio.run(provider.complete(conversation, options))
    assert first.has_tool_calls()
    assert first.finish_reason is FinishReason.TOOL_CALLS
    (call,) = first.tool_calls
    assert call.name == "file_read"
    assert json.loads(call.arguments) == {"path": "README.md"}

    conversation.push(ConversationMessage.assistant_tool_calls(first.tool_calls, first.content))
    conversation.push(ConversationMessage.tool_result(call.id, call.name, "# Hello"))
    second = asyncio.run(provider.complete(conversation, options))
    assert second.content == "Done."
    assert not second.has_tool_calls()
    assert second.finish_reason is FinishReason.STOP
