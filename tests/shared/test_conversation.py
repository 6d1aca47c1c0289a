"""Conversation: token estimates, provider formats and budget truncation (Symbiont §6, §13.12)."""

from __future__ import annotations

import pytest

from shared.conversation import (
    KNOWLEDGE_CONTEXT_MARKER,
    Conversation,
    ConversationMessage,
    MessageRole,
    estimate_message_tokens,
    tool_groups,
)
from shared.inference import ToolCall

Msg = ConversationMessage


def _call(call_id: str, name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def _twenty_rounds() -> Conversation:
    conv = Conversation.with_system("sys")
    for i in range(20):
        conv.push(Msg.user(f"Message number {i} with some extra text to take up tokens"))
        conv.push(Msg.assistant(f"Reply {i}"))
    return conv


def _eight_tool_rounds() -> Conversation:
    conv = Conversation.with_system("sys")
    for i in range(8):
        conv.push(Msg.user(f"Ask {i} with enough characters to consume tokens for the budget test"))
        conv.push(Msg.assistant_tool_calls([_call(f"call_{i}", "search", f'{{"q":"query {i}"}}')]))
        conv.push(
            Msg.tool_result(
                f"call_{i}",
                "search",
                f"Long result text for tool call {i}. Lorem ipsum dolor sit amet, consectetur "
                "adipiscing elit, sed do eiusmod tempor incididunt.",
            )
        )
        conv.push(Msg.assistant(f"Reasoning for round {i} concluding with a summary statement"))
    return conv


def test_conversation_creation() -> None:
    """with_system gives one message that is the system prompt."""
    conv = Conversation.with_system("You are a test agent.")
    assert len(conv) == 1
    assert not conv.is_empty()
    assert conv.system_message() is not None


def test_message_constructors() -> None:
    """Each constructor sets the role and content; tool_result carries its id and name."""
    assert Msg.system("s").role is MessageRole.SYSTEM
    assert Msg.user("u").role is MessageRole.USER
    assert Msg.assistant("a").content == "a"
    calls = Msg.assistant_tool_calls([_call("call_1", "search")])
    assert calls.role is MessageRole.ASSISTANT
    assert calls.content == ""
    result = Msg.tool_result("call_1", "search", "found")
    assert result.role is MessageRole.TOOL
    assert (result.tool_call_id, result.tool_name, result.content) == ("call_1", "search", "found")


def test_openai_serialization_roundtrip() -> None:
    """OpenAI messages keep order, tool calls as functions and tool_call_id on results."""
    conv = Conversation.with_system("You are a test agent.")
    conv.push(Msg.user("Search for rust"))
    conv.push(Msg.assistant_tool_calls([_call("call_1", "web_search", '{"q":"rust"}')]))
    conv.push(Msg.tool_result("call_1", "web_search", "Rust is a language"))
    conv.push(Msg.assistant("Rust is a systems language."))
    out = conv.to_openai_messages()
    assert len(out) == 5
    assert out[0] == {"role": "system", "content": "You are a test agent."}
    assert out[1]["role"] == "user"
    assert out[2]["role"] == "assistant"
    assert "content" not in out[2]
    assert out[2]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "web_search", "arguments": '{"q":"rust"}'},
        }
    ]
    assert out[3] == {"role": "tool", "content": "Rust is a language", "tool_call_id": "call_1"}
    assert out[4]["role"] == "assistant"


def test_openai_keeps_extra_system_messages_in_place() -> None:
    """Knowledge and pre-hydrated context stay where they are in the OpenAI format."""
    conv = Conversation.with_system("sys")
    conv.push(Msg.user("task"))
    conv.inject_knowledge_context("facts")
    assert [m["role"] for m in conv.to_openai_messages()] == ["system", "system", "user"]


def test_openai_empty_content_is_empty_string_except_for_assistant() -> None:
    """An empty tool result is sent as "" while an empty assistant text is omitted."""
    conv = Conversation(messages=[Msg.tool_result("c", "t", ""), Msg.assistant("")])
    out = conv.to_openai_messages()
    assert out[0]["content"] == ""
    assert "content" not in out[1]


def test_anthropic_serialization() -> None:
    """The system prompt is split out and tool use and results become content blocks."""
    conv = Conversation.with_system("System prompt here.")
    conv.push(Msg.user("Hello"))
    conv.push(Msg.assistant_tool_calls([_call("tu_1", "calculator", '{"expr":"2+2"}')]))
    conv.push(Msg.tool_result("tu_1", "calculator", "4"))
    conv.push(Msg.assistant("The result is 4."))
    system, messages = conv.to_anthropic_messages()
    assert system == "System prompt here."
    assert len(messages) == 4
    assert messages[0] == {"role": "user", "content": "Hello"}
    assert messages[1]["role"] == "assistant"
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "tu_1", "name": "calculator", "input": {"expr": "2+2"}}
    ]
    assert messages[2]["role"] == "user"
    assert messages[2]["content"][0]["type"] == "tool_result"
    assert messages[2]["content"][0]["tool_use_id"] == "tu_1"
    assert messages[3] == {"role": "assistant", "content": "The result is 4."}


def test_anthropic_system_includes_knowledge_and_pre_hydrated_context() -> None:
    """Every system message reaches Anthropic's system prompt, in order (Symbiont drops them)."""
    conv = Conversation.with_system("You are helpful.")
    conv.push(Msg.system("[PRE_HYDRATED_CONTEXT]\nfile a.py: print(1)"))
    conv.push(Msg.user("Fix a.py"))
    conv.inject_knowledge_context("Use tabs")
    system, messages = conv.to_anthropic_messages()
    assert system == (
        "You are helpful.\n\n[KNOWLEDGE_CONTEXT]\nUse tabs\n\n"
        "[PRE_HYDRATED_CONTEXT]\nfile a.py: print(1)"
    )
    assert messages == [{"role": "user", "content": "Fix a.py"}]


def test_anthropic_without_system_gives_none() -> None:
    """No system message (or only empty ones) means no system prompt."""
    assert Conversation(messages=[Msg.user("hi")]).to_anthropic_messages()[0] is None
    assert Conversation(messages=[Msg.system(""), Msg.user("hi")]).to_anthropic_messages()[0] is (
        None
    )


def test_anthropic_merges_consecutive_same_role_turns() -> None:
    """Parallel tool results merge into one user turn; a following user text joins it."""
    conv = Conversation(
        messages=[
            Msg.user("go"),
            Msg.assistant_tool_calls([_call("a", "t"), _call("b", "t")], content="Running both"),
            Msg.tool_result("a", "t", "one"),
            Msg.tool_result("b", "t", "[Error] boom"),
            Msg.user("and then?"),
        ]
    )
    _, messages = conv.to_anthropic_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0] == {"type": "text", "text": "Running both"}
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "tool_result", "text"]
    assert messages[2]["content"][1]["is_error"] is True
    assert "is_error" not in messages[2]["content"][0]
    assert messages[2]["content"][2] == {"type": "text", "text": "and then?"}


def test_anthropic_invalid_tool_arguments_become_empty_input() -> None:
    """Arguments that are not a JSON object are sent as an empty input object."""
    conv = Conversation(messages=[Msg.assistant_tool_calls([_call("x", "t", "not json")])])
    assert conv.to_anthropic_messages()[1][0]["content"][0]["input"] == {}


@pytest.mark.parametrize(
    ("message", "tokens"),
    [
        (Msg.user("Hello, world!"), 10),
        (Msg.user(""), 8),
        (Msg.system("sys"), 8),
        (Msg.user("é" * 33), 27),
        (Msg.assistant_tool_calls([_call("c1", "t1")]), 17),
        (Msg.tool_result("c_old", "t", "old result with substantial text content"), 26),
    ],
)
def test_token_estimation(message: ConversationMessage, tokens: int) -> None:
    """The per-message estimate is max(bytes*10//33, 1) + 7 with tool call overheads."""
    assert estimate_message_tokens(message) == tokens
    assert message.estimate_tokens() == tokens


def test_conversation_token_estimation() -> None:
    """The conversation estimate is the sum of its messages."""
    conv = Conversation.with_system("Be helpful.")
    conv.push(Msg.user("Hi"))
    conv.push(Msg.assistant("Hello!"))
    assert conv.estimate_tokens() == sum(m.estimate_tokens() for m in conv.messages)
    assert conv.estimate_tokens() > 0


def test_truncate_to_budget() -> None:
    """Budget 100 on 20 short rounds keeps the system prompt and the newest groups (81 tokens)."""
    conv = _twenty_rounds()
    assert (len(conv), conv.estimate_tokens()) == (41, 648)
    assert conv.truncate_to_budget(100) is True
    assert [m.content for m in conv.messages] == [
        "sys",
        "Reply 17",
        "Message number 18 with some extra text to take up tokens",
        "Reply 18",
        "Message number 19 with some extra text to take up tokens",
        "Reply 19",
    ]
    assert conv.estimate_tokens() == 81


def test_truncate_within_budget_changes_nothing() -> None:
    """A conversation that fits is left alone and reported unchanged."""
    conv = _twenty_rounds()
    assert conv.truncate_to_budget(648) is False
    assert len(conv) == 41


def test_truncate_preserves_tool_use_tool_result_pairing() -> None:
    """Every kept tool result keeps its tool call: sys + rounds 5–7, 13 messages, 389 tokens."""
    conv = _eight_tool_rounds()
    assert (len(conv), conv.estimate_tokens()) == (33, 1024)
    conv.truncate_to_budget(400)
    seen: set[str] = set()
    for message in conv.messages:
        seen.update(call.id for call in message.tool_calls)
        if message.role is MessageRole.TOOL:
            assert message.tool_call_id in seen
    assert conv.messages[0].role is MessageRole.SYSTEM
    assert (len(conv), conv.estimate_tokens()) == (13, 389)
    assert conv.messages[1].content.startswith("Ask 5 ")


def test_truncate_keeps_at_least_one_group_even_if_oversize() -> None:
    """The newest group is kept even when it alone exceeds the budget."""
    conv = Conversation.with_system("sys")
    conv.push(Msg.user("X" * 50_000))
    conv.truncate_to_budget(100)
    assert len(conv) == 2
    assert conv.messages[1].content == "X" * 50_000


def test_truncate_strips_orphaned_leading_tool_results() -> None:
    """A cut never leaves a tool result first: [sys, u2, a2] at budget 60."""
    conv = Conversation.with_system("sys")
    conv.push(Msg.user("u1 with some longer text"))
    conv.push(Msg.assistant_tool_calls([_call("c_old", "t")]))
    conv.push(Msg.tool_result("c_old", "t", "old result with substantial text content"))
    conv.push(Msg.user("u2"))
    conv.push(Msg.assistant("a2"))
    assert [m.estimate_tokens() for m in conv.messages] == [8, 14, 18, 26, 8, 8]
    assert conv.estimate_tokens() == 82
    conv.truncate_to_budget(60)
    assert [m.content for m in conv.messages] == ["sys", "u2", "a2"]


def test_truncate_floor_skips_a_newest_group_that_is_an_orphan_tool_result() -> None:
    """The oversize floor keeps a real message rather than an orphan result that gets stripped."""
    conv = Conversation(messages=[Msg.user("a"), Msg.tool_result("lost", "t", "x" * 500)])
    assert conv.truncate_to_budget(5) is True
    assert [m.content for m in conv.messages] == ["a"]


def test_truncate_floor_keeps_the_newest_oversize_group() -> None:
    """Older small groups are not tried once the newest group does not fit."""
    conv = Conversation(messages=[Msg.user("a"), Msg.user("b" * 500)])
    assert conv.truncate_to_budget(9) is True
    assert [m.content for m in conv.messages] == ["b" * 500]


def test_truncate_keeps_system_only_at_index_zero() -> None:
    """A system message in the middle is an ordinary group and can be dropped."""
    conv = Conversation(messages=[Msg.user("first " * 40), Msg.system("late"), Msg.user("last")])
    conv.truncate_to_budget(20)
    assert [m.content for m in conv.messages] == ["late", "last"]


def test_tool_groups_pair_calls_with_all_results() -> None:
    """A tool-call message and all its results form one group; leftovers form the last group."""
    msgs = [
        Msg.user("u"),
        Msg.assistant_tool_calls([_call("a", "t"), _call("b", "t")]),
        Msg.tool_result("a", "t", "1"),
        Msg.tool_result("b", "t", "2"),
        Msg.assistant("done"),
        Msg.assistant_tool_calls([_call("c", "t")]),
    ]
    assert [len(g) for g in tool_groups(msgs)] == [1, 3, 1, 1]


def test_metadata() -> None:
    """metadata reports counts as strings."""
    conv = Conversation.with_system("sys")
    conv.push(Msg.user("hi"))
    conv.push(Msg.assistant_tool_calls([_call("c1", "t1"), _call("c2", "t2")]))
    conv.push(Msg.tool_result("c1", "t1", "ok"))
    conv.push(Msg.tool_result("c2", "t2", "ok"))
    meta = conv.metadata()
    assert meta["message_count"] == "5"
    assert meta["has_system"] == "true"
    assert meta["tool_call_count"] == "2"
    assert meta["tool_result_count"] == "2"
    assert meta["estimated_tokens"] == str(conv.estimate_tokens())
    assert Conversation().metadata()["has_system"] == "false"


def test_last_assistant_message() -> None:
    """last_assistant_message is None when empty, else the newest assistant message."""
    conv = Conversation()
    assert conv.last_assistant_message() is None
    for message in [Msg.user("hi"), Msg.assistant("first"), Msg.user("more")]:
        conv.push(message)
    conv.push(Msg.assistant("second"))
    last = conv.last_assistant_message()
    assert last is not None
    assert last.content == "second"


def test_inject_knowledge_context_after_system() -> None:
    """Knowledge goes right after the system prompt, which is unchanged."""
    conv = Conversation.with_system("You are helpful.")
    conv.push(Msg.user("hello"))
    conv.inject_knowledge_context("Some knowledge here")
    assert len(conv) == 3
    assert conv.messages[0] == Msg.system("You are helpful.")
    assert KNOWLEDGE_CONTEXT_MARKER in conv.messages[1].content
    assert "Some knowledge here" in conv.messages[1].content
    assert conv.messages[1].content == "[KNOWLEDGE_CONTEXT]\nSome knowledge here"
    assert conv.messages[2].role is MessageRole.USER


def test_inject_knowledge_context_replaces_existing() -> None:
    """A second injection replaces the first in place."""
    conv = Conversation.with_system("System prompt")
    conv.inject_knowledge_context("First knowledge")
    conv.inject_knowledge_context("Updated knowledge")
    marked = [m for m in conv.messages if KNOWLEDGE_CONTEXT_MARKER in m.content]
    assert len(marked) == 1
    assert "Updated knowledge" in marked[0].content
    assert len(conv) == 2


def test_inject_knowledge_context_no_system_message() -> None:
    """Without a system prompt the knowledge goes first."""
    conv = Conversation()
    conv.push(Msg.user("hello"))
    conv.inject_knowledge_context("Knowledge without system")
    assert len(conv) == 2
    assert KNOWLEDGE_CONTEXT_MARKER in conv.messages[0].content
    assert conv.messages[1].role is MessageRole.USER


def test_serde_roundtrip() -> None:
    """The JSON round trip keeps every message and tool call."""
    conv = Conversation.with_system("test")
    conv.push(Msg.user("hello"))
    conv.push(Msg.assistant_tool_calls([_call("tc1", "search", '{"q":"test"}')]))
    restored = Conversation.model_validate_json(conv.model_dump_json())
    assert len(restored) == len(conv)
    assert restored.messages[2].tool_calls[0].name == "search"
    assert restored == conv


def test_pop_and_last_user_message() -> None:
    """pop removes the newest message; last_user_message finds the newest user input."""
    conv = Conversation(messages=[Msg.user("task"), Msg.assistant("ok")])
    last_user = conv.last_user_message()
    assert last_user is not None
    assert last_user.content == "task"
    popped = conv.pop()
    assert popped is not None
    assert popped.content == "ok"
    assert conv.pop() is not None
    assert conv.pop() is None
    assert conv.is_empty()


# -- pins -----------------------------------------------------------------------------------


def _pinned_task(*, step: str = "Step 1 of 1 (fix): fix it") -> Conversation:
    conv = Conversation.with_system("sys", pin=True)
    conv.push(Msg.user("Goal: the goal", pin=True))
    conv.push(Msg.user(step, pin=True))
    return conv


def test_messages_are_unpinned_by_default_and_pinned_on_request() -> None:
    """The factories pin only with pin=True; pinned_copy and unpinned_copy toggle the flag."""
    assert not Msg.user("u").pinned
    assert not Conversation.with_system("s").messages[0].pinned
    assert Msg.user("u", pin=True) == Msg.user("u").pinned_copy()
    assert Msg.system("s", pin=True).pinned
    assert Conversation.with_system("s", pin=True).messages[0].pinned
    pinned = Msg.user("u", pin=True)
    assert pinned.pinned_copy() is pinned
    assert pinned.unpinned_copy() == Msg.user("u")
    assert Msg.user("u").unpinned_copy() == Msg.user("u")


def test_records_without_the_pinned_field_still_load() -> None:
    """A message written before pins existed loads unpinned; a pinned one round-trips."""
    old = '{"messages": [{"role": "user", "content": "Goal: x", "tool_calls": [],'
    old += ' "tool_call_id": null, "tool_name": null}]}'
    assert Conversation.model_validate_json(old).messages == [Msg.user("Goal: x")]
    conv = _pinned_task()
    conv.push(Msg.assistant("working"))
    restored = Conversation.model_validate_json(conv.model_dump_json())
    assert restored == conv
    assert [m.pinned for m in restored.messages] == [True, True, True, False]


def test_provider_formats_never_carry_the_pin() -> None:
    """The OpenAI and Anthropic bodies of a pinned conversation equal the unpinned ones."""
    pinned = _pinned_task()
    pinned.push(Msg.assistant_tool_calls([_call("c1", "t")]))
    pinned.push(Msg.tool_result("c1", "t", "out").pinned_copy())
    plain = Conversation(messages=[m.unpinned_copy() for m in pinned.messages])
    assert pinned.to_openai_messages() == plain.to_openai_messages()
    assert pinned.to_anthropic_messages() == plain.to_anthropic_messages()
    assert "pinned" not in repr(pinned.to_openai_messages() + pinned.to_anthropic_messages()[1])


def test_pin_task_pins_the_opening_messages_only_when_nothing_is_pinned() -> None:
    """pin_task pins the system and user messages before the model first spoke."""
    conv = Conversation.with_system("sys")
    conv.push(Msg.user("goal"))
    conv.push(Msg.user("step"))
    conv.push(Msg.assistant("ok"))
    conv.push(Msg.user("later"))
    assert conv.pin_task() == 3
    assert [m.content for m in conv.pinned_messages()] == ["sys", "goal", "step"]
    assert conv.pin_task() == 0
    chosen = Conversation(messages=[Msg.system("sys"), Msg.user("goal", pin=True)])
    assert chosen.pin_task() == 0
    assert [m.content for m in chosen.pinned_messages()] == ["goal"]


def test_unpin_releases_the_previous_step() -> None:
    """unpin(content) unpins exactly the pinned messages with that content."""
    conv = _pinned_task(step="Step 1")
    conv.push(Msg.user("Step 1"))
    conv.push(Msg.user("Step 2", pin=True))
    assert conv.unpin("Step 1") == 1
    assert [m.content for m in conv.pinned_messages()] == ["sys", "Goal: the goal", "Step 2"]
    assert conv.unpin("missing") == 0


def test_truncate_keeps_pinned_messages_in_order_even_over_budget() -> None:
    """Budget 0: the pinned messages and the newest group stay, in their original order."""
    conv = _twenty_rounds()
    conv.messages[5] = conv.messages[5].pinned_copy()
    conv.messages[21] = conv.messages[21].pinned_copy()
    pinned = conv.pinned_messages()
    assert conv.truncate_to_budget(0) is True
    assert conv.messages == [conv.messages[0], *pinned, Msg.assistant("Reply 19")]


def test_truncate_spends_the_budget_on_the_rest() -> None:
    """Budget 100, 31 of it pinned: the newest 64 tokens (rounds 18 and 19) fill the rest."""
    conv = _twenty_rounds()
    conv.messages[1] = conv.messages[1].pinned_copy()
    assert conv.truncate_to_budget(100) is True
    assert [m.content for m in conv.messages] == [
        "sys",
        "Message number 0 with some extra text to take up tokens",
        "Message number 18 with some extra text to take up tokens",
        "Reply 18",
        "Message number 19 with some extra text to take up tokens",
        "Reply 19",
    ]
    assert conv.estimate_tokens() == 95


def test_truncate_keeps_the_whole_group_of_a_pinned_result() -> None:
    """A pinned tool result keeps its call and the call's other results."""
    conv = _eight_tool_rounds()
    conv.messages[3] = conv.messages[3].pinned_copy()
    call, result, newest = conv.messages[2], conv.messages[3], conv.messages[-1]
    conv.truncate_to_budget(0)
    assert conv.messages == [conv.messages[0], call, result, newest]
    assert call.tool_calls[0].id == result.tool_call_id == "call_0"


def test_truncate_drops_a_group_around_a_pinned_plain_message() -> None:
    """A pinned user message between a call and its result stays; the pair goes as one."""
    call = Msg.assistant_tool_calls([_call("c1", "t")])
    result = Msg.tool_result("c1", "t", "r" * 300)
    conv = Conversation(messages=[Msg.system("sys"), call, Msg.user("note", pin=True), result])
    conv.push(Msg.assistant("newest"))
    conv.truncate_to_budget(0)
    assert [m.content for m in conv.messages] == ["sys", "note", "newest"]
