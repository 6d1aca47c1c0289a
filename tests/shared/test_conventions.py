"""Directory-scoped conventions and the in-memory knowledge store (§8.4, §13.4)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.conventions import (
    InMemoryKnowledgeStore,
    KnowledgeItem,
    KnowledgeStore,
    KnowledgeType,
    convention_queries,
    directory_levels,
    format_conventions,
    retrieve_scoped_conventions,
)


class RecordingStore:
    """A knowledge store answering fixed items per query; records queries, fails on demand."""

    def __init__(
        self,
        answers: Mapping[str, list[KnowledgeItem]] | None = None,
        failing: frozenset[str] = frozenset(),
    ) -> None:
        self.answers = dict(answers or {})
        self.failing = failing
        self.searches: list[tuple[str, str, int]] = []

    async def search_knowledge(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        self.searches.append((agent_id, query, limit))
        if query in self.failing:
            raise ConnectionError(f"store down for {query!r}")
        return self.answers.get(query, [])[:limit]

    async def add_knowledge(self, agent_id: str, item: KnowledgeItem) -> str:
        raise AssertionError("retrieve_scoped_conventions must not add knowledge")

    @property
    def queries(self) -> list[str]:
        """The queries, in the order they were asked."""
        return [query for _, query, _ in self.searches]


def item(content: str, confidence: float = 0.8, **extra: object) -> KnowledgeItem:
    """A knowledge item with ``content``."""
    return KnowledgeItem.model_validate({"content": content, "confidence": confidence, **extra})


def retrieve(
    store: KnowledgeStore, directory: str = "src/api/handlers", limit: int = 5
) -> list[KnowledgeItem]:
    """Run the walk for agent ``a1`` and language ``rust``."""
    return asyncio.run(retrieve_scoped_conventions(store, "a1", "rust", directory, limit))


# ---- the walk --------------------------------------------------------------------------------

LEVELS_TABLE = [
    ("src/api/handlers", ["src/api/handlers", "src/api", "src", ""]),
    ("src/api/", ["src/api/", "src", ""]),
    ("./src/api", ["./src/api", "./src", ".", ""]),
    ("../x/y", ["../x/y", "../x", "..", ""]),
    ("/a/b", ["/a/b", "/a", "/"]),
    ("/", ["/"]),
    ("src", ["src", ""]),
    ("", [""]),
    ("src//api", ["src//api", "src", ""]),
    ("src/./api", ["src/./api", "src", ""]),
    ("a\\b", ["a\\b", ""]),
    # beyond the reference's table, same rules
    (".", [".", ""]),
    ("./", ["./", ""]),
    ("//a", ["//a", "/"]),
    ("/./a/", ["/./a/", "/"]),
    ("a//b/c", ["a//b/c", "a/b", "a", ""]),
]


@pytest.mark.parametrize(("directory", "levels"), LEVELS_TABLE)
def test_directory_levels(directory: str, levels: list[str]) -> None:
    """The walk visits the directory verbatim, then each normalised parent, as §8.4's table."""
    assert directory_levels(directory) == levels


@pytest.mark.parametrize(("directory", "levels"), LEVELS_TABLE)
def test_walk_queries_every_level_then_the_language(directory: str, levels: list[str]) -> None:
    """Each level is queried as "rust conventions {level}", then "rust conventions"."""
    store = RecordingStore()
    retrieve(store, directory)
    assert store.queries == [f"rust conventions {level}" for level in levels] + ["rust conventions"]


def test_query_sequence_for_src_api_handlers() -> None:
    """The exact queries for src/api/handlers, trailing-space root level included (§13.4)."""
    store = RecordingStore()
    retrieve(store, "src/api/handlers", limit=3)
    assert store.searches == [
        ("a1", "rust conventions src/api/handlers", 3),
        ("a1", "rust conventions src/api", 3),
        ("a1", "rust conventions src", 3),
        ("a1", "rust conventions ", 3),
        ("a1", "rust conventions", 3),
    ]
    assert convention_queries("rust", "src/api/handlers") == store.queries


@given(st.text(alphabet="ab./\\", max_size=12))
def test_directory_levels_terminates_and_shrinks(directory: str) -> None:
    """Any path yields a finite walk from itself to the root, each parent shorter than before."""
    levels = directory_levels(directory)
    assert levels[0] == directory
    assert len(levels) == 1 or levels[-1] == ("/" if directory.startswith("/") else "")
    assert all(len(deeper) > len(parent) for deeper, parent in pairwise(levels))


# ---- retrieve_scoped_conventions -------------------------------------------------------------


def test_duplicate_content_appears_once_and_the_deepest_level_wins() -> None:
    """The same content at two levels is kept once, as found at the deepest level, first."""
    deep = item("Use anyhow for errors", 0.9, knowledge_type="Pattern")
    shallow = item("Use anyhow for errors", 0.5)
    store = RecordingStore(
        {
            "rust conventions src/api/handlers": [deep],
            "rust conventions src": [item("Run clippy"), shallow],
            "rust conventions": [item("Use rustfmt")],
        }
    )
    assert retrieve(store) == [deep, item("Run clippy"), item("Use rustfmt")]


def test_result_is_cut_to_limit_in_level_order() -> None:
    """Each level asks for ``limit`` items; the merged result keeps only the first ``limit``."""
    store = RecordingStore(
        {
            "rust conventions src/api": [item("handlers return Result")],
            "rust conventions ": [item("workspace lints"), item("no unsafe")],
            "rust conventions": [item("edition 2021")],
        }
    )
    result = retrieve(store, limit=2)
    assert [i.content for i in result] == ["handlers return Result", "workspace lints"]
    assert {limit for _, _, limit in store.searches} == {2}


def test_error_at_one_level_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """A level whose search raises is skipped and logged; the other levels still answer."""
    store = RecordingStore(
        {
            "rust conventions src/api/handlers": [item("thin handlers")],
            "rust conventions src": [item("modules per domain")],
        },
        failing=frozenset({"rust conventions src/api"}),
    )
    with caplog.at_level(logging.WARNING, logger="shared.conventions"):
        result = retrieve(store)
    assert [i.content for i in result] == ["thin handlers", "modules per domain"]
    assert len(store.queries) == 5
    assert "conventions.level_skipped" in caplog.text
    assert "'rust conventions src/api'" in caplog.text


def test_every_level_failing_gives_nothing() -> None:
    """When every search raises, the result is empty rather than an exception."""
    queries = frozenset(convention_queries("rust", "src"))
    assert retrieve(RecordingStore(failing=queries), "src") == []


def test_nothing_found_message() -> None:
    """No conventions at any level gives the "No relevant conventions found." text."""
    result = retrieve(RecordingStore())
    assert result == []
    assert format_conventions(result) == "No relevant conventions found."


def test_non_positive_limit_returns_nothing_without_searching() -> None:
    """``limit <= 0`` returns an empty list and asks the store nothing."""
    store = RecordingStore({"rust conventions": [item("x")]})
    assert retrieve(store, limit=0) == []
    assert store.searches == []


def test_format_conventions_lines() -> None:
    """Each item is a line "- [Type, confidence=0.00] content", in order."""
    items = [
        item("The capital of France is Paris", 0.9),
        item("Prefer composition", 0.456, knowledge_type=KnowledgeType.PATTERN),
    ]
    assert format_conventions(items) == (
        "- [Fact, confidence=0.90] The capital of France is Paris\n"
        "- [Pattern, confidence=0.46] Prefer composition"
    )


# ---- InMemoryKnowledgeStore ------------------------------------------------------------------


def search(
    store: InMemoryKnowledgeStore, query: str, limit: int = 5, agent: str = "a1"
) -> list[str]:
    """The contents found for ``query``."""
    return [i.content for i in asyncio.run(store.search_knowledge(agent, query, limit))]


def test_in_memory_store_implements_the_protocol() -> None:
    """The in-memory store satisfies the KnowledgeStore Protocol."""
    assert isinstance(InMemoryKnowledgeStore(), KnowledgeStore)


def test_add_knowledge_assigns_ids_and_keeps_given_ones() -> None:
    """Items get sequential ids unless they carry one; the stored copy holds its id."""
    store = InMemoryKnowledgeStore()
    first = asyncio.run(store.add_knowledge("a1", item("one")))
    given_id = asyncio.run(store.add_knowledge("a1", item("two", item_id="mine")))
    assert (first, given_id) == ("knowledge-1", "mine")
    assert [i.item_id for i in store.items("a1")] == ["knowledge-1", "mine"]


def test_adding_an_existing_id_replaces_in_place() -> None:
    """Re-adding an id replaces the item and keeps its position."""
    store = InMemoryKnowledgeStore({"a1": [item("old", item_id="k"), item("other")]})
    asyncio.run(store.add_knowledge("a1", item("new", item_id="k")))
    assert [i.content for i in store.items("a1")] == ["new", "other"]


def test_search_matches_words_of_content_and_tags_case_insensitively() -> None:
    """An item matches when its content or tags share a word with the query, in any case."""
    store = InMemoryKnowledgeStore(
        {
            "a1": [
                item("Handlers return Result"),
                item("Keep functions small", tags=["Rust", "src/api"]),
                item("Unrelated note"),
            ]
        }
    )
    assert search(store, "RUST conventions") == ["Keep functions small"]
    assert search(store, "handlers") == ["Handlers return Result"]
    assert search(store, "API") == ["Keep functions small"]
    assert search(store, "nothing here") == []


def test_search_orders_by_overlap_then_confidence_then_insertion() -> None:
    """More shared words first, then higher confidence, then the order items were added."""
    store = InMemoryKnowledgeStore(
        {
            "a1": [
                item("rust tip", 0.5),
                item("rust tip again", 0.5),
                item("rust conventions for src", 0.1),
                item("rust advice", 0.9),
            ]
        }
    )
    assert search(store, "rust conventions src") == [
        "rust conventions for src",
        "rust advice",
        "rust tip",
        "rust tip again",
    ]
    assert search(store, "rust conventions src", limit=2) == [
        "rust conventions for src",
        "rust advice",
    ]
    assert search(store, "rust", limit=0) == []


def test_search_is_per_agent() -> None:
    """One agent never sees another agent's knowledge."""
    store = InMemoryKnowledgeStore()
    store.seed("a1", [item("rust a1")])
    store.seed("a2", [item("rust a2")])
    assert search(store, "rust", agent="a1") == ["rust a1"]
    assert search(store, "rust", agent="a3") == []


def test_scoped_walk_over_the_in_memory_store() -> None:
    """End to end: conventions tagged with the deepest directory come first."""
    store = InMemoryKnowledgeStore(
        {
            "a1": [
                item("Use rustfmt", tags=["rust"]),
                item("Handlers stay thin", tags=["rust", "handlers"]),
            ]
        }
    )
    result = retrieve(store, "src/api/handlers", limit=5)
    assert [i.content for i in result] == ["Handlers stay thin", "Use rustfmt"]
    assert format_conventions(result) == (
        "- [Fact, confidence=0.80] Handlers stay thin\n- [Fact, confidence=0.80] Use rustfmt"
    )
