"""The knowledge store seam and directory-scoped conventions (Symbiont §8.4).

Interfaces only in this revision; the in-memory store and the walk follow.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

__all__ = ["KnowledgeItem", "KnowledgeStore", "KnowledgeType"]


class KnowledgeType(StrEnum):
    """What kind of knowledge an item is (Symbiont's ``KnowledgeType``)."""

    FACT = "Fact"
    PROCEDURE = "Procedure"
    PATTERN = "Pattern"
    SHARED = "Shared"


class KnowledgeItem(BaseModel):
    """One piece of knowledge returned by a search."""

    model_config = ConfigDict(frozen=True)

    content: str
    knowledge_type: KnowledgeType = KnowledgeType.FACT
    confidence: float = 0.8
    item_id: str | None = None


@runtime_checkable
class KnowledgeStore(Protocol):
    """Where an agent's knowledge lives: searched by text, added to by the agent."""

    async def search_knowledge(self, agent_id: str, query: str, limit: int) -> list[KnowledgeItem]:
        """Up to ``limit`` items relevant to ``query``, best first."""
        ...

    async def add_knowledge(self, agent_id: str, item: KnowledgeItem) -> str:
        """Store ``item`` and return its id."""
        ...
