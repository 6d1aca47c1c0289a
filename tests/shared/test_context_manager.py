"""The context manager strategies on Symbiont's fixture (§7, §13.13), with its bugs fixed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.context_manager import (
    AnchoredSummary,
    ContextManager,
    ContextStrategy,
    DefaultContextManager,
    ObservationMasking,
    SlidingWindow,
    estimate_tokens,
    parse_context_strategy,
)
from shared.conversation import Conversation, ConversationMessage, MessageRole
from shared.inference import ToolCall

Msg = ConversationMessage


def _long_conversation() -> Conversation:
    """Symbiont's fixture: a system prompt and 20 rounds of user, call, result, answer."""
    conv = Conversation.with_system("You are a research agent.")
    for i in range(20):
        conv.push(
            Msg.user(
                f"Research question {i} about a topic that requires multiple paragraphs of text "
                "to describe properly"
            )
        )
        arguments = f'{{"query": "topic {i} detailed information"}}'
        conv.push(
            Msg.assistant_tool_calls(
                [ToolCall(id=f"call_{i}", name="web_search", arguments=arguments)]
            )
        )
        conv.push(
            Msg.tool_result(
                f"call_{i}",
                "web_search",
                f"Here are the detailed results for query {i}. Lorem ipsum dolor sit amet, "
                "consectetur adipiscing elit. Sed do eiusmod tempor incididunt ut labore et "
                "dolore magna aliqua.",
            )
        )
        conv.push(
            Msg.assistant(
                f"Based on the search results for question {i}, I found that the topic involves "
                "multiple interesting aspects that we should discuss in detail."
            )
        )
    return conv


def _assert_paired(conv: Conversation) -> None:
    seen: set[str] = set()
    for message in conv.messages:
        seen.update(call.id for call in message.tool_calls)
        if message.role is MessageRole.TOOL:
            assert message.tool_call_id in seen, f"orphan tool result {message.tool_call_id}"


def test_fixture_size() -> None:
    """The fixture has 81 messages and an estimate of 3664."""
    conv = _long_conversation()
    assert (len(conv), conv.estimate_tokens(), estimate_tokens(conv)) == (81, 3664, 3664)


def test_estimate_tokens_accepts_messages() -> None:
    """estimate_tokens sums any iterable of messages."""
    assert estimate_tokens([Msg.user("Hello, world!"), Msg.system("sys")]) == 18
    assert estimate_tokens([]) == 0


def test_sliding_window_no_truncation_needed() -> None:
    """Within budget nothing changes and False is returned."""
    conv = Conversation(messages=[Msg.system("sys"), Msg.user("hi"), Msg.assistant("hello")])
    before = conv.estimate_tokens()
    assert DefaultContextManager(SlidingWindow()).manage_context(conv, 10_000) is False
    assert conv.estimate_tokens() == before


def test_sliding_window_truncation() -> None:
    """Budget 200 keeps the system prompt and the whole last round: 5 messages, 197."""
    conv = _long_conversation()
    assert DefaultContextManager(SlidingWindow()).manage_context(conv, 200) is True
    assert conv.messages[0].role is MessageRole.SYSTEM
    assert (len(conv), conv.estimate_tokens()) == (5, 197)
    assert conv.messages[1].content.startswith("Research question 19 ")


def test_observation_masking() -> None:
    """Masking is not enough at 500, so the window finishes: 12 messages, 495, masked kept."""
    conv = _long_conversation()
    assert DefaultContextManager(ObservationMasking()).manage_context(conv, 500) is True
    assert (len(conv), conv.estimate_tokens()) == (12, 495)
    masked = [m for m in conv.messages if m.role is MessageRole.TOOL and "omitted" in m.content]
    assert masked
    assert masked[0].content == "[Previous web_search result omitted for context management]"
    assert masked[0].tool_call_id is not None
    _assert_paired(conv)


def test_observation_masking_alone_when_it_suffices() -> None:
    """When masking fits the budget no message is dropped; the newest 6 stay verbatim."""
    conv = _long_conversation()
    assert DefaultContextManager(ObservationMasking()).manage_context(conv, 3100) is True
    assert len(conv) == 81
    assert conv.estimate_tokens() == 3078
    tools = [m for m in conv.messages if m.role is MessageRole.TOOL]
    assert all("omitted" in m.content for m in tools[:-2])
    assert all("omitted" not in m.content for m in tools[-2:])


def test_observation_masking_small_conversation_falls_back_to_window() -> None:
    """Three messages over budget are windowed (Symbiont returned them unchanged)."""
    conv = Conversation(messages=[Msg.system("sys"), Msg.user("old " * 50), Msg.user("new")])
    assert DefaultContextManager(ObservationMasking()).manage_context(conv, 20) is True
    assert [m.content for m in conv.messages] == ["sys", "new"]


def test_anchored_summary() -> None:
    """Anchors, a summary of 72 messages and the last 7 (aligned to the group): 10, 427."""
    conv = _long_conversation()
    manager = DefaultContextManager(AnchoredSummary(recent_count=6))
    assert manager.manage_context(conv, 500) is True
    assert (len(conv), conv.estimate_tokens()) == (10, 427)
    assert conv.messages[0].role is MessageRole.SYSTEM
    assert conv.messages[1].content.startswith("Research question 0 ")
    assert conv.messages[2] == Msg.user(
        "[Context summary: 72 messages omitted (18 tool calls, 18 tool results). The "
        "conversation continued with the agent working on the task.]"
    )
    assert conv.messages[3].tool_calls[0].id == "call_18"
    assert conv.messages[4].tool_call_id == "call_18"
    _assert_paired(conv)


def test_anchored_summary_never_starts_recent_window_with_orphan() -> None:
    """For every recent_count the result keeps each tool result with its call."""
    for recent_count in range(12):
        conv = _long_conversation()
        DefaultContextManager(AnchoredSummary(recent_count=recent_count)).manage_context(conv, 600)
        _assert_paired(conv)


def test_anchored_summary_anchors_task_after_knowledge_context() -> None:
    """The first user message is kept even behind a knowledge context at index 1."""
    conv = _long_conversation()
    conv.inject_knowledge_context("fact")
    DefaultContextManager(AnchoredSummary(recent_count=4)).manage_context(conv, 600)
    assert [m.role for m in conv.messages[:4]] == [
        MessageRole.SYSTEM,
        MessageRole.SYSTEM,
        MessageRole.USER,
        MessageRole.USER,
    ]
    assert conv.messages[2].content.startswith("Research question 0 ")
    assert conv.messages[3].content.startswith("[Context summary: ")


def test_anchored_summary_falls_back_to_window() -> None:
    """A budget the anchors cannot meet ends in the sliding window."""
    conv = _long_conversation()
    assert DefaultContextManager(AnchoredSummary(recent_count=6)).manage_context(conv, 200) is True
    assert (len(conv), conv.estimate_tokens()) == (5, 197)


@pytest.mark.parametrize(
    ("strategy", "name"),
    [
        (SlidingWindow(), "sliding_window"),
        (ObservationMasking(), "observation_masking"),
        (AnchoredSummary(recent_count=4), "anchored_summary"),
    ],
)
def test_strategy_name(strategy: ContextStrategy, name: str) -> None:
    """Each strategy reports its name."""
    assert DefaultContextManager(strategy).strategy_name() == name


def test_default_is_sliding_window() -> None:
    """The default manager uses the sliding window and satisfies the Protocol."""
    manager = DefaultContextManager()
    assert manager.strategy == SlidingWindow()
    assert isinstance(manager, ContextManager)


@pytest.mark.parametrize(
    "strategy", [SlidingWindow(), ObservationMasking(), AnchoredSummary(recent_count=6)]
)
def test_context_within_budget_untouched(strategy: ContextStrategy) -> None:
    """Every strategy leaves a conversation within budget alone and returns False."""
    conv = Conversation(messages=[Msg.system("sys"), Msg.user("short")])
    assert DefaultContextManager(strategy).manage_context(conv, 100_000) is False
    assert len(conv) == 2


def test_negative_budget_is_rejected() -> None:
    """A negative budget is a caller error naming the value."""
    with pytest.raises(ValueError, match="-1"):
        DefaultContextManager().manage_context(Conversation(), -1)


@pytest.mark.parametrize(
    "strategy",
    [SlidingWindow(), ObservationMasking(keep_recent=4), AnchoredSummary(recent_count=6)],
)
def test_strategy_json_round_trip(strategy: ContextStrategy) -> None:
    """Strategies serialise to tagged JSON a task file can carry."""
    data = json.loads(strategy.model_dump_json())
    assert data["strategy"] == DefaultContextManager(strategy).strategy_name()
    assert parse_context_strategy(data) == strategy


def test_parse_context_strategy_rejects_unknown() -> None:
    """An unknown strategy or a missing recent_count is a validation error."""
    with pytest.raises(ValidationError):
        parse_context_strategy({"strategy": "magic"})
    with pytest.raises(ValidationError):
        parse_context_strategy({"strategy": "anchored_summary"})


def _round(kind: int, index: int, size: int, calls: int) -> list[ConversationMessage]:
    text = "word " * size
    if kind == 0:
        return [Msg.user(f"u{index} {text}")]
    if kind == 1:
        return [Msg.assistant(f"a{index} {text}")]
    ids = [f"c{index}_{n}" for n in range(calls)]
    call_message = Msg.assistant_tool_calls([ToolCall(id=i, name="t") for i in ids])
    return [call_message, *(Msg.tool_result(i, "t", f"r {text}") for i in reversed(ids))]


_rounds = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 3)), min_size=0, max_size=25
)
_strategies = st.one_of(
    st.just(SlidingWindow()),
    st.builds(ObservationMasking, keep_recent=st.integers(0, 8)),
    st.builds(AnchoredSummary, recent_count=st.integers(0, 10)),
)


@settings(max_examples=300, deadline=None)
@given(
    rounds=_rounds,
    with_system=st.booleans(),
    strategy=_strategies,
    budget=st.integers(0, 600),
)
def test_every_strategy_keeps_tool_pairs_and_reports_changes(
    rounds: list[tuple[int, int, int]],
    with_system: bool,
    strategy: ContextStrategy,
    budget: int,
) -> None:
    """Whatever the strategy and budget: no orphan tool result, and True exactly on change."""
    messages = [Msg.system("sys")] if with_system else []
    for index, (kind, size, calls) in enumerate(rounds):
        messages.extend(_round(kind, index, size, calls))
    conv = Conversation(messages=list(messages))
    changed = DefaultContextManager(strategy).manage_context(conv, budget)
    assert changed is (conv.messages != messages)
    _assert_paired(conv)
    if with_system and messages:
        assert conv.messages[0] == Msg.system("sys")
    if estimate_tokens(messages) <= budget:
        assert not changed


# -- pinned messages ------------------------------------------------------------------------

_ALL_STRATEGIES = [SlidingWindow(), ObservationMasking(), AnchoredSummary(recent_count=6)]


def _pinned_fixture(*indices: int) -> Conversation:
    """The fixture with the system prompt, question 0 (the goal) and ``indices`` pinned."""
    conv = _long_conversation()
    for index in (0, 1, *indices):
        conv.messages[index] = conv.messages[index].pinned_copy()
    return conv


@pytest.mark.parametrize("strategy", _ALL_STRATEGIES)
@pytest.mark.parametrize("budget", [0, 150, 300, 700, 3100])
def test_every_strategy_keeps_the_pinned_messages(strategy: ContextStrategy, budget: int) -> None:
    """System prompt, goal and a step instruction deep in the middle all survive, in order."""
    conv = _pinned_fixture(41)
    pinned = conv.pinned_messages()
    fit = DefaultContextManager(strategy).fit(conv, budget)
    assert fit.compacted
    assert conv.pinned_messages() == pinned
    assert conv.messages[:2] == pinned[:2]
    _assert_paired(conv)
    assert fit.tokens_after == conv.estimate_tokens() < fit.tokens_before == 3664
    assert fit.pinned_tokens == estimate_tokens(pinned) == 86


def test_sliding_window_spends_the_budget_on_the_rest() -> None:
    """Budget 300: the 86 pinned tokens first, then the newest round that fits."""
    conv = _pinned_fixture(41)
    DefaultContextManager(SlidingWindow()).manage_context(conv, 300)
    assert [m.pinned for m in conv.messages] == [True, True, True, False, False, False, False]
    assert conv.messages[3].content.startswith("Research question 19 ")
    assert conv.estimate_tokens() == 269


def test_anchored_summary_summarises_around_a_pinned_step() -> None:
    """The pinned step stays between two summaries, each of the messages on its side."""
    conv = _pinned_fixture(41)
    DefaultContextManager(AnchoredSummary(recent_count=6)).manage_context(conv, 700)
    contents = [m.content for m in conv.messages]
    assert contents[2].startswith("[Context summary: 39 messages omitted (10 tool calls")
    assert contents[3].startswith("Research question 10 ")
    assert contents[4].startswith("[Context summary: 32 messages omitted (8 tool calls")
    assert conv.messages[3].pinned
    _assert_paired(conv)


def test_observation_masking_never_masks_a_pinned_result() -> None:
    """A pinned tool result keeps its content while the results around it are masked."""
    conv = _pinned_fixture(3)
    result = conv.messages[3]
    DefaultContextManager(ObservationMasking()).manage_context(conv, 3200)
    assert conv.messages[3] == result
    assert "omitted" in conv.messages[7].content


@pytest.mark.parametrize("strategy", _ALL_STRATEGIES)
def test_pinned_messages_over_the_budget_are_kept_and_reported(strategy: ContextStrategy) -> None:
    """Pins larger than the budget stay whole; fit reports the overrun."""
    conv = Conversation.with_system("You are careful. " * 40, pin=True)
    conv.push(Msg.user("Goal: " + "fix everything " * 40, pin=True))
    conv.push(Msg.assistant_tool_calls([ToolCall(id="c1", name="t")]))
    conv.push(Msg.tool_result("c1", "t", "output " * 100))
    conv.push(Msg.assistant("newest"))
    pinned = conv.pinned_messages()
    fit = DefaultContextManager(strategy).fit(conv, 100)
    assert conv.pinned_messages() == pinned
    assert conv.messages[-1] == Msg.assistant("newest")
    assert (fit.compacted, fit.pinned_over_budget, fit.over_budget) == (True, True, True)


def test_fit_within_budget_reports_nothing_done() -> None:
    """A conversation within budget: not compacted, not over, pins counted."""
    conv = Conversation.with_system("sys", pin=True)
    fit = DefaultContextManager().fit(conv, 1000)
    assert (fit.compacted, fit.over_budget, fit.pinned_over_budget) == (False, False, False)
    assert fit.tokens_before == fit.tokens_after == fit.pinned_tokens == 8


@settings(max_examples=400, deadline=None)
@given(
    rounds=_rounds,
    with_system=st.booleans(),
    pins=st.sets(st.integers(0, 400), max_size=6),
    strategy=_strategies,
    budget=st.integers(0, 300),
)
def test_every_strategy_keeps_every_pinned_message_in_order(
    rounds: list[tuple[int, int, int]],
    with_system: bool,
    pins: set[int],
    strategy: ContextStrategy,
    budget: int,
) -> None:
    """Random conversations, random pins, small budgets: every pinned message survives whole
    and in order, no tool result is orphaned, and fit reports the pins' cost."""
    messages = [Msg.system("sys")] if with_system else []
    for index, (kind, size, calls) in enumerate(rounds):
        messages.extend(_round(kind, index, size, calls))
    at = {p % len(messages) for p in pins} if messages else set()
    messages = [m.pinned_copy() if i in at else m for i, m in enumerate(messages)]
    pinned = [m for m in messages if m.pinned]
    conv = Conversation(messages=list(messages))
    fit = DefaultContextManager(strategy).fit(conv, budget)
    assert conv.pinned_messages() == pinned
    _assert_paired(conv)
    call_ids = {c.id for m in conv.messages for c in m.tool_calls}
    assert call_ids == {m.tool_call_id for m in conv.messages if m.role is MessageRole.TOOL}
    assert fit.compacted is (conv.messages != messages)
    assert fit.pinned_tokens == estimate_tokens(pinned)
    assert fit.pinned_over_budget is (estimate_tokens(pinned) > budget)
    assert fit.over_budget or conv.estimate_tokens() <= budget
    if fit.pinned_over_budget:
        assert fit.over_budget
    if with_system and messages:
        assert conv.messages[0] == messages[0]
