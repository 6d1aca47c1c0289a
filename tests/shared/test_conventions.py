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
    LEVEL_CANDIDATES,
    ConventionSeed,
    FactSeed,
    InMemoryKnowledgeStore,
    KnowledgeItem,
    KnowledgeSpec,
    KnowledgeStore,
    KnowledgeType,
    convention_directory,
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


def rule(directory: str, content: str, confidence: float = 0.8, **extra: object) -> KnowledgeItem:
    """A rust convention of ``directory`` (``""``: language-wide), as a seed writes it."""
    seeded = ConventionSeed(language="rust", directory=directory, content=content).item()
    return item(seeded.content, confidence, **extra)


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
    """The exact queries for src/api/handlers, trailing-space root level included (§13.4),
    each asking for enough candidates to find the level's own conventions among the rest."""
    store = RecordingStore()
    retrieve(store, "src/api/handlers", limit=3)
    n = LEVEL_CANDIDATES
    assert store.searches == [
        ("a1", "rust conventions src/api/handlers", n),
        ("a1", "rust conventions src/api", n),
        ("a1", "rust conventions src", n),
        ("a1", "rust conventions ", n),
        ("a1", "rust conventions", n),
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
    """The same content found at two levels is kept once, as found at the deepest, first."""
    first = rule("", "Use rustfmt", 0.9)
    store = RecordingStore(
        {
            "rust conventions src/api/handlers": [rule("src/api/handlers", "Use anyhow")],
            "rust conventions src": [rule("src", "Run clippy")],
            "rust conventions ": [first],
            "rust conventions": [rule("", "Use rustfmt", 0.5), rule("", "No unsafe")],
        }
    )
    assert retrieve(store) == [
        rule("src/api/handlers", "Use anyhow"), rule("src", "Run clippy"), first,
        rule("", "No unsafe"),
    ]  # fmt: skip


def test_result_is_cut_to_limit_in_level_order() -> None:
    """The merged result, in level order, keeps only the first ``limit`` conventions."""
    store = RecordingStore(
        {
            "rust conventions src/api": [rule("src/api", "handlers return Result")],
            "rust conventions ": [rule("", "workspace lints"), rule("", "no unsafe")],
            "rust conventions": [rule("", "edition 2021")],
        }
    )
    result = retrieve(store, limit=2)
    assert result == [rule("src/api", "handlers return Result"), rule("", "workspace lints")]


def test_a_level_keeps_only_its_own_conventions() -> None:
    """What a level's search matched beyond its own conventions (a sibling directory's, a
    deeper one's, another language's, a fact, an unscoped note) is left out."""
    src = rule("src", "modules per domain")
    store = RecordingStore(
        {
            "rust conventions src/api/handlers": [
                rule("src/web", "templates in web/"), item("src/api/handlers has 3 owners"),
                rule("src/api/handlers", "thin handlers"),
            ],
            "rust conventions src": [
                rule("src/web", "templates in web/"), rule("src/api/handlers/v2", "deep"),
                item("python conventions src: black"), item("rust style guide for src"), src,
            ],
            "rust conventions": [item("rust conventions are in CONTRIBUTING.md")],
        }
    )  # fmt: skip
    assert retrieve(store) == [rule("src/api/handlers", "thin handlers"), src]


@pytest.mark.parametrize(
    ("content", "directory"),
    [
        ("rust conventions src/api: x", "src/api"),
        ("Rust Conventions src/api/: x", "src/api"),
        ("rust conventions ./src//api: x", "src/api"),
        ("rust conventions /srv/app: x", "/srv/app"),
        ("rust conventions: x", ""),
        ("rust conventions .: x", ""),
        ("rust conventions src", None),
        ("rust conventionsrc: x", None),
        ("python conventions src: x", None),
        ("src/api uses rust conventions: x", None),
    ],
)
def test_convention_directory(content: str, directory: str | None) -> None:
    """A convention's directory is read from its scope, normalised; anything else has none."""
    assert convention_directory(item(content), "rust") == directory


def test_error_at_one_level_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """A level whose search raises is skipped and logged; the other levels still answer."""
    store = RecordingStore(
        {
            "rust conventions src/api/handlers": [rule("src/api/handlers", "thin handlers")],
            "rust conventions src": [rule("src", "modules per domain")],
        },
        failing=frozenset({"rust conventions src/api"}),
    )
    with caplog.at_level(logging.WARNING, logger="shared.conventions"):
        result = retrieve(store)
    assert result == [rule("src/api/handlers", "thin handlers"), rule("src", "modules per domain")]
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
    """End to end on seeded knowledge: the directory's conventions, then its parents', then
    the language-wide ones; another directory's, another language's and facts never."""
    spec = KnowledgeSpec(
        conventions=[
            ConventionSeed(language="rust", content="Use rustfmt"),
            ConventionSeed(language="rust", directory="src/web", content="templates in web/"),
            ConventionSeed(language="rust", directory="src/api", content="return Result"),
            ConventionSeed(language="python", directory="src/api", content="use black"),
            ConventionSeed(language="rust", directory="src/api/handlers", content="stay thin"),
        ],
        facts=[FactSeed(subject="src/api/handlers", predicate="is owned by", object="rust team")],
    )
    store = InMemoryKnowledgeStore({"a1": spec.seed_items()})
    result = retrieve(store, "src/api/handlers", limit=5)
    assert [i.content for i in result] == [
        "rust conventions src/api/handlers: stay thin",
        "rust conventions src/api: return Result",
        "rust conventions: Use rustfmt",
    ]
    assert format_conventions(result).splitlines()[0] == (
        "- [Pattern, confidence=0.90] rust conventions src/api/handlers: stay thin"
    )


def test_a_parents_conventions_are_found_among_many_of_its_siblings() -> None:
    """Fifty conventions of src/web rank with src's own in a word search; src's is found."""
    seeds = [ConventionSeed(language="rust", directory="src/web", content=f"web rule {n}")
             for n in range(50)]  # fmt: skip
    seeds.append(ConventionSeed(language="rust", directory="src", content="modules per domain"))
    store = InMemoryKnowledgeStore({"a1": KnowledgeSpec(conventions=seeds).seed_items()})
    result = retrieve(store, "src/api/handlers", limit=5)
    assert [i.content for i in result] == ["rust conventions src: modules per domain"]
