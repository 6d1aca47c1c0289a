"""A model key a tool prints, in any encoding or cut short, is redacted before it leaves the
worker: the observation the conversation and the journal get, its metadata, and failures."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from shared.actions import Observation
from shared.conversation import Conversation, ConversationMessage
from shared.events import RecoveryTriggered
from shared.loop_types import LoopConfig, Retry
from shared.protocol import ActMode, Fence, ReasonedMessage, ReasonRequest, ToolObservedMessage
from shared.redaction import REDACTED, Redactor
from shared.task_spec import ProviderSpec
from workers.handlers import redacted, run_reasoning
from workers.providers.settings import ProviderSettings
from workers.runtime import local_core

KEY = "sk-proj-Q7vX2mZp9LwK4tRb8NcYHs1Ue0"


def _request(workspace: Path, call: dict[str, Any]) -> ReasonRequest:
    conversation = Conversation()
    conversation.push(ConversationMessage.user("Goal: g"))
    return ReasonRequest(
        fence=Fence(task_id="t", step_id="s", iteration=0, attempt=1),
        agent_id="a",
        conversation=conversation,
        config=LoopConfig(),
        provider=ProviderSpec(kind="scripted", replies=[{"tool_calls": [call]}]),
        workspace=str(workspace),
        act=ActMode.INLINE,
        policy={"kind": "permissive"},
    )


def _reason(request: ReasonRequest) -> ReasonedMessage:
    async def go() -> ReasonedMessage:
        core = local_core(provider_settings=ProviderSettings(provider="openai", api_key=KEY))
        try:
            return await run_reasoning(request, core)
        finally:
            await core.aclose()

    return asyncio.run(go())


def test_a_key_a_tool_shows_never_reaches_the_observation(tmp_path: Path) -> None:
    """The worker's key, in a file a tool reads raw, base64, hex, upper-cased and cut short,
    is redacted. (A command never runs next to the key: ``tool_dispatch: inline`` sends
    ``run_command`` to a tool worker, which holds none; a file tool runs here.)"""
    echoes = [
        KEY,
        base64.b64encode(KEY.encode()).decode(),
        KEY.encode().hex(),
        KEY.upper(),
        KEY[:16],
    ]
    (tmp_path / "leaked.txt").write_text("\n".join(echoes) + "\n")
    call = {"name": "file_read", "arguments": {"path": "leaked.txt"}}
    reasoned = _reason(_request(tmp_path, call))
    assert reasoned.acted is not None
    content = reasoned.acted[0].observation.content
    assert content.count(REDACTED) == 5, content
    for piece in (KEY[:12], base64.b64encode(KEY.encode()).decode()[:16], KEY.encode().hex()[:24]):
        assert piece.lower() not in content.lower(), content


def test_every_text_of_a_tool_answer_is_redacted() -> None:
    """Content, metadata, recovery errors and the escalation reason are all redacted."""
    message = ToolObservedMessage(
        fence=Fence(task_id="t", step_id="s", iteration=0, attempt=1),
        observation=Observation(source="x", content=f"out {KEY}", metadata={"stderr": KEY}),
        recovery_events=[
            RecoveryTriggered(iteration=0, tool_name="x", strategy=Retry(), error=KEY.upper())
        ],
        escalation_reason=f"x: {KEY[:14]}",
    )
    clean = redacted(message, Redactor([KEY]))
    assert clean.observation.content == f"out {REDACTED}"
    assert clean.observation.metadata == {"stderr": REDACTED}
    assert clean.recovery_events[0].error == REDACTED
    assert clean.escalation_reason == f"x: {REDACTED}"
    assert KEY not in clean.model_dump_json()
