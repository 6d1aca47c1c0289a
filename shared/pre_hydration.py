"""Pre-hydration: references in the task input resolved before the loop starts (Symbiont §11).

Configuration only in this revision; the engine follows.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from shared.durations import Duration

__all__ = ["PreHydrationConfig", "ReferencePattern"]


class ReferencePattern(BaseModel):
    """A custom reference type and the regex that finds it (the whole match is the value)."""

    model_config = ConfigDict(frozen=True)

    ref_type: str
    pattern: str


class PreHydrationConfig(BaseModel):
    """Which references to extract, which tool resolves each type, and the budget."""

    model_config = ConfigDict(frozen=True)

    custom_patterns: list[ReferencePattern] = Field(default_factory=list)
    resolution_tools: dict[str, str] = Field(default_factory=dict)
    timeout: Duration = timedelta(seconds=15)
    max_references: int = Field(default=10, ge=0)
    max_context_tokens: int = Field(default=4000, ge=0)
