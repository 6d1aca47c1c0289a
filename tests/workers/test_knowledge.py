"""The knowledge bridge and the Redis knowledge store (Symbiont §8, §13.4, §13.16)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from pydantic import ValidationError

from shared.conventions import (
    ConventionSeed,
    FactSeed,
    InMemoryKnowledgeStore,
    KnowledgeItem,
    KnowledgeSpec,
    KnowledgeStore,
    KnowledgeType,
    convention_queries,
)
from shared.conversation import KNOWLEDGE_CONTEXT_MARKER, Conversation, ConversationMessage
from shared.keys import knowledge_key
from tests.conftest import RedisClientFactory
from workers.knowledge import (
    LAST_CONVERSATION_SUMMARY_ID,
    KnowledgeBridge,
    KnowledgeConfig,
    KnowledgeError,
    KnowledgeToolError,
    RedisKnowledgeStore,
    extract_search_terms,
    is_knowledge_tool,
    summarize_assistant_messages,
)

Msg = ConversationMessage
AGENT = "agent-1"


class RecordingStore:
    """A KnowledgeStore that answers from a list and records every call."""

    def __init__(self, items: list[KnowledgeItem] | None = None, *, fail: bool = False) -> None:
        self.items = list(items or [])
        self.fail = fail
        self.searches: list[tuple[str, str, int]] = []
        self.added: list[tuple[str, KnowledgeItem]] = []

    async def search_knowledge(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        self.searches.append((agent_id, query, limit))
        if self.fail:
            raise RuntimeError("store is down")
        return self.items[:limit]

    async def add_knowledge(self, agent_id: str, item: KnowledgeItem) -> str:
        if self.fail:
            raise RuntimeError("store is down")
        self.added.append((agent_id, item))
        return item.item_id or f"id-{len(self.added)}"


def _fact(content: str, confidence: float = 0.9) -> KnowledgeItem:
    return KnowledgeItem(content=content, knowledge_type=KnowledgeType.FACT, confidence=confidence)


def _conversation(*messages: ConversationMessage) -> Conversation:
    return Conversation(messages=[Msg.system("You are helpful."), *messages])


# -- config, summaries, terms ---------------------------------------------------------------


def test_knowledge_config_default() -> None:
    """The defaults are 5 items, threshold 0.3 and auto_persist on."""
    config = KnowledgeConfig()
    assert (config.max_context_items, config.relevance_threshold, config.auto_persist) == (
        5,
        0.3,
        True,
    )
    with pytest.raises(ValidationError):
        KnowledgeConfig(relevance_threshold=1.5)


def test_summarize_assistant_messages_single_message_untruncated() -> None:
    """One short message is stored verbatim."""
    assert summarize_assistant_messages(["short reply"]) == "short reply"


def test_summarize_assistant_messages_joins_multiple_short_messages() -> None:
    """Several messages are joined with a --- separator line."""
    assert summarize_assistant_messages(["first", "second"]) == "first\n---\nsecond"


def test_summarize_assistant_messages_truncates_on_char_boundary_not_mid_multibyte() -> None:
    """A 2001-byte join is cut before the two-byte é, never inside it."""
    summary = summarize_assistant_messages(["a" * 1994, "é"])
    assert summary == "a" * 1994 + "\n---\n" + "..."


def test_summarize_assistant_messages_untruncated_when_under_limit() -> None:
    """A short join gets no ellipsis."""
    summary = summarize_assistant_messages(["one", "two"])
    assert summary is not None
    assert not summary.endswith("...")


def test_summarize_caps_a_single_long_message_and_skips_empty() -> None:
    """A single long message is capped too; empty contents are ignored; none gives None."""
    summary = summarize_assistant_messages(["", "x" * 5000])
    assert summary == "x" * 2000 + "..."
    assert summarize_assistant_messages(["", ""]) is None
    assert summarize_assistant_messages([]) is None


def test_extract_search_terms_from_user_message() -> None:
    """Long words of the user message become terms, punctuation trimmed."""
    terms = extract_search_terms(
        _conversation(Msg.user("What is the weather forecast for tomorrow?"))
    )
    assert terms == ["What", "weather", "forecast", "tomorrow"]


def test_extract_search_terms_skips_short_words() -> None:
    """Words of three bytes or fewer are skipped, measured before trimming."""
    terms = extract_search_terms(_conversation(Msg.user("I am at the big house")))
    assert terms == ["house"]
    assert extract_search_terms(_conversation(Msg.user("the big. dog"))) == ["big"]


def test_extract_search_terms_empty_conversation() -> None:
    """No messages give no terms."""
    assert extract_search_terms(Conversation()) == []


def test_extract_search_terms_ignores_assistant() -> None:
    """Assistant and system messages give no terms."""
    assert (
        extract_search_terms(Conversation(messages=[Msg.assistant("Plenty of words here")])) == []
    )
    assert extract_search_terms(_conversation()) == []


def test_extract_search_terms_order_window_and_caps() -> None:
    """Newest first, tool results count, last five messages only, ten per message, stop at 15."""
    older = Msg.user("ancient words never reached")
    conv = _conversation(
        older,
        Msg.user(" ".join(f"alpha{i}" for i in range(12))),
        Msg.assistant("ignored assistant words"),
        Msg.tool_result("c", "t", "result(one) result(two) 'quoted'"),
        Msg.user(" ".join(f"beta{i}" for i in range(12))),
        Msg.user("latest question"),
    )
    terms = extract_search_terms(conv)
    assert terms[:2] == ["latest", "question"]
    assert terms[2:12] == [f"beta{i}" for i in range(10)]
    assert terms[12:] == ["result(one", "result(two", "quoted"]
    assert "ancient" not in terms


def test_extract_search_terms_cap_is_checked_per_message() -> None:
    """The 15-term cap is checked after each message, so one message may go past it."""
    conv = _conversation(
        Msg.user(" ".join(f"gamma{i}" for i in range(10))),
        Msg.user(" ".join(f"delta{i}" for i in range(10))),
        Msg.user(" ".join(f"omega{i}" for i in range(10))),
    )
    assert len(extract_search_terms(conv)) == 20


def test_extract_search_terms_deduplicates() -> None:
    """A term already found is not added again."""
    conv = _conversation(Msg.user("Python python Python!"), Msg.user("Python rules"))
    assert extract_search_terms(conv) == ["Python", "rules", "python"]


# -- tools --------------------------------------------------------------------------------


def test_tool_definitions() -> None:
    """recall_knowledge requires query; store_knowledge requires subject, predicate, object."""
    recall, store = KnowledgeBridge(RecordingStore()).tool_definitions()
    assert recall.name == "recall_knowledge"
    assert recall.parameters["required"] == ["query"]
    assert recall.parameters["properties"]["limit"]["default"] == 5
    assert "conventions" in recall.description
    assert store.name == "store_knowledge"
    assert store.parameters["required"] == ["subject", "predicate", "object"]
    assert store.parameters["properties"]["confidence"]["default"] == 0.8


def test_is_knowledge_tool() -> None:
    """Exactly the two knowledge tool names are knowledge tools."""
    assert is_knowledge_tool("recall_knowledge")
    assert KnowledgeBridge.is_knowledge_tool("store_knowledge")
    assert not is_knowledge_tool("web_search")
    assert not is_knowledge_tool("")


def test_recall_tool_def_has_directory_and_scope() -> None:
    """recall_knowledge offers directory and scope (enum conventions); query stays required."""
    properties = KnowledgeBridge(RecordingStore()).tool_definitions()[0].parameters["properties"]
    assert properties["directory"]["type"] == "string"
    assert properties["scope"]["enum"] == ["conventions"]


def test_recall_tool_backward_compatible() -> None:
    """directory and scope are optional."""
    required = KnowledgeBridge(RecordingStore()).tool_definitions()[0].parameters["required"]
    assert "directory" not in required
    assert "scope" not in required


def test_recall_formats_items() -> None:
    """recall lists what the store found, one line per item."""
    store = RecordingStore([_fact("The capital of France is Paris")])
    bridge = KnowledgeBridge(store)
    result = asyncio.run(
        bridge.handle_tool_call(AGENT, "recall_knowledge", {"query": "capital of France"})
    )
    assert result == "- [Fact, confidence=0.90] The capital of France is Paris"
    assert store.searches == [(AGENT, "capital of France", 5)]


def test_recall_nothing_found() -> None:
    """An empty search says so."""
    result = asyncio.run(
        KnowledgeBridge(RecordingStore()).handle_tool_call(
            AGENT, "recall_knowledge", {"query": "x"}
        )
    )
    assert result == "No relevant knowledge found."


def test_recall_with_directory_and_conventions_scope_walks_directories() -> None:
    """scope conventions with a directory queries every level, then the language, and
    answers with the conventions found (not the fact the store also matched)."""
    rule = KnowledgeItem(content="rust conventions src: Use 4 spaces", confidence=0.7)
    store = RecordingStore([_fact("src is the rust crate", 0.9), rule])
    arguments = {
        "query": "rust",
        "directory": "src/api/handlers",
        "scope": "conventions",
        "limit": 3,
    }
    result = asyncio.run(
        KnowledgeBridge(store).handle_tool_call(AGENT, "recall_knowledge", arguments)
    )
    assert [query for _, query, _ in store.searches] == convention_queries(
        "rust", "src/api/handlers"
    )
    assert [query for _, query, _ in store.searches] == [
        "rust conventions src/api/handlers",
        "rust conventions src/api",
        "rust conventions src",
        "rust conventions ",
        "rust conventions",
    ]
    assert result == "- [Fact, confidence=0.70] rust conventions src: Use 4 spaces"


def test_recall_conventions_nothing_found() -> None:
    """The conventions walk with no hits says so."""
    arguments = {"query": "rust", "directory": "src", "scope": "conventions"}
    result = asyncio.run(
        KnowledgeBridge(RecordingStore()).handle_tool_call(AGENT, "recall_knowledge", arguments)
    )
    assert result == "No relevant conventions found."


@pytest.mark.parametrize(
    "extra",
    [{"scope": "conventions"}, {"directory": "src/api"}, {"directory": "src", "scope": None}],
)
def test_recall_without_both_directory_and_scope_is_a_plain_search(extra: dict[str, Any]) -> None:
    """Scope without directory, or directory without scope, searches the query as given."""
    store = RecordingStore()
    arguments = {"query": "rust", **extra}
    asyncio.run(KnowledgeBridge(store).handle_tool_call(AGENT, "recall_knowledge", arguments))
    assert store.searches == [(AGENT, "rust", 5)]


def test_store_knowledge_adds_a_fact() -> None:
    """store_knowledge adds one fact with the given confidence and reports its id."""
    store = RecordingStore()
    arguments = {"subject": "Earth", "predicate": "has", "object": "one moon", "confidence": 0.95}
    result = asyncio.run(
        KnowledgeBridge(store).handle_tool_call(AGENT, "store_knowledge", arguments)
    )
    assert result == "Stored fact: Earth has one moon (id: id-1)"
    ((agent_id, item),) = store.added
    assert agent_id == AGENT
    assert item.content == "Earth has one moon"
    assert item.knowledge_type is KnowledgeType.FACT
    assert item.confidence == 0.95


def test_store_knowledge_default_confidence() -> None:
    """Without a confidence the fact gets 0.8."""
    store = RecordingStore()
    arguments = {"subject": "a", "predicate": "b", "object": "c"}
    asyncio.run(KnowledgeBridge(store).handle_tool_call(AGENT, "store_knowledge", arguments))
    assert store.added[0][1].confidence == 0.8


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("web_search", {}, "Unknown knowledge tool: web_search"),
        ("recall_knowledge", {}, "Invalid arguments: query: Field required"),
        ("recall_knowledge", {"query": "x", "limit": "5"}, "Invalid arguments: limit: "),
        ("recall_knowledge", {"query": "x", "limit": -1}, "Invalid arguments: limit: "),
        ("store_knowledge", {"subject": "a", "predicate": "b"}, "Invalid arguments: object: "),
        (
            "store_knowledge",
            {"subject": "a", "predicate": "b", "object": "c", "confidence": 2},
            "Invalid arguments: confidence: ",
        ),
    ],
)
def test_tool_call_errors(name: str, arguments: dict[str, Any], message: str) -> None:
    """Unknown tools and bad arguments fail with Symbiont's texts."""
    bridge = KnowledgeBridge(RecordingStore())
    with pytest.raises(KnowledgeToolError) as error:
        asyncio.run(bridge.handle_tool_call(AGENT, name, arguments))
    assert str(error.value).startswith(message)


def test_tool_call_store_failures() -> None:
    """A failing store gives the search and store failure texts."""
    bridge = KnowledgeBridge(RecordingStore(fail=True))
    with pytest.raises(KnowledgeToolError, match=r"^Knowledge search failed: store is down$"):
        asyncio.run(bridge.handle_tool_call(AGENT, "recall_knowledge", {"query": "x"}))
    arguments = {"subject": "a", "predicate": "b", "object": "c"}
    with pytest.raises(KnowledgeToolError, match=r"^Failed to store knowledge: store is down$"):
        asyncio.run(bridge.handle_tool_call(AGENT, "store_knowledge", arguments))


# -- injection and persistence ----------------------------------------------------------------


def test_knowledge_injection() -> None:
    """Relevant knowledge is injected after the system prompt and counted."""
    store = RecordingStore([_fact("Rust is a systems programming language")])
    conv = _conversation(Msg.user("Tell me about Rust programming language"))
    count = asyncio.run(KnowledgeBridge(store).inject_context(AGENT, conv))
    assert count == 1
    assert store.searches == [(AGENT, "Tell about Rust programming language", 5)]
    assert conv.messages[1].content == (
        "[KNOWLEDGE_CONTEXT]\n"
        "The following relevant knowledge and context was retrieved for this conversation:\n"
        "- [knowledge/Fact, confidence=0.90] Rust is a systems programming language"
    )


def test_injection_replaces_previous_context() -> None:
    """Each step replaces the knowledge message instead of adding another."""
    store = RecordingStore([_fact("first")])
    bridge = KnowledgeBridge(store)
    conv = _conversation(Msg.user("question about things"))
    asyncio.run(bridge.inject_context(AGENT, conv))
    store.items = [_fact("second", 0.5)]
    asyncio.run(bridge.inject_context(AGENT, conv))
    marked = [m.content for m in conv.messages if m.content.startswith(KNOWLEDGE_CONTEXT_MARKER)]
    assert len(marked) == 1
    assert marked[0].endswith("- [knowledge/Fact, confidence=0.50] second")


def test_injection_without_terms_or_results_changes_nothing() -> None:
    """No terms means no search; no results leaves the conversation (and old context) alone."""
    store = RecordingStore()
    bridge = KnowledgeBridge(store)
    conv = _conversation(Msg.user("hi"))
    assert asyncio.run(bridge.inject_context(AGENT, conv)) == 0
    assert store.searches == []
    conv.push(Msg.user("something longer"))
    conv.inject_knowledge_context("old")
    before = list(conv.messages)
    assert asyncio.run(bridge.inject_context(AGENT, conv)) == 0
    assert conv.messages == before


def test_injection_respects_max_items_and_relevance_threshold() -> None:
    """The store is asked for max_context_items; items below the threshold are not injected."""
    store = RecordingStore([_fact("sure", 0.9), _fact("doubtful", 0.1), _fact("extra", 0.9)])
    bridge = KnowledgeBridge(store, KnowledgeConfig(max_context_items=2, relevance_threshold=0.3))
    conv = _conversation(Msg.user("tell me things"))
    assert asyncio.run(bridge.inject_context(AGENT, conv)) == 1
    assert store.searches[0][2] == 2
    assert "doubtful" not in conv.messages[1].content


def test_injection_store_failure_raises_knowledge_error() -> None:
    """A failing store surfaces as KnowledgeError naming the agent."""
    bridge = KnowledgeBridge(RecordingStore(fail=True))
    with pytest.raises(KnowledgeError, match="agent-1"):
        asyncio.run(bridge.inject_context(AGENT, _conversation(Msg.user("tell me things"))))


def _answered() -> Conversation:
    return _conversation(
        Msg.user("What is it all about?"), Msg.assistant("The answer to everything is 42.")
    )


def test_persist_learnings_when_auto_persist() -> None:
    """With auto_persist the summary of the answers is stored as the agent's summary note."""
    store = RecordingStore()
    stored_id = asyncio.run(KnowledgeBridge(store).persist_learnings(AGENT, _answered()))
    assert stored_id == LAST_CONVERSATION_SUMMARY_ID
    ((agent_id, item),) = store.added
    assert agent_id == AGENT
    assert "42" in item.content
    assert item.item_id == LAST_CONVERSATION_SUMMARY_ID


def test_persist_learnings_off_stores_nothing() -> None:
    """With auto_persist off nothing is stored (Symbiont stored anyway)."""
    store = RecordingStore()
    bridge = KnowledgeBridge(store, KnowledgeConfig(auto_persist=False))
    assert asyncio.run(bridge.persist_learnings(AGENT, _answered())) is None
    assert store.added == []


def test_persist_learnings_without_answers_stores_nothing() -> None:
    """A conversation with no assistant text stores nothing."""
    store = RecordingStore()
    conv = _conversation(Msg.user("q"), Msg.assistant(""))
    assert asyncio.run(KnowledgeBridge(store).persist_learnings(AGENT, conv)) is None
    assert store.added == []


def test_persist_learnings_store_failure_raises() -> None:
    """A failing store surfaces as KnowledgeError."""
    with pytest.raises(KnowledgeError, match="summary"):
        asyncio.run(
            KnowledgeBridge(RecordingStore(fail=True)).persist_learnings(AGENT, _answered())
        )


# -- the same behaviour over every KnowledgeStore ----------------------------------------------

StoreFactory = Callable[[], AbstractAsyncContextManager[KnowledgeStore]]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_factory(request: pytest.FixtureRequest) -> StoreFactory:
    """Opens an empty store of each implementation."""
    if request.param == "memory":

        @asynccontextmanager
        async def memory() -> AsyncIterator[KnowledgeStore]:
            yield InMemoryKnowledgeStore()

        return memory
    clients: RedisClientFactory = request.getfixturevalue("redis_client")

    @asynccontextmanager
    async def on_redis() -> AsyncIterator[KnowledgeStore]:
        async with clients() as client:
            yield RedisKnowledgeStore(client)

    return on_redis


def test_store_ranks_by_shared_words_then_confidence(store_factory: StoreFactory) -> None:
    """Both stores rank by shared words, then confidence, then age, and honour the limit."""

    async def scenario() -> list[str]:
        async with store_factory() as store:
            for item in [
                _fact("rust conventions use snake_case", 0.6),
                _fact("python conventions use black", 0.9),
                _fact("rust conventions in src/api prefer thiserror", 0.8),
                _fact("unrelated", 1.0),
            ]:
                await store.add_knowledge(AGENT, item)
            found = await store.search_knowledge(AGENT, "rust conventions src/api", 3)
            assert await store.search_knowledge(AGENT, "", 3) == []
            assert await store.search_knowledge(AGENT, "rust", 0) == []
            assert await store.search_knowledge("other-agent", "rust", 3) == []
            return [item.content for item in found]

    assert asyncio.run(scenario()) == [
        "rust conventions in src/api prefer thiserror",
        "rust conventions use snake_case",
        "python conventions use black",
    ]


def test_store_upserts_by_id_and_matches_tags(store_factory: StoreFactory) -> None:
    """An item with an existing id replaces it; tags are searched too."""

    async def scenario() -> None:
        async with store_factory() as store:
            first = await store.add_knowledge(AGENT, KnowledgeItem(content="v1", item_id="note"))
            second = await store.add_knowledge(
                AGENT, KnowledgeItem(content="v2", item_id="note", tags=["summary"])
            )
            assert first == second == "note"
            found = await store.search_knowledge(AGENT, "summary", 5)
            assert [(i.content, i.item_id) for i in found] == [("v2", "note")]
            new_id = await store.add_knowledge(AGENT, KnowledgeItem(content="fresh"))
            assert new_id not in ("", "note")

    asyncio.run(scenario())


def test_bridge_round_trip_over_store(store_factory: StoreFactory) -> None:
    """Facts stored through the tool are recalled and injected from a real store."""

    async def scenario() -> None:
        async with store_factory() as store:
            bridge = KnowledgeBridge(store)
            arguments = {"subject": "Earth", "predicate": "has", "object": "one moon"}
            stored = await bridge.handle_tool_call(AGENT, "store_knowledge", arguments)
            assert stored.startswith("Stored fact: Earth has one moon (id: ")
            recalled = await bridge.handle_tool_call(AGENT, "recall_knowledge", {"query": "moon"})
            assert recalled == "- [Fact, confidence=0.80] Earth has one moon"
            conv = _conversation(Msg.user("How many moons does Earth have?"))
            assert await bridge.inject_context(AGENT, conv) == 1
            await bridge.persist_learnings(AGENT, _answered())
            await bridge.persist_learnings(AGENT, _conversation(Msg.assistant("Later: 43.")))
            notes = await store.search_knowledge(AGENT, "last_conversation_summary", 5)
            assert [n.content for n in notes] == ["Later: 43."]

    asyncio.run(scenario())


def test_recall_by_directory_over_store_leaks_no_other_scope(store_factory: StoreFactory) -> None:
    """recall_knowledge {directory: src/api/handlers, scope: conventions} answers the
    conventions of src/api/handlers and its parents, then the language-wide ones: never a
    src/web convention, another language's, or a fact, though they share the query's words."""
    spec = KnowledgeSpec(
        conventions=[
            ConventionSeed(language="python", directory="src/web", content="jinja templates"),
            ConventionSeed(language="python", content="type-hint public functions"),
            ConventionSeed(language="python", directory="src/api", content="return early"),
            ConventionSeed(language="go", directory="src/api", content="wrap errors"),
        ],
        facts=[
            FactSeed(
                subject="src/api/handlers",
                predicate="are owned by",
                object="the python conventions team",
            )
        ],
    )
    arguments = {"query": "python", "directory": "src/api/handlers", "scope": "conventions"}

    async def scenario() -> str:
        async with store_factory() as store:
            for seeded in spec.seed_items():
                await store.add_knowledge(AGENT, seeded)
            return await KnowledgeBridge(store).handle_tool_call(
                AGENT, "recall_knowledge", arguments
            )

    assert asyncio.run(scenario()).splitlines() == [
        "- [Pattern, confidence=0.90] python conventions src/api: return early",
        "- [Pattern, confidence=0.90] python conventions: type-hint public functions",
    ]


# -- Redis specifics ----------------------------------------------------------------------------


def test_redis_store_layout_and_eviction(redis_client: RedisClientFactory) -> None:
    """Items live in one hash per agent; past max_items the oldest stored are evicted."""

    async def scenario() -> None:
        async with redis_client(decode_responses=True) as client:
            store = RedisKnowledgeStore(client, max_items=3)
            for n in range(5):
                await store.add_knowledge(
                    AGENT, KnowledgeItem(content=f"item {n}", item_id=f"i{n}")
                )
            assert sorted(await client.hkeys(knowledge_key(AGENT))) == ["i2", "i3", "i4"]
            assert [i.content for i in await store.items(AGENT)] == ["item 2", "item 3", "item 4"]
            await store.add_knowledge(AGENT, KnowledgeItem(content="item 2 again", item_id="i2"))
            await store.add_knowledge(AGENT, KnowledgeItem(content="item 5", item_id="i5"))
            assert sorted(await client.hkeys(knowledge_key(AGENT))) == ["i2", "i4", "i5"]

    asyncio.run(scenario())


def test_redis_store_concurrent_adds_respect_the_cap(redis_client: RedisClientFactory) -> None:
    """Concurrent adds never leave more than max_items."""

    async def scenario() -> None:
        async with redis_client() as client:
            store = RedisKnowledgeStore(client, max_items=5)
            await asyncio.gather(
                *(store.add_knowledge(AGENT, KnowledgeItem(content=f"n{i}")) for i in range(30))
            )
            assert await client.hlen(knowledge_key(AGENT)) == 5

    asyncio.run(scenario())


def test_redis_store_corrupt_entry_is_reported(redis_client: RedisClientFactory) -> None:
    """An entry that is not a stored item raises KnowledgeError naming the field."""

    async def scenario() -> None:
        async with redis_client() as client:
            await client.hset(knowledge_key(AGENT), "bad", "not json")
            with pytest.raises(KnowledgeError, match="'bad'"):
                await RedisKnowledgeStore(client).search_knowledge(AGENT, "anything", 5)

    asyncio.run(scenario())


def test_redis_store_rejects_zero_capacity() -> None:
    """max_items below 1 is refused with the value."""
    from redis.asyncio import Redis

    with pytest.raises(ValueError, match="got 0"):
        RedisKnowledgeStore(Redis(), max_items=0)


def test_redis_store_is_a_knowledge_store() -> None:
    """RedisKnowledgeStore satisfies the KnowledgeStore Protocol."""
    from redis.asyncio import Redis

    assert isinstance(RedisKnowledgeStore(Redis()), KnowledgeStore)
