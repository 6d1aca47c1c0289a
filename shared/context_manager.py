"""The in-loop context manager seam (Symbiont §7). Strategies follow in this module."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from shared.conversation import Conversation

__all__ = ["ContextManager"]


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
