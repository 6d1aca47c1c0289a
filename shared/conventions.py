"""The knowledge store seam and directory-scoped conventions (Symbiont §8.4).

A convention is an item whose content starts with its scope, ``"{language} conventions
{directory}: "`` (``"{language} conventions: "`` for the language-wide ones), as
:meth:`ConventionSeed.item` writes it (:func:`convention_scope`).
:func:`retrieve_scoped_conventions` asks the store for ``"{language} conventions {level}"`` at
the directory and each of its parents (:func:`directory_levels`), then for
``"{language} conventions"``, and keeps of each level's answer only the conventions of that
level (:func:`convention_directory`): a store's search matches words, so ``src`` also finds a
``src/web`` convention or a fact naming ``src``, which belong to no level of the walk. The
deepest level's items come first and win on duplicate content. :class:`InMemoryKnowledgeStore`
is a small deterministic store for tests and demos.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "LEVEL_CANDIDATES",
    "NO_CONVENTIONS_FOUND",
    "ConventionSeed",
    "FactSeed",
    "InMemoryKnowledgeStore",
    "KnowledgeItem",
    "KnowledgeSpec",
    "KnowledgeStore",
    "KnowledgeType",
    "convention_directory",
    "convention_queries",
    "convention_scope",
    "directory_levels",
    "format_conventions",
    "retrieve_scoped_conventions",
]

NO_CONVENTIONS_FOUND = "No relevant conventions found."

LEVEL_CANDIDATES = 200
"""How many items each level of the walk asks the store for (at least the caller's ``limit``)
before keeping that level's own conventions: a word search ranks ``src/web``'s conventions with
``src``'s, so asking for only ``limit`` could return none of the level's."""

_log = logging.getLogger(__name__)


class KnowledgeType(StrEnum):
    """What kind of knowledge an item is (Symbiont's ``KnowledgeType``)."""

    FACT = "Fact"
    PROCEDURE = "Procedure"
    PATTERN = "Pattern"
    SHARED = "Shared"


class KnowledgeItem(BaseModel):
    """One piece of knowledge returned by a search; ``tags`` help a store find it."""

    model_config = ConfigDict(frozen=True)

    content: str
    knowledge_type: KnowledgeType = KnowledgeType.FACT
    confidence: float = 0.8
    item_id: str | None = None
    tags: list[str] = Field(default_factory=list)


@runtime_checkable
class KnowledgeStore(Protocol):
    """Where an agent's knowledge lives: searched by text, added to by the agent."""

    async def search_knowledge(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        """Up to ``limit`` items relevant to ``query``, best first."""
        ...

    async def add_knowledge(self, agent_id: str, item: KnowledgeItem) -> str:
        """Store ``item`` and return its id."""
        ...


_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class InMemoryKnowledgeStore:
    """A :class:`KnowledgeStore` in a dict, per agent, with word-overlap search.

    An item matches a query when its content or tags share at least one word with it
    (case-insensitive; a word is a run of letters, digits or ``_``, so ``src/api`` is two words).
    Results are ordered by the number of shared words, then confidence, then insertion order.
    Items without an ``item_id`` get ``knowledge-<n>``; adding an item with an existing id
    replaces it in place.
    """

    def __init__(self, items: Mapping[str, Iterable[KnowledgeItem]] | None = None) -> None:
        self._items: dict[str, dict[str, KnowledgeItem]] = {}
        self._ids = itertools.count(1)
        for agent_id, agent_items in (items or {}).items():
            self.seed(agent_id, agent_items)

    def seed(self, agent_id: str, items: Iterable[KnowledgeItem]) -> list[str]:
        """Store ``items`` for ``agent_id`` synchronously; return their ids in order."""
        return [self._store(agent_id, item) for item in items]

    def items(self, agent_id: str) -> list[KnowledgeItem]:
        """Every item of ``agent_id``, in insertion order, with its id set."""
        return list(self._items.get(agent_id, {}).values())

    async def search_knowledge(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        """Up to ``limit`` items sharing words with ``query``, best first."""
        wanted = _words(query)
        if limit <= 0 or not wanted:
            return []
        scored = []
        for position, item in enumerate(self.items(agent_id)):
            shared = len(wanted & _words(" ".join([item.content, *item.tags])))
            if shared:
                scored.append((-shared, -item.confidence, position, item))
        scored.sort(key=lambda entry: entry[:3])
        return [entry[3] for entry in scored[:limit]]

    async def add_knowledge(self, agent_id: str, item: KnowledgeItem) -> str:
        """Store ``item`` for ``agent_id`` and return its id."""
        return self._store(agent_id, item)

    def _store(self, agent_id: str, item: KnowledgeItem) -> str:
        item_id = item.item_id or f"knowledge-{next(self._ids)}"
        self._items.setdefault(agent_id, {})[item_id] = item.model_copy(update={"item_id": item_id})
        return item_id


def _components(directory: str) -> list[str]:
    """Path components as Rust's ``Path::components`` sees them, without the root.

    Empty components (``a//b``, a trailing ``/``) are dropped, and so is every ``.`` except a
    leading one in a relative path. A backslash is an ordinary character.
    """
    absolute = directory.startswith("/")
    kept = []
    for index, part in enumerate(directory.split("/")):
        if part == "" or (part == "." and (index > 0 or absolute)):
            continue
        kept.append(part)
    return kept


def directory_levels(directory: str) -> list[str]:
    """``directory`` and each of its parents, deepest first, as Rust's ``PathBuf::pop`` walks.

    The first level is ``directory`` verbatim; the parents are rebuilt from the normalised
    components. A relative path ends with ``""`` (the project root); an absolute one ends with
    ``"/"``. Examples: ``src/api/`` gives ``src/api/``, ``src``, ``""``; ``./src`` gives
    ``./src``, ``.``, ``""``; ``/a/b`` gives ``/a/b``, ``/a``, ``/``.

    Unlike Rust, which prints a parent as a slice of the original string, a parent here never
    keeps repeated separators or inner ``.``: ``a//b/c`` gives ``a/b`` where Rust gives ``a//b``.
    """
    root = "/" if directory.startswith("/") else ""
    parts = _components(directory)
    levels = [directory]
    while parts:
        parts.pop()
        levels.append(root + "/".join(parts))
    return levels


def _normalised(directory: str) -> str:
    """``directory`` as the walk compares levels: no empty or ``.`` components (``./src/`` is
    ``src``, ``.`` is the project root ``""``), absolute paths keeping their ``/``."""
    root = "/" if directory.startswith("/") else ""
    return root + "/".join(p for p in _components(directory) if p != ".")


def convention_scope(language: str, directory: str = "") -> str:
    """What a convention of ``language`` for ``directory`` starts with, before ``": "``."""
    return f"{language} conventions {directory}".rstrip()


def convention_directory(item: KnowledgeItem, language: str) -> str | None:
    """The directory (normalised; ``""``: language-wide) of ``item`` as a convention of
    ``language`` (compared case-insensitively), or None when it is no such convention."""
    head = convention_scope(language)
    content = item.content
    if content[: len(head)].lower() != head.lower():
        return None
    rest = content[len(head) :]
    if rest.startswith(": "):
        return ""
    if not rest.startswith(" "):
        return None
    directory, separator, _ = rest[1:].partition(": ")
    return _normalised(directory) if separator else None


def convention_queries(language: str, directory: str) -> list[str]:
    """The search queries of the walk, in order: every directory level, then the language.

    The ``""`` level gives ``"{language} conventions "`` with a trailing space, as in Symbiont.
    """
    levels = [f"{language} conventions {level}" for level in directory_levels(directory)]
    return [*levels, f"{language} conventions"]


async def retrieve_scoped_conventions(
    store: KnowledgeStore, agent_id: str, language: str, directory: str, limit: int
) -> list[KnowledgeItem]:
    """Conventions for ``directory``: deepest level first, deduped by content, cut to ``limit``.

    Each level asks the store for :data:`LEVEL_CANDIDATES` items (or ``limit``, when more) and
    keeps the conventions of that very level: of ``directory``, then of each parent, then the
    language-wide ones; anything else the search matched (a sibling directory's convention, a
    fact) is left out. A level whose search raises is skipped (and logged), never raised:
    conventions are a hint, not a requirement. ``limit <= 0`` gives ``[]`` without querying.
    """
    if limit <= 0:
        return []
    levels = [_normalised(level) for level in directory_levels(directory)] + [""]
    found: list[KnowledgeItem] = []
    seen: set[str] = set()
    width = max(limit, LEVEL_CANDIDATES)
    for query, level in zip(convention_queries(language, directory), levels, strict=True):
        for item in await _search_or_skip(store, agent_id, query, width):
            if item.content not in seen and convention_directory(item, language) == level:
                seen.add(item.content)
                found.append(item)
    return found[:limit]


async def _search_or_skip(
    store: KnowledgeStore, agent_id: str, query: str, limit: int
) -> list[KnowledgeItem]:
    try:
        return await store.search_knowledge(agent_id, query, limit)
    except Exception as exc:
        _log.warning(
            "conventions.level_skipped agent_id=%s query=%r error=%s: %s",
            agent_id,
            query,
            type(exc).__name__,
            exc,
        )
        return []


def format_conventions(items: Iterable[KnowledgeItem]) -> str:
    """One line ``- [Fact, confidence=0.90] <content>`` per item, or the nothing-found text."""
    lines = [
        f"- [{item.knowledge_type.value}, confidence={item.confidence:.2f}] {item.content}"
        for item in items
    ]
    return "\n".join(lines) if lines else NO_CONVENTIONS_FOUND


# -- what a task says about knowledge ---------------------------------------------------------


class _Seed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ConventionSeed(_Seed):
    """A coding convention for one language, scoped to a directory (``""``: the project)."""

    language: str = Field(min_length=1, max_length=64)
    directory: str = Field(default="", max_length=1024)
    content: str = Field(min_length=1, max_length=4000)

    def item(self) -> KnowledgeItem:
        """The item ``recall_knowledge(scope="conventions")`` finds walking up to it."""
        scope = convention_scope(self.language, self.directory)
        return _seeded(f"{scope}: {self.content}", KnowledgeType.PATTERN, 0.9,
                       [self.language, "conventions", self.directory])  # fmt: skip


class FactSeed(_Seed):
    """A fact, as ``store_knowledge`` stores one: subject, predicate, object."""

    subject: str = Field(min_length=1, max_length=512)
    predicate: str = Field(min_length=1, max_length=512)
    object: str = Field(min_length=1, max_length=2000)
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)

    def item(self) -> KnowledgeItem:
        """The fact as a knowledge item."""
        content = f"{self.subject} {self.predicate} {self.object}"
        return _seeded(content, KnowledgeType.FACT, self.confidence, [])


class KnowledgeSpec(_Seed):
    """A task's ``knowledge`` block: it turns the knowledge bridge on for the task (context
    injection, ``recall_knowledge``, ``store_knowledge``, learnings persisted at the end when
    ``auto_persist``) and seeds the agent's store, so that a run is reproducible::

        knowledge:
          conventions: [{language: python, directory: src/api, content: "return early"}]
          facts: [{subject: calc.py, predicate: uses, object: "type hints"}]
    """

    conventions: list[ConventionSeed] = Field(default_factory=list, max_length=200)
    facts: list[FactSeed] = Field(default_factory=list, max_length=500)
    max_context_items: int = Field(default=5, ge=0, le=50)
    relevance_threshold: float = Field(default=0.3, ge=0.0, le=1.0)
    auto_persist: bool = True

    def seed_items(self) -> list[KnowledgeItem]:
        """Every seeded item, each with an id made of its content (seeding twice is seeding
        once)."""
        return [c.item() for c in self.conventions] + [f.item() for f in self.facts]


def _seeded(content: str, kind: KnowledgeType, confidence: float, tags: list[str]) -> KnowledgeItem:
    digest = hashlib.blake2b(f"{kind.value}\0{content}".encode(), digest_size=8).hexdigest()
    return KnowledgeItem(content=content, knowledge_type=kind, confidence=confidence,
                         item_id=f"seed-{digest}", tags=[t for t in tags if t])  # fmt: skip
