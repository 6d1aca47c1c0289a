"""Live checks against a real provider; skipped unless an API key is set in the environment.

Set ``ORGA_LIVE_API_KEY`` with ``ORGA_LIVE_PROVIDER`` (``openai``, default, ``openrouter`` or
``anthropic``), and optionally ``ORGA_LIVE_MODEL`` / ``ORGA_LIVE_BASE_URL``; or set one of
``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``OPENROUTER_API_KEY``. Without any of them every
test here is skipped (CI included): that skip is intended.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.inference import FinishReason, InferenceOptions, ToolChoiceTool, ToolDefinition
from workers.providers import InferenceProvider, ProviderSettings, build_provider

_CONVENTIONAL = (
    ("openai", "OPENAI_API_KEY"),
    ("anthropic", "ANTHROPIC_API_KEY"),
    ("openrouter", "OPENROUTER_API_KEY"),
)


def _live_settings() -> ProviderSettings | None:
    """Settings for the live provider the environment names, or None."""
    key = os.environ.get("ORGA_LIVE_API_KEY", "").strip()
    if key:
        return ProviderSettings(
            provider=os.environ.get("ORGA_LIVE_PROVIDER", "openai"),
            api_key=key,
            model=os.environ.get("ORGA_LIVE_MODEL") or None,
            base_url=os.environ.get("ORGA_LIVE_BASE_URL") or None,
            max_retries=2,
            timeout_s=60,
        )
    for provider, variable in _CONVENTIONAL:
        conventional = os.environ.get(variable, "").strip()
        if conventional:
            return ProviderSettings(
                provider=provider, api_key=conventional, max_retries=2, timeout_s=60
            )
    return None


LIVE = _live_settings()

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        LIVE is None,
        reason="live provider tests need ORGA_LIVE_API_KEY (with ORGA_LIVE_PROVIDER) or "
        "OPENAI_API_KEY / ANTHROPIC_API_KEY / OPENROUTER_API_KEY",
    ),
]


@pytest.fixture
def provider() -> InferenceProvider:
    """The live provider."""
    assert LIVE is not None
    return build_provider(LIVE)


def test_a_real_model_answers_text(provider: InferenceProvider) -> None:
    """A deterministic one-word answer comes back with usage."""
    conversation = Conversation.with_system("Answer with exactly one lowercase word.")
    conversation.push(ConversationMessage.user("Reply with the word: pong"))
    response = asyncio.run(
        provider.complete(conversation, InferenceOptions(temperature=0, max_tokens=16))
    )
    assert "pong" in response.content.lower()
    assert response.usage.total_tokens > 0
    assert response.finish_reason is FinishReason.STOP


def test_a_real_model_calls_a_forced_tool(provider: InferenceProvider) -> None:
    """With tool_choice naming a tool, the reply is that tool call with JSON arguments."""
    tool = ToolDefinition(
        name="get_weather",
        description="Current weather for a city",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    )
    conversation = Conversation(messages=[ConversationMessage.user("Weather in Paris?")])
    options = InferenceOptions(
        temperature=0,
        max_tokens=128,
        tool_definitions=[tool],
        tool_choice=ToolChoiceTool(name="get_weather"),
    )
    response = asyncio.run(provider.complete(conversation, options))
    assert response.tool_calls
    assert response.tool_calls[0].name == "get_weather"
    assert "paris" in json.loads(response.tool_calls[0].arguments)["city"].lower()
