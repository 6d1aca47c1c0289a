"""Review of branch ``worker``: what "at most 16 KiB of text" bounds in a reasoning request."""

from __future__ import annotations

import json

import pytest

from coordinator.machine.reasoning import TAIL_MAX_CHARS, conversation_tail
from shared.conversation import ConversationMessage
from shared.protocol import ConversationRef


def _wire_bytes(messages: list[ConversationMessage]) -> int:
    """The tail's bytes in the Celery message the relay sends (the request's JSON is the one
    argument of the task, serialized again by kombu's JSON)."""
    tail = conversation_tail(messages)
    ref = ConversationRef(length=len(messages), tail=tail)
    return len(json.dumps([ref.model_dump_json()]).encode())


@pytest.mark.parametrize("text", ["é" * 16_000, "😀" * 16_000])
def test_a_tail_of_non_ascii_text_stays_within_16_kib(text: str) -> None:
    """docs/protocol.md and docs/performance.md: the tail is carried "when that holds at most
    16 KiB of text". 16,000 characters of non-ASCII text are 32 or 64 KB of UTF-8, and 96 or
    192 KB once the request is a task argument: the tail should not be carried then."""
    messages = [
        ConversationMessage.user("goal"),
        ConversationMessage.assistant("reading"),
        ConversationMessage.tool_result("call_1", "file_read", text),
    ]
    assert _wire_bytes(messages) <= 2 * TAIL_MAX_CHARS


def test_a_tail_of_many_empty_results_stays_within_16_kib() -> None:
    """Empty contents count nothing: a turn of 2,000 calls whose results are empty is a
    220 KB tail, carried whole."""
    calls = [
        ConversationMessage.tool_result(f"call_{i:04d}", "file_write", "") for i in range(2_000)
    ]
    messages = [ConversationMessage.user("goal"), ConversationMessage.assistant("writing"), *calls]
    assert _wire_bytes(messages) <= 2 * TAIL_MAX_CHARS
