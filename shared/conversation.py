"""The conversation a reasoning loop works on, and its provider wire formats (Symbiont §6).

Token estimates follow Symbiont exactly (UTF-8 byte lengths, ``max(b*10//33, 1) + 7`` per message),
so budgets behave the same. Unlike Symbiont, ``to_anthropic_messages`` keeps *every* system message:
they are merged, in order, into the system prompt, so knowledge and pre-hydrated context reach
Anthropic models too.

A message can be **pinned** (``pinned=True``): the system prompt, the goal and the current step's
instruction are, so that no context strategy drops them, truncates them or moves them (see
``shared.context_manager``). The flag is a field of the record, serialised with a default so
records written before it load unchanged; the provider formats never carry it.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter

from shared.identical import SharedWhenIdentical
from shared.inference import ToolCall

__all__ = [
    "KNOWLEDGE_CONTEXT_MARKER",
    "Conversation",
    "ConversationMessage",
    "MessageRole",
    "SharedMessage",
    "estimate_message_tokens",
    "pins_group",
    "shared_message",
    "tool_groups",
]

KNOWLEDGE_CONTEXT_MARKER = "[KNOWLEDGE_CONTEXT]"


class MessageRole(StrEnum):
    """Who wrote a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ConversationMessage(BaseModel):
    """One message; assistant messages may carry tool calls, tool messages answer one call.

    ``pinned`` messages survive every compaction whole and in their place (a pinned tool call
    or result keeps its whole tool group with it).
    """

    model_config = ConfigDict(frozen=True)

    role: MessageRole
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    pinned: bool = False

    @classmethod
    def system(cls, content: str, *, pin: bool = False) -> ConversationMessage:
        """A system message; ``pin=True`` for the system prompt."""
        return cls(role=MessageRole.SYSTEM, content=content, pinned=pin)

    @classmethod
    def user(cls, content: str, *, pin: bool = False) -> ConversationMessage:
        """A user message; ``pin=True`` for the goal and the current step's instruction."""
        return cls(role=MessageRole.USER, content=content, pinned=pin)

    @classmethod
    def assistant(cls, content: str) -> ConversationMessage:
        """An assistant text message."""
        return cls(role=MessageRole.ASSISTANT, content=content)

    @classmethod
    def assistant_tool_calls(
        cls, tool_calls: list[ToolCall], content: str = ""
    ) -> ConversationMessage:
        """An assistant message requesting tool calls (with the text that came with them)."""
        return cls(role=MessageRole.ASSISTANT, content=content, tool_calls=list(tool_calls))

    @classmethod
    def tool_result(cls, tool_call_id: str, tool_name: str, content: str) -> ConversationMessage:
        """The result of one tool call."""
        return cls(
            role=MessageRole.TOOL, content=content, tool_call_id=tool_call_id, tool_name=tool_name
        )

    def pinned_copy(self) -> ConversationMessage:
        """This message, pinned (itself when it already is)."""
        return self if self.pinned else self.model_copy(update={"pinned": True})

    def unpinned_copy(self) -> ConversationMessage:
        """This message, no longer pinned (itself when it is not)."""
        return self.model_copy(update={"pinned": False}) if self.pinned else self

    def estimate_tokens(self) -> int:
        """Symbiont's estimate for this message."""
        return estimate_message_tokens(self)


def estimate_message_tokens(message: ConversationMessage) -> int:
    """``max(bytes*10//33, 1) + 7``, counting tool calls and the tool_call_id as Symbiont does."""
    content = message.content
    # len() is the byte count of an ASCII string, and isascii() is O(1): no 20 KB encode of
    # every message at every iteration.
    chars = len(content) if content.isascii() else len(content.encode())
    for call in message.tool_calls:
        chars += len(call.name.encode()) + len(call.arguments.encode()) + len(call.id.encode()) + 30
    if message.tool_call_id is not None:
        chars += len(message.tool_call_id.encode()) + 20
    return max(chars * 10 // 33, 1) + 7


SharedMessage = Annotated[ConversationMessage, SharedWhenIdentical()]
"""A message parsed from JSON that is the same instance as the recently parsed ones of the same
JSON (:mod:`shared.identical`): the system prompt and the step's instruction that every task of
a kind repeats are held once by a worker's kept conversations, not once per task."""
_SHARED_MESSAGE: TypeAdapter[ConversationMessage] = TypeAdapter(SharedMessage)


def shared_message(text: str | bytes) -> ConversationMessage:
    """The message whose JSON is ``text`` (:data:`SharedMessage`)."""
    return _SHARED_MESSAGE.validate_json(text)


class Conversation(BaseModel):
    """An ordered list of messages with the provider conversions and budget truncation."""

    _token_cache: dict[int, tuple[ConversationMessage, int]] = PrivateAttr(default_factory=dict)
    """Estimates by message identity (the message is held, so its id is not reused)."""

    messages: list[ConversationMessage] = Field(default_factory=list)

    def __eq__(self, other: object) -> bool:
        """Equal messages make equal conversations (the estimate cache is not compared)."""
        if not isinstance(other, Conversation):
            return NotImplemented
        return self.messages == other.messages

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic's own models

    @classmethod
    def with_system(cls, content: str, *, pin: bool = False) -> Conversation:
        """A conversation that starts with a system prompt (pinned with ``pin=True``)."""
        return cls(messages=[ConversationMessage.system(content, pin=pin)])

    def push(self, message: ConversationMessage) -> None:
        """Append a message."""
        self.messages.append(message)

    def pop(self) -> ConversationMessage | None:
        """Remove and return the last message, or None when empty."""
        return self.messages.pop() if self.messages else None

    def __len__(self) -> int:
        return len(self.messages)

    def is_empty(self) -> bool:
        """True when there are no messages."""
        return not self.messages

    def estimate_tokens(self) -> int:
        """The sum of the per-message estimates (each message's estimated once: a context fit
        counts the whole conversation at every iteration)."""
        cache = self._token_cache
        total = 0
        for message in self.messages:
            entry = cache.get(id(message))
            if entry is None or entry[0] is not message:
                entry = cache[id(message)] = (message, estimate_message_tokens(message))
            total += entry[1]
        if len(cache) > 2 * len(self.messages) + 16:  # forget messages no longer here
            live = {id(m) for m in self.messages}
            self._token_cache = {k: v for k, v in cache.items() if k in live}
        return total

    def system_message(self) -> ConversationMessage | None:
        """The first system message, wherever it is."""
        return next((m for m in self.messages if m.role is MessageRole.SYSTEM), None)

    def last_assistant_message(self) -> ConversationMessage | None:
        """The most recent assistant message."""
        return next((m for m in reversed(self.messages) if m.role is MessageRole.ASSISTANT), None)

    def last_user_message(self) -> ConversationMessage | None:
        """The most recent user message (the task input for pre-hydration)."""
        return next((m for m in reversed(self.messages) if m.role is MessageRole.USER), None)

    # -- pins -------------------------------------------------------------------------------

    def pinned_messages(self) -> list[ConversationMessage]:
        """The pinned messages, in order."""
        return [m for m in self.messages if m.pinned]

    def pin_task(self) -> int:
        """Pin the opening messages (every system and user message before the first assistant
        or tool message: the system prompt and the task) unless a message is pinned already.

        For callers that hand over a conversation built without pins; returns how many
        messages it pinned.
        """
        if any(m.pinned for m in self.messages):
            return 0
        opening = 0
        for message in self.messages:
            if message.role not in (MessageRole.SYSTEM, MessageRole.USER):
                break
            opening += 1
        self.messages[:opening] = [m.pinned_copy() for m in self.messages[:opening]]
        return opening

    def unpin(self, content: str) -> int:
        """Unpin the pinned messages whose content is ``content`` (the previous step's
        instruction when the next step starts); returns how many it unpinned."""
        hits = [i for i, m in enumerate(self.messages) if m.pinned and m.content == content]
        for index in hits:
            self.messages[index] = self.messages[index].unpinned_copy()
        return len(hits)

    # -- provider formats -------------------------------------------------------------------

    def to_openai_messages(self) -> list[dict[str, Any]]:
        """OpenAI chat-completions messages; system messages stay in place."""
        return [_openai_message(m) for m in self.messages]

    def to_anthropic_messages(self) -> tuple[str | None, list[dict[str, Any]]]:
        """``(system, messages)`` for the Anthropic Messages API.

        Every system message is kept: their contents are joined, in order, with a blank line.
        Tool results become ``tool_result`` blocks of a user turn (``is_error`` is set when the
        content starts with ``[Error]``); consecutive same-role turns are merged.
        """
        system_parts = [m.content for m in self.messages if m.role is MessageRole.SYSTEM]
        system = "\n\n".join(p for p in system_parts if p) or None
        merged: list[dict[str, Any]] = []
        for message in self.messages:
            if message.role is MessageRole.SYSTEM:
                continue
            turn = _anthropic_message(message)
            if merged and merged[-1]["role"] == turn["role"]:
                merged[-1]["content"] = _as_blocks(merged[-1]["content"]) + _as_blocks(
                    turn["content"]
                )
            else:
                merged.append(turn)
        return system, merged

    # -- budget -----------------------------------------------------------------------------

    def truncate_to_budget(self, max_tokens: int) -> bool:
        """Sliding window: keep the leading system prompt, every pinned message and the newest
        whole tool groups, in their original order.

        Groups keep an assistant tool-call message with all of its tool results. A group with a
        pinned call or result is kept whole; a pinned plain message inside a group stays while
        the rest of the group is kept or dropped as one. The system prompt and the pinned
        messages are paid for first and the rest of the budget goes to the newest groups: they
        are accepted while they fit; at the first that does not, older ones are not tried. The
        newest group is always kept (unless it is a stray tool result and an older group exists),
        even when the pinned messages alone exceed the budget, and unpinned tool results left
        without their call are removed. Returns True when any message was dropped.
        """
        if self.estimate_tokens() <= max_tokens:
            return False
        messages = self.messages
        fixed, units = _window_units(messages)
        remaining = max(max_tokens - sum(estimate_message_tokens(messages[i]) for i in fixed), 0)
        keep = set(fixed).union(_newest_units_within(messages, units, remaining))
        self.messages = _without_orphan_results([m for i, m in enumerate(messages) if i in keep])
        return len(self.messages) != len(messages)

    def inject_knowledge_context(self, text: str) -> None:
        """Insert or replace the ``[KNOWLEDGE_CONTEXT]`` message, just after the system prompt."""
        message = ConversationMessage.system(f"{KNOWLEDGE_CONTEXT_MARKER}\n{text}")
        for index, existing in enumerate(self.messages):
            if existing.role is MessageRole.SYSTEM and existing.content.startswith(
                KNOWLEDGE_CONTEXT_MARKER
            ):
                self.messages[index] = message
                return
        at = 1 if self.messages and self.messages[0].role is MessageRole.SYSTEM else 0
        self.messages.insert(at, message)

    def metadata(self) -> dict[str, str]:
        """Counts as strings, as Symbiont reports them."""
        return {
            "message_count": str(len(self.messages)),
            "estimated_tokens": str(self.estimate_tokens()),
            "has_system": "true" if self.system_message() is not None else "false",
            "tool_call_count": str(sum(len(m.tool_calls) for m in self.messages)),
            "tool_result_count": str(sum(1 for m in self.messages if m.role is MessageRole.TOOL)),
        }


def tool_groups(messages: list[ConversationMessage]) -> list[list[ConversationMessage]]:
    """Split messages into atomic units: a tool-call message stays with all its results."""
    groups: list[list[ConversationMessage]] = []
    current: list[ConversationMessage] = []
    pending: set[str] = set()
    for message in messages:
        current.append(message)
        pending.update(call.id for call in message.tool_calls)
        if message.role is MessageRole.TOOL and message.tool_call_id is not None:
            pending.discard(message.tool_call_id)
        if not pending:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def pins_group(message: ConversationMessage) -> bool:
    """True for a pinned tool call or result: its whole tool group must stay with it."""
    return message.pinned and (bool(message.tool_calls) or message.role is MessageRole.TOOL)


def _window_units(messages: list[ConversationMessage]) -> tuple[list[int], list[list[int]]]:
    """The indices the window always keeps (the leading system prompt, the pinned messages and
    the groups they pin) and the droppable units (groups less their pinned messages), oldest
    first."""
    fixed: list[int] = []
    units: list[list[int]] = []
    start = 1 if messages and messages[0].role is MessageRole.SYSTEM else 0
    fixed.extend(range(start))
    for group in tool_groups(messages[start:]):
        indices = list(range(start, start + len(group)))
        start += len(group)
        if any(pins_group(m) for m in group):
            fixed.extend(indices)
            continue
        fixed.extend(i for i in indices if messages[i].pinned)
        unit = [i for i in indices if not messages[i].pinned]
        if unit:
            units.append(unit)
    return fixed, units


def _newest_units_within(
    messages: list[ConversationMessage], units: list[list[int]], budget: int
) -> list[int]:
    """The newest whole units that fit, stopping at the first that does not (at least one)."""
    kept: list[int] = []
    used = 0
    for unit in reversed(units):
        cost = sum(estimate_message_tokens(messages[i]) for i in unit)
        if used + cost > budget:
            break
        kept.extend(unit)
        used += cost
    if not kept and units:
        usable = [u for u in units if messages[u[0]].role is not MessageRole.TOOL]
        kept = usable[-1] if usable else units[-1]
    return kept


def _without_orphan_results(messages: list[ConversationMessage]) -> list[ConversationMessage]:
    """Drop the unpinned tool results whose call is not among the messages before them."""
    calls: set[str] = set()
    kept: list[ConversationMessage] = []
    for message in messages:
        calls.update(call.id for call in message.tool_calls)
        orphan = message.role is MessageRole.TOOL and message.tool_call_id not in calls
        if not orphan or message.pinned:
            kept.append(message)
    return kept


def _openai_message(message: ConversationMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role.value}
    if message.content or message.role is not MessageRole.ASSISTANT:
        out["content"] = message.content
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _anthropic_message(message: ConversationMessage) -> dict[str, Any]:
    if message.role is MessageRole.TOOL:
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": message.content,
        }
        if message.content.startswith("[Error]"):
            block["is_error"] = True
        return {"role": "user", "content": [block]}
    if message.role is MessageRole.ASSISTANT and message.tool_calls:
        blocks: list[dict[str, Any]] = []
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        blocks.extend(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _parse_input(call)}
            for call in message.tool_calls
        )
        return {"role": "assistant", "content": blocks}
    return {"role": message.role.value, "content": message.content}


def _parse_input(call: ToolCall) -> dict[str, Any]:
    try:
        parsed = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _as_blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        # Anthropic rejects empty text blocks; an empty turn merged into another adds nothing.
        return [{"type": "text", "text": content}] if content else []
    return content
