"""The in-loop context manager: fit a conversation into ``context_token_budget`` (Symbiont §7).

Three strategies, chosen as data (a task file can carry ``{"strategy": "anchored_summary",
"recent_count": 6}``):

- ``SlidingWindow``: ``Conversation.truncate_to_budget`` (system prompt plus the newest whole
  tool groups).
- ``ObservationMasking``: old tool results are replaced by a placeholder (ids and names kept,
  so pairing holds); if that is not enough, the sliding window finishes the job.
- ``AnchoredSummary``: the leading system messages and the first user message stay, the middle
  is replaced by one summary line, the newest ``recent_count`` messages stay; then the sliding
  window if still over budget.

Differences from Symbiont, all deliberate fixes:

- ``AnchoredSummary`` moves the start of the recent window back to the start of its tool group,
  so the window never opens with a tool result whose call was summarised away (Anthropic
  rejects that). It may therefore keep a few more than ``recent_count`` messages.
- ``AnchoredSummary`` anchors every leading system message plus the first user message after
  them. Symbiont anchors a user message only at index ≤ 1, so with a knowledge or pre-hydrated
  context message at index 1 the task statement was summarised away.
- ``ObservationMasking`` on a conversation of three messages or fewer falls back to the sliding
  window instead of returning over budget.
- ``manage_context`` returns True when anything was dropped, masked or summarised, so the
  compaction reaches the stagnation detector.

**Pinned messages** (``ConversationMessage.pinned``: the system prompt, the goal and the current
step's instruction) are never dropped, masked, summarised or moved by any strategy: they stay
whole and in their original order, and the budget is spent on the other messages. A pinned tool
call or result keeps its whole tool group, so pins never orphan a result. When the pinned
messages alone exceed the budget they are kept anyway; ``DefaultContextManager.fit`` says so
(``ContextFit.pinned_over_budget``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from shared.conversation import (
    Conversation,
    ConversationMessage,
    MessageRole,
    estimate_message_tokens,
    pins_group,
    tool_groups,
)

__all__ = [
    "AnchoredSummary",
    "ContextFit",
    "ContextManager",
    "ContextStrategy",
    "DefaultContextManager",
    "ObservationMasking",
    "SlidingWindow",
    "estimate_tokens",
    "parse_context_strategy",
]


@runtime_checkable
class ContextManager(Protocol):
    """Fits a conversation into a token budget, in place."""

    def manage_context(self, conversation: Conversation, max_tokens: int) -> bool:
        """Shrink ``conversation`` to ``max_tokens`` if needed; True when anything was dropped
        or masked (the stagnation detector is told of every compaction)."""
        ...

    def strategy_name(self) -> str:
        """``sliding_window``, ``observation_masking`` or ``anchored_summary``."""
        ...


class SlidingWindow(BaseModel):
    """Keep the system prompt and the newest whole tool groups that fit."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["sliding_window"] = "sliding_window"


class ObservationMasking(BaseModel):
    """Mask tool results older than the newest ``keep_recent`` messages, then slide."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["observation_masking"] = "observation_masking"
    keep_recent: int = Field(default=6, ge=0)


class AnchoredSummary(BaseModel):
    """Keep the anchors and the newest ``recent_count`` messages; summarise the middle."""

    model_config = ConfigDict(frozen=True)
    strategy: Literal["anchored_summary"] = "anchored_summary"
    recent_count: int = Field(ge=0)


ContextStrategy = Annotated[
    SlidingWindow | ObservationMasking | AnchoredSummary, Field(discriminator="strategy")
]

_STRATEGY_ADAPTER: TypeAdapter[ContextStrategy] = TypeAdapter(ContextStrategy)


def parse_context_strategy(data: object) -> ContextStrategy:
    """Validate a strategy from JSON-like data, e.g. ``{"strategy": "sliding_window"}``."""
    return _STRATEGY_ADAPTER.validate_python(data)


def estimate_tokens(messages: Conversation | Iterable[ConversationMessage]) -> int:
    """Symbiont's token estimate of a conversation or of some of its messages."""
    if isinstance(messages, Conversation):
        messages = messages.messages
    return sum(estimate_message_tokens(m) for m in messages)


@dataclass(frozen=True, slots=True)
class ContextFit:
    """What one fitting did, in estimated tokens.

    ``pinned_over_budget``: the pinned messages alone cost more than ``max_tokens``; they were
    kept anyway, so the conversation stays over the budget.
    """

    max_tokens: int
    tokens_before: int
    tokens_after: int
    pinned_tokens: int
    compacted: bool

    @property
    def over_budget(self) -> bool:
        """The fitted conversation is still larger than the budget."""
        return self.tokens_after > self.max_tokens

    @property
    def pinned_over_budget(self) -> bool:
        """The pinned messages alone are larger than the budget."""
        return self.pinned_tokens > self.max_tokens


class DefaultContextManager:
    """Applies one ``ContextStrategy``; the default is the sliding window."""

    def __init__(self, strategy: ContextStrategy | None = None) -> None:
        self._strategy: ContextStrategy = strategy if strategy is not None else SlidingWindow()

    @property
    def strategy(self) -> ContextStrategy:
        """The strategy this manager applies."""
        return self._strategy

    def strategy_name(self) -> str:
        """``sliding_window``, ``observation_masking`` or ``anchored_summary``."""
        return self._strategy.strategy

    def manage_context(self, conversation: Conversation, max_tokens: int) -> bool:
        """Fit ``conversation`` into ``max_tokens``; True when anything was compacted."""
        return self.fit(conversation, max_tokens).compacted

    def fit(self, conversation: Conversation, max_tokens: int) -> ContextFit:
        """Fit ``conversation`` into ``max_tokens``, pinned messages kept; what it did."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}; pass the token budget")
        tokens_before = conversation.estimate_tokens()
        pinned_tokens = estimate_tokens(conversation.pinned_messages())
        if tokens_before <= max_tokens:  # the common case: nothing to do, nothing to count again
            return ContextFit(max_tokens, tokens_before, tokens_before, pinned_tokens, False)
        before = list(conversation.messages)
        self._compact(conversation, max_tokens)
        return ContextFit(
            max_tokens=max_tokens,
            tokens_before=tokens_before,
            tokens_after=conversation.estimate_tokens(),
            pinned_tokens=pinned_tokens,
            compacted=conversation.messages != before,
        )

    def _compact(self, conversation: Conversation, max_tokens: int) -> None:
        strategy = self._strategy
        if isinstance(strategy, ObservationMasking):
            conversation.messages = _masked(conversation.messages, strategy.keep_recent)
        elif isinstance(strategy, AnchoredSummary):
            conversation.messages = _anchored(conversation.messages, strategy.recent_count)
        if conversation.estimate_tokens() > max_tokens:
            conversation.truncate_to_budget(max_tokens)


def _masked(messages: list[ConversationMessage], keep_recent: int) -> list[ConversationMessage]:
    """Unpinned tool results before the newest ``keep_recent`` messages get a placeholder."""
    cut = len(messages) - min(keep_recent, len(messages))
    return [
        _mask(m) if i < cut and m.role is MessageRole.TOOL and not m.pinned else m
        for i, m in enumerate(messages)
    ]


def _mask(message: ConversationMessage) -> ConversationMessage:
    placeholder = f"[Previous {message.tool_name or 'tool'} result omitted for context management]"
    return message.model_copy(update={"content": placeholder})


def _anchored(messages: list[ConversationMessage], recent_count: int) -> list[ConversationMessage]:
    """Anchors, then the middle summarised, then the recent window aligned to tool groups."""
    anchor_end = _anchor_end(messages)
    keep_recent = min(recent_count, len(messages) - anchor_end)
    recent_start = _group_start_at_or_before(messages, anchor_end, len(messages) - keep_recent)
    middle = _summarised(messages[anchor_end:recent_start])
    return messages[:anchor_end] + middle + messages[recent_start:]


def _summarised(middle: list[ConversationMessage]) -> list[ConversationMessage]:
    """The pinned messages of ``middle`` (with the tool groups they pin), in order, each run
    of unpinned messages between them replaced by one summary line."""
    out: list[ConversationMessage] = []
    omitted: list[ConversationMessage] = []
    for group in tool_groups(middle):
        pinned_whole = any(pins_group(m) for m in group)
        stays = [m for m in group if pinned_whole or m.pinned]
        if stays:
            out.extend([_summary(omitted)] if omitted else [])
            out.extend(stays)
            omitted = []
        omitted.extend(m for m in group if not (pinned_whole or m.pinned))
    return out + ([_summary(omitted)] if omitted else [])


def _anchor_end(messages: list[ConversationMessage]) -> int:
    """One past the leading system messages and the first user message that follows them."""
    end = 0
    while end < len(messages) and messages[end].role is MessageRole.SYSTEM:
        end += 1
    if end < len(messages) and messages[end].role is MessageRole.USER:
        end += 1
    return end


def _group_start_at_or_before(messages: list[ConversationMessage], first: int, index: int) -> int:
    """The start of the tool group of ``messages[first:]`` that contains ``index``."""
    start = first
    for group in tool_groups(messages[first:]):
        if start + len(group) > index:
            return start
        start += len(group)
    return start


def _summary(middle: list[ConversationMessage]) -> ConversationMessage:
    calls = sum(1 for m in middle if m.tool_calls)
    results = sum(1 for m in middle if m.role is MessageRole.TOOL)
    return ConversationMessage.user(
        f"[Context summary: {len(middle)} messages omitted ({calls} tool calls, {results} tool "
        "results). The conversation continued with the agent working on the task.]"
    )
