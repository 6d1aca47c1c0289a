"""The persisted form of a detector: JSON, validated on restore, bounded in size.

Every collection in it has a cap from the config (``max_seen_hashes``, ``max_paths``,
``history``, ``max_period``) or a fixed one (the last :data:`MAX_MILESTONE_NAMES` milestone
names), so a 10,000-step run persists no more than a 100-step one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.stagnation.config import StagnationConfig
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["MAX_DETAIL_CHARS", "MAX_MILESTONE_NAMES", "DetectorState", "EpisodeState"]

MAX_MILESTONE_NAMES = 32
MAX_DETAIL_CHARS = 300


class EpisodeState(BaseModel):
    """The current stagnation episode: the run of stale events since the last state change."""

    model_config = ConfigDict(frozen=True)

    stale_steps: int = Field(default=0, ge=0)
    amnesia_steps: int = Field(default=0, ge=0)
    level: StagnationLevel = StagnationLevel.NONE
    kind: StagnationKind | None = None
    reasons: list[ReasonCode] = Field(default_factory=list)
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS)


class DetectorState(BaseModel):
    """Everything a :class:`~shared.stagnation.detector.StagnationDetector` needs to resume."""

    model_config = ConfigDict(frozen=True)

    version: Literal[1] = 1
    config: StagnationConfig
    total_steps: int = Field(ge=0)
    steps_since_milestone: int = Field(ge=0)
    new_state_changes: int = Field(ge=0)
    epoch: int = Field(ge=0)
    milestones_total: int = Field(ge=0)
    milestones: list[str] = Field(max_length=MAX_MILESTONE_NAMES)
    seen: list[tuple[str, int]]
    paths: list[tuple[str, str]]
    window: list[tuple[str, str | None]]
    recent_pairs: list[str]
    cycle_runs: list[int]
    episode: EpisodeState
