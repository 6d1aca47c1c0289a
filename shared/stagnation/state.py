"""The persisted form of a detector: JSON, validated on restore, bounded in size.

Every collection in it has a cap from the config (``max_seen_hashes``, ``max_paths``,
``history``, ``max_period``) or a fixed one (the last :data:`MAX_MILESTONE_NAMES` milestone
names), so a 10,000-step run persists no more than a 100-step one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
    started_at: int = Field(default=0, ge=0)


class DetectorState(BaseModel):
    """Everything a :class:`~shared.stagnation.detector.StagnationDetector` needs to resume.

    Version 2 keeps, for each seen digest, the step at which it was first seen (amnesia is told
    by age), marks each path's state as written (``w:``) or read (``r:``), and counts the writes
    pending their outcome. A version 1 state (saved by an older release) still loads: its digests
    count as first seen at step 0 and its path states as read.
    """

    model_config = ConfigDict(frozen=True)

    version: Literal[1, 2] = 2
    config: StagnationConfig
    total_steps: int = Field(ge=0)
    steps_since_milestone: int = Field(ge=0)
    new_state_changes: int = Field(ge=0)
    epoch: int = Field(ge=0)
    milestones_total: int = Field(ge=0)
    milestones: list[str] = Field(max_length=MAX_MILESTONE_NAMES)
    seen: list[tuple[str, tuple[int, int]]]
    paths: list[tuple[str, str]]
    window: list[tuple[str, str | None]]
    recent_pairs: list[str]
    cycle_runs: list[int]
    episode: EpisodeState
    pending_writes: int = Field(default=0, ge=0)
    # per event of the last ``history``: its recurrence key (a failure, a refusal, an answer)
    # and the error the world gave; the name is the first release's, which kept failures only
    recent_failures: list[str | None] = Field(default_factory=list)
    recent_errors: list[str | None] = Field(default_factory=list)
    # the model's side (observe_turn): the last plans with the count of new results when each
    # was issued, the leaky count of stale turns, and whether the iteration a turn opened is
    # still open (its calls' results belong to it) and has already climbed a rung
    plans: list[tuple[str, str, int]] = Field(default_factory=list)
    result_gists: list[str] = Field(default_factory=list)
    # the content words the results showed (a state saved before them loads with none)
    result_words: list[str] = Field(default_factory=list)
    plan_mark: int = Field(default=0, ge=0)
    plan_stale: int = Field(default=0, ge=0)
    plan_kind: StagnationKind | None = None
    turn_mark: int | None = Field(default=None, ge=0)
    turns_since_milestone: int = Field(default=0, ge=0)
    turn_open: bool = False
    climbed: bool = False
    # the last turn said the model is stuck and no tool result has answered it yet (a state
    # saved before it loads False)
    report_open: bool = False
    # the comparison on a restored workspace: the last successful write's after-state, whether
    # it was a revert with no result since, and the last result's call, pair and the last
    # write's after-state then (a state saved before them loads with none)
    last_write: str | None = None
    restored: bool = False
    last_result: tuple[str, str, str | None] | None = None
    # the memories of signals that keep one (SignalMemory), by the signal's name, as it dumped
    # them; a state saved before them loads with none
    signal_memory: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """Read a version 1 state as version 2 (see the class docstring)."""
        if not isinstance(data, dict) or data.get("version", 2) != 1:
            return data
        seen = [(key, (epoch, 0)) for key, epoch in data.get("seen", [])]
        paths = [(key, "r:" + value) for key, value in data.get("paths", [])]
        return {**data, "version": 2, "seen": seen, "paths": paths}
