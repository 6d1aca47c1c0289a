"""The function provider wraps sync and async functions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.inference import (
    FinishReason,
    InferenceOptions,
    InferenceResponse,
    ToolCall,
)
from workers.providers import FunctionProvider, InferenceProvider


def complete(
    provider: InferenceProvider, options: InferenceOptions | None = None
) -> InferenceResponse:
    """Run one completion on a one-message conversation."""
    conversation = Conversation(messages=[ConversationMessage.user("ping")])
    return asyncio.run(provider.complete(conversation, options or InferenceOptions()))


def test_a_sync_function_returning_text_gives_a_text_reply() -> None:
    """A str result is a STOP reply with that content and the provider's model."""
    provider = FunctionProvider(lambda conversation, options: "pong", model="fn-model")
    response = complete(provider)
    assert response == InferenceResponse(content="pong", model="fn-model")


def test_an_async_function_returning_a_response_is_awaited() -> None:
    """An async function's InferenceResponse is returned unchanged."""
    call = ToolCall(id="c1", name="f", arguments="{}")

    async def reply(conversation: Conversation, options: InferenceOptions) -> InferenceResponse:
        await asyncio.sleep(0)
        return InferenceResponse(tool_calls=[call], finish_reason=FinishReason.TOOL_CALLS)

    response = complete(FunctionProvider(reply))
    assert response.tool_calls == [call]


def test_the_function_sees_the_conversation_and_options() -> None:
    """The reply can depend on what the model was sent."""

    def echo(conversation: Conversation, options: InferenceOptions) -> str:
        last = conversation.last_user_message()
        return f"{last.content if last else ''}:{options.max_tokens}"

    assert complete(FunctionProvider(echo), InferenceOptions(max_tokens=7)).content == "ping:7"


def test_text_replies_report_the_options_model() -> None:
    """options.model wins for text replies."""
    provider = FunctionProvider(lambda c, o: "x")
    assert complete(provider, InferenceOptions(model="m2")).model == "m2"


def test_a_wrong_return_type_is_a_type_error() -> None:
    """Returning anything else says what to return."""
    bad: Any = lambda conversation, options: 42  # noqa: E731
    with pytest.raises(TypeError, match="returned int; return an InferenceResponse or a str"):
        complete(FunctionProvider(bad))


def test_it_implements_the_protocol() -> None:
    """FunctionProvider is an InferenceProvider with a configurable name."""
    provider = FunctionProvider(lambda c, o: "", name="fake", model="m")
    assert isinstance(provider, InferenceProvider)
    assert (provider.provider_name(), provider.default_model()) == ("fake", "m")
    assert "name='fake'" in repr(provider)
