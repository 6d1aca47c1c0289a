"""The knowledge bridge between an agent's ``KnowledgeStore`` and its loop (Symbiont §8).

Before each reasoning step, ``KnowledgeBridge.inject_context`` searches the store with terms
from the newest user and tool messages and puts what it finds in the ``[KNOWLEDGE_CONTEXT]``
system message. The model gets two tools, ``recall_knowledge`` (with ``scope="conventions"``
and a ``directory``, the directory walk of ``shared.conventions``) and ``store_knowledge``,
which the executor hands to ``handle_tool_call``. On completion ``persist_learnings`` stores a
summary of the assistant's answers, **only when** ``auto_persist`` is on (Symbiont ignores the
flag).

Where this differs from Symbiont:

- there is no separate memory query: the store is searched once; ``relevance_threshold`` is the
  minimum confidence of an item injected into the context (``recall_knowledge`` returns
  whatever the store finds);
- the summary is one per agent, kept under the item id ``last_conversation_summary`` (each
  completion replaces the previous one, as Symbiont's working-memory slot), as a ``Fact`` with
  confidence 0.5 and the tag ``last_conversation_summary``; it is capped at 2000 bytes even
  when it is a single message.

``RedisKnowledgeStore`` keeps an agent's items in one hash, ``orga:knowledge:{agent_id}``
(item id → JSON), capped at ``max_items`` (the oldest stored are evicted, atomically, by a Lua
script). A search fetches the agent's items and scores them in Python by shared words, like
``shared.conventions.InMemoryKnowledgeStore``: fine for hundreds of items per agent, not for a
corpus.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio import Redis

from shared.conventions import (
    KnowledgeItem,
    KnowledgeSpec,
    KnowledgeStore,
    KnowledgeType,
    format_conventions,
    retrieve_scoped_conventions,
)
from shared.conversation import Conversation, MessageRole
from shared.errors import OrgaError
from shared.inference import ToolDefinition
from shared.keys import knowledge_key
from workers.tools.base import ToolContext, ToolOutput

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "KNOWLEDGE_TOOL_NAMES",
    "LAST_CONVERSATION_SUMMARY_ID",
    "NO_KNOWLEDGE_FOUND",
    "RECALL_KNOWLEDGE",
    "STORE_KNOWLEDGE",
    "KnowledgeBridge",
    "KnowledgeConfig",
    "KnowledgeError",
    "KnowledgeTool",
    "KnowledgeToolError",
    "RedisKnowledgeStore",
    "bridge_config",
    "extract_search_terms",
    "is_knowledge_tool",
    "knowledge_tools",
    "summarize_assistant_messages",
]

RECALL_KNOWLEDGE: Final = "recall_knowledge"
STORE_KNOWLEDGE: Final = "store_knowledge"
KNOWLEDGE_TOOL_NAMES: Final = frozenset({RECALL_KNOWLEDGE, STORE_KNOWLEDGE})
NO_KNOWLEDGE_FOUND: Final = "No relevant knowledge found."
LAST_CONVERSATION_SUMMARY_ID: Final = "last_conversation_summary"

_CONTEXT_HEADER = (
    "The following relevant knowledge and context was retrieved for this conversation:"
)
_SUMMARY_MAX_BYTES = 2000
_SUMMARY_CONFIDENCE = 0.5
_TERM_MESSAGES = 5
_TERMS_PER_MESSAGE = 10
_TERM_CAP = 15


class KnowledgeError(OrgaError):
    """The knowledge store failed while the bridge was using it."""


class KnowledgeToolError(KnowledgeError):
    """A knowledge tool call failed; the message is the text the model sees."""


class KnowledgeConfig(BaseModel):
    """How the bridge uses the store; the defaults are Symbiont's."""

    model_config = ConfigDict(frozen=True)

    max_context_items: int = Field(default=5, ge=0)
    relevance_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    auto_persist: bool = True


def is_knowledge_tool(name: str) -> bool:
    """True exactly for ``recall_knowledge`` and ``store_knowledge``."""
    return name in KNOWLEDGE_TOOL_NAMES


# -- search terms and summaries (pure) -----------------------------------------------------


def extract_search_terms(conversation: Conversation) -> list[str]:
    """Terms from the newest user and tool messages, as Symbiont picks them (§8.1).

    The last 5 messages, newest first; in each, the first 10 words longer than 3 bytes
    (measured before trimming), trimmed of non-alphanumerics, deduplicated; stop after a
    message once there are at least 15 terms.
    """
    terms: list[str] = []
    for message in reversed(conversation.messages[-_TERM_MESSAGES:]):
        if message.role in (MessageRole.USER, MessageRole.TOOL):
            for word in _long_words(message.content):
                term = _trim_non_alphanumeric(word)
                if term and term not in terms:
                    terms.append(term)
        if len(terms) >= _TERM_CAP:
            break
    return terms


def _long_words(text: str) -> list[str]:
    return [w for w in text.split() if len(w.encode()) > 3][:_TERMS_PER_MESSAGE]


def _trim_non_alphanumeric(word: str) -> str:
    start, end = 0, len(word)
    while start < end and not word[start].isalnum():
        start += 1
    while end > start and not word[end - 1].isalnum():
        end -= 1
    return word[start:end]


def summarize_assistant_messages(contents: Sequence[str]) -> str | None:
    """The non-empty contents joined with ``\\n---\\n``, cut to 2000 bytes plus ``...``.

    The cut falls on a character boundary. None when there is nothing to summarise.
    """
    kept = [c for c in contents if c]
    if not kept:
        return None
    joined = "\n---\n".join(kept)
    encoded = joined.encode()
    if len(encoded) <= _SUMMARY_MAX_BYTES:
        return joined
    return encoded[:_SUMMARY_MAX_BYTES].decode(errors="ignore") + "..."


def _knowledge_line(item: KnowledgeItem, prefix: str = "") -> str:
    return (
        f"- [{prefix}{item.knowledge_type.value}, confidence={item.confidence:.2f}] {item.content}"
    )


# -- tool definitions and arguments ---------------------------------------------------------

_RECALL_DEFINITION = ToolDefinition(
    name=RECALL_KNOWLEDGE,
    description=(
        "Search the agent's knowledge base for relevant information. Use this to recall facts, "
        "procedures, conventions, or patterns that may help with the current task. Use "
        "scope='conventions' with a directory to retrieve directory-scoped conventions."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "The search query to find relevant knowledge (or language name "
                "when scope='conventions')",
            },
            "limit": {
                "type": "integer",
                "description": "Maximum number of results to return (default: 5)",
                "default": 5,
                "minimum": 0,
            },
            "directory": {
                "type": "string",
                "description": "Directory path for scoped convention retrieval. Walks up parent "
                "directories for convention inheritance.",
            },
            "scope": {
                "type": "string",
                "description": "Set to 'conventions' to retrieve directory-scoped coding "
                "conventions instead of general knowledge.",
                "enum": ["conventions"],
            },
        },
        "required": ["query"],
    },
)

_STORE_DEFINITION = ToolDefinition(
    name=STORE_KNOWLEDGE,
    description=(
        "Store a new fact in the agent's knowledge base for future reference. Use this to "
        "remember important information learned during the conversation."
    ),
    parameters={
        "type": "object",
        "properties": {
            "subject": {
                "type": "string",
                "description": "The subject of the fact (e.g., 'Rust')",
            },
            "predicate": {"type": "string", "description": "The relationship (e.g., 'is_a')"},
            "object": {
                "type": "string",
                "description": "The object of the fact (e.g., 'systems programming language')",
            },
            "confidence": {
                "type": "number",
                "description": "Confidence level 0.0-1.0 (default: 0.8)",
                "default": 0.8,
                "minimum": 0,
                "maximum": 1,
            },
        },
        "required": ["subject", "predicate", "object"],
    },
)


class _RecallArguments(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    query: str
    limit: int = Field(default=5, ge=0)
    directory: str | None = None
    scope: str | None = None


class _StoreArguments(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    subject: str
    predicate: str
    object: str
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)


_Arguments = TypeVar("_Arguments", bound=BaseModel)


def _parse(model: type[_Arguments], arguments: object) -> _Arguments:
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'arguments'}: {error['msg']}"
            for error in exc.errors()
        )
        raise KnowledgeToolError(f"Invalid arguments: {problems}") from exc


# -- the bridge -----------------------------------------------------------------------------


class KnowledgeBridge:
    """Connects a ``KnowledgeStore`` to a reasoning loop (opt-in, one per loop)."""

    def __init__(self, store: KnowledgeStore, config: KnowledgeConfig | None = None) -> None:
        self._store = store
        self._config = config if config is not None else KnowledgeConfig()

    @property
    def config(self) -> KnowledgeConfig:
        """The bridge's configuration."""
        return self._config

    @staticmethod
    def is_knowledge_tool(name: str) -> bool:
        """True exactly for ``recall_knowledge`` and ``store_knowledge``."""
        return is_knowledge_tool(name)

    def tool_definitions(self) -> list[ToolDefinition]:
        """``recall_knowledge`` and ``store_knowledge``."""
        return [_RECALL_DEFINITION, _STORE_DEFINITION]

    async def inject_context(self, agent_id: str, conversation: Conversation) -> int:
        """Search the store and (re)place ``[KNOWLEDGE_CONTEXT]``; return the items injected.

        With no search terms, or nothing found, the conversation is left as it is (an earlier
        injection stays). Raises ``KnowledgeError`` when the store fails.
        """
        terms = extract_search_terms(conversation)
        if not terms or self._config.max_context_items == 0:
            return 0
        items = await self._search(agent_id, " ".join(terms), self._config.max_context_items)
        relevant = [i for i in items if i.confidence >= self._config.relevance_threshold]
        if relevant:
            lines = "\n".join(_knowledge_line(item, "knowledge/") for item in relevant)
            conversation.inject_knowledge_context(f"{_CONTEXT_HEADER}\n{lines}")
        return len(relevant)

    async def handle_tool_call(self, agent_id: str, name: str, arguments: dict[str, Any]) -> str:
        """Run a knowledge tool; failures raise ``KnowledgeToolError`` with the model's text."""
        if name == RECALL_KNOWLEDGE:
            return await self._recall(agent_id, _parse(_RecallArguments, arguments))
        if name == STORE_KNOWLEDGE:
            return await self._store_fact(agent_id, _parse(_StoreArguments, arguments))
        raise KnowledgeToolError(f"Unknown knowledge tool: {name}")

    async def persist_learnings(self, agent_id: str, conversation: Conversation) -> str | None:
        """Store a summary of the assistant's answers when ``auto_persist`` is on.

        Returns the stored item's id, or None when nothing was stored.
        """
        if not self._config.auto_persist:
            return None
        summary = summarize_assistant_messages(
            [m.content for m in conversation.messages if m.role is MessageRole.ASSISTANT]
        )
        if summary is None:
            return None
        item = KnowledgeItem(
            content=summary,
            knowledge_type=KnowledgeType.FACT,
            confidence=_SUMMARY_CONFIDENCE,
            item_id=LAST_CONVERSATION_SUMMARY_ID,
            tags=[LAST_CONVERSATION_SUMMARY_ID],
        )
        try:
            return await self._store.add_knowledge(agent_id, item)
        except Exception as exc:
            raise KnowledgeError(
                f"Failed to store the conversation summary of agent {agent_id!r}: {exc}"
            ) from exc

    async def _search(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        try:
            return await self._store.search_knowledge(agent_id, query, limit)
        except Exception as exc:
            raise KnowledgeError(
                f"Knowledge search failed for agent {agent_id!r}, query {query!r}: {exc}"
            ) from exc

    async def _recall(self, agent_id: str, args: _RecallArguments) -> str:
        if args.directory is not None and args.scope == "conventions":
            found = await retrieve_scoped_conventions(
                self._store, agent_id, args.query, args.directory, args.limit
            )
            return format_conventions(found)
        try:
            items = await self._store.search_knowledge(agent_id, args.query, args.limit)
        except Exception as exc:
            raise KnowledgeToolError(f"Knowledge search failed: {exc}") from exc
        if not items:
            return NO_KNOWLEDGE_FOUND
        return "\n".join(_knowledge_line(item) for item in items)

    async def _store_fact(self, agent_id: str, args: _StoreArguments) -> str:
        item = KnowledgeItem(
            content=f"{args.subject} {args.predicate} {args.object}",
            knowledge_type=KnowledgeType.FACT,
            confidence=args.confidence,
        )
        try:
            item_id = await self._store.add_knowledge(agent_id, item)
        except Exception as exc:
            raise KnowledgeToolError(f"Failed to store knowledge: {exc}") from exc
        return f"Stored fact: {args.subject} {args.predicate} {args.object} (id: {item_id})"


# -- the tools, as the executor runs them ---------------------------------------------------


class KnowledgeTool:
    """``recall_knowledge`` or ``store_knowledge`` as a tool of a worker's registry: the
    executor runs it like any other tool (timeouts, breakers, recovery), on the agent's store
    (``context.agent_id``). The model sees it only in tasks with a ``knowledge`` block."""

    def __init__(self, name: str, store: KnowledgeStore) -> None:
        if name not in KNOWLEDGE_TOOL_NAMES:
            raise KnowledgeError(
                f"unknown knowledge tool {name!r}; use one of {sorted(KNOWLEDGE_TOOL_NAMES)}"
            )
        self._name = name
        self._bridge = KnowledgeBridge(store)

    @property
    def read_only(self) -> bool:
        """``recall_knowledge`` only reads the store (``reads_only``)."""
        return self._name == RECALL_KNOWLEDGE

    @property
    def definition(self) -> ToolDefinition:
        """The tool's definition, as Symbiont's bridge gives it."""
        return _RECALL_DEFINITION if self._name == RECALL_KNOWLEDGE else _STORE_DEFINITION

    async def run(self, arguments: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Search or add to the agent's store; a failure is an error the model reads."""
        metadata = {"kind": "read" if self._name == RECALL_KNOWLEDGE else "other",
                    "tool_name": self._name}  # fmt: skip
        try:
            content = await self._bridge.handle_tool_call(context.agent_id, self._name, arguments)
        except KnowledgeToolError as exc:
            return ToolOutput(content=str(exc), is_error=True, metadata=metadata)
        return ToolOutput(content=content, metadata=metadata)


def knowledge_tools(store: KnowledgeStore) -> list[KnowledgeTool]:
    """``recall_knowledge`` and ``store_knowledge`` on ``store``."""
    return [KnowledgeTool(RECALL_KNOWLEDGE, store), KnowledgeTool(STORE_KNOWLEDGE, store)]


def bridge_config(spec: KnowledgeSpec) -> KnowledgeConfig:
    """The bridge's settings from a task's ``knowledge`` block."""
    return KnowledgeConfig(
        max_context_items=spec.max_context_items,
        relevance_threshold=spec.relevance_threshold,
        auto_persist=spec.auto_persist,
    )


# -- the Redis store ------------------------------------------------------------------------

DEFAULT_MAX_ITEMS = 1000

_ADD_SCRIPT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local excess = redis.call('HLEN', KEYS[1]) - tonumber(ARGV[3])
if excess <= 0 then return 0 end
local flat = redis.call('HGETALL', KEYS[1])
local others = {}
for i = 1, #flat, 2 do
  -- A task's seeds ('seed-' ids) are never evicted: a later run relies on them.
  if flat[i] ~= ARGV[1] and string.sub(flat[i], 1, 5) ~= 'seed-' then
    local ok, record = pcall(cjson.decode, flat[i + 1])
    local at = 0
    if ok and type(record) == 'table' and type(record['stored_at_us']) == 'number' then
      at = record['stored_at_us']
    end
    table.insert(others, {flat[i], at})
  end
end
table.sort(others, function(a, b)
  if a[2] == b[2] then return a[1] < b[1] end
  return a[2] < b[2]
end)
for i = 1, math.min(excess, #others) do redis.call('HDEL', KEYS[1], others[i][1]) end
return excess
"""

_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class _Record(BaseModel):
    item: KnowledgeItem
    stored_at_us: int


class RedisKnowledgeStore:
    """A ``KnowledgeStore`` on Redis: one hash per agent, word-overlap search in Python.

    Ranking is that of ``InMemoryKnowledgeStore``: the number of query words found in the
    item's content and tags, then confidence, then the oldest stored first. Adding an item with
    an existing ``item_id`` replaces it. Past ``max_items`` the oldest stored items are evicted.
    """

    def __init__(self, redis: Redis, *, max_items: int = DEFAULT_MAX_ITEMS) -> None:
        if max_items < 1:
            raise ValueError(f"RedisKnowledgeStore max_items must be >= 1, got {max_items}")
        self._redis = redis
        self._max_items = max_items
        self._add = redis.register_script(_ADD_SCRIPT)

    async def add_knowledge(self, agent_id: str, item: KnowledgeItem) -> str:
        """Store ``item`` (a new id unless it has one) and return its id."""
        item_id = item.item_id or uuid.uuid4().hex
        record = _Record(
            item=item.model_copy(update={"item_id": item_id}),
            stored_at_us=time.time_ns() // 1000,
        )
        args: list[str | int] = [item_id, record.model_dump_json(), self._max_items]
        await self._add(keys=[knowledge_key(agent_id)], args=args)
        return item_id

    async def search_knowledge(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        """Up to ``limit`` items sharing words with ``query``, best first."""
        wanted = _words(query)
        if limit <= 0 or not wanted:
            return []
        records = await self._records(agent_id)
        scored = []
        for record in records:
            shared = len(wanted & _words(" ".join([record.item.content, *record.item.tags])))
            if shared:
                key = (-shared, -record.item.confidence, record.stored_at_us)
                scored.append((key, record.item))
        scored.sort(key=lambda pair: pair[0])
        return [item for _, item in scored[:limit]]

    async def items(self, agent_id: str) -> list[KnowledgeItem]:
        """Every item of ``agent_id``, oldest stored first."""
        return [record.item for record in await self._records(agent_id)]

    async def _records(self, agent_id: str) -> list[_Record]:
        raw = await self._redis.hgetall(knowledge_key(agent_id))
        records = [_decode_record(agent_id, field, value) for field, value in raw.items()]
        return sorted(records, key=lambda r: (r.stored_at_us, r.item.item_id or ""))


def _decode_record(agent_id: str, field: bytes | str, value: bytes | str) -> _Record:
    try:
        return _Record.model_validate_json(value)
    except ValidationError as exc:
        name = field.decode(errors="replace") if isinstance(field, bytes) else field
        raise KnowledgeError(
            f"knowledge of agent {agent_id!r}: field {name!r} of {knowledge_key(agent_id)} is "
            f"not a stored item ({exc.error_count()} validation errors); HDEL it to repair"
        ) from exc
