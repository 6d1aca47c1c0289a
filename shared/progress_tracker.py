"""Per-step retry limits and stuck detection on consecutive errors (Symbiont §10).

Configuration only in this revision; the tracker itself follows.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["LimitAction", "StepDecision", "StepIterationConfig"]


class LimitAction(StrEnum):
    """What the coordinator does when a step reaches its limit."""

    SKIP_STEP = "skip_step"
    ABORT_TASK = "abort_task"
    ESCALATE = "escalate"


_LIMIT_ALIASES = {
    "skipstep": LimitAction.SKIP_STEP,
    "aborttask": LimitAction.ABORT_TASK,
    "escalate": LimitAction.ESCALATE,
}


class StepIterationConfig(BaseModel):
    """Limits of one step: reattempts, the stuck threshold, and what to do at the limit."""

    model_config = ConfigDict(frozen=True)

    max_reattempts_per_step: int = Field(default=2, ge=0)
    similarity_threshold: float = Field(default=0.85, ge=0.0, le=1.0)
    on_limit_reached: LimitAction = LimitAction.SKIP_STEP
    normalize_volatile: bool = True

    @field_validator("on_limit_reached", mode="before")
    @classmethod
    def _accept_symbiont_spelling(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.replace("_", "").replace("-", "").lower()
            if key in _LIMIT_ALIASES:
                return _LIMIT_ALIASES[key]
        return value


class StepDecision(BaseModel):
    """Continue (``stop`` False) or Stop with a ``reason`` that says why."""

    model_config = ConfigDict(frozen=True)

    stop: bool = False
    reason: str | None = None

    @classmethod
    def continue_(cls) -> StepDecision:
        """Go on with the step."""
        return cls()

    @classmethod
    def stop_because(cls, reason: str) -> StepDecision:
        """Stop the step for ``reason``."""
        return cls(stop=True, reason=reason)
