"""The detector's answer after each event: a :class:`StagnationVerdict`.

Levels are ordered, ``NONE < NUDGE < REPLAN < ASK_HUMAN < ABORT``, and serialise as their names
(``"replan"``) so that a journal line reads without a lookup table.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ReasonCode", "StagnationKind", "StagnationLevel", "StagnationVerdict"]


class StagnationLevel(StrEnum):
    """How hard the host should push back, in increasing order.

    NUDGE shows the counters to the model; REPLAN forces a plan revision; ASK_HUMAN escalates to
    the review queue; ABORT stops the run, keeping the milestones reached.
    """

    NONE = "none"
    NUDGE = "nudge"
    REPLAN = "replan"
    ASK_HUMAN = "ask_human"
    ABORT = "abort"

    @property
    def rank(self) -> int:
        """0 for NONE up to 4 for ABORT."""
        return _RANKS[self]

    def _other_rank(self, other: object) -> int:
        if isinstance(other, StagnationLevel):
            return other.rank
        raise TypeError(
            f"cannot order StagnationLevel {self.value!r} against {type(other).__name__} "
            f"{other!r}; compare with a level, e.g. StagnationLevel({other!r})"
        )

    def __lt__(self, other: str) -> bool:
        return self.rank < self._other_rank(other)

    def __le__(self, other: str) -> bool:
        return self.rank <= self._other_rank(other)

    def __gt__(self, other: str) -> bool:
        return self.rank > self._other_rank(other)

    def __ge__(self, other: str) -> bool:
        return self.rank >= self._other_rank(other)


_RANKS = {level: rank for rank, level in enumerate(StagnationLevel)}


class StagnationKind(StrEnum):
    """What the stagnation looks like.

    ``repeat``: the same call met the same result (or the same error whatever the arguments);
    ``cycle``: a sequence of 2 to 5 (call, result) pairs came round again; ``amnesia``: most of
    the stale steps re-read content first seen before the last context compaction;
    ``no_gradient``: nothing new came back although the calls were not exact repeats.
    """

    REPEAT = "repeat"
    CYCLE = "cycle"
    NO_GRADIENT = "no_gradient"
    AMNESIA = "amnesia"


class ReasonCode(StrEnum):
    """Which mechanical signal contributed to the verdict (stable names, for telemetry)."""

    STALE_WINDOW = "stale_window"
    REPEATED_RESULT = "repeated_result"
    CYCLE = "cycle"
    SAME_ERROR = "same_error"
    BATCH_DUPLICATE = "batch_duplicate"
    AMNESIA_REREAD = "amnesia_reread"
    RETRIED_FAILURE = "retried_failure"
    REISSUED_PLAN = "reissued_plan"
    SELF_REPORTED_STALL = "self_reported_stall"
    REASKED_SLOT = "reasked_slot"
    REFUSED_WRITE = "refused_write"


class StagnationVerdict(BaseModel):
    """The level, what kind of stagnation, the two counters, why, and the text to show.

    ``steps_since_milestone`` counts every observed event since the last verified milestone (or
    the start). ``new_state_changes`` counts the new, deduplicated state changes over the same
    span. ``stale_steps`` is the current run of informative events with no new state change.
    ``message`` is addressed to the model for NUDGE and REPLAN and to the operator for ASK_HUMAN
    and ABORT; it is empty for NONE. ``escalated`` is True on the event that raised the level.
    """

    model_config = ConfigDict(frozen=True)

    level: StagnationLevel = StagnationLevel.NONE
    kind: StagnationKind | None = None
    steps_since_milestone: int = Field(default=0, ge=0)
    new_state_changes: int = Field(default=0, ge=0)
    stale_steps: int = Field(default=0, ge=0)
    reason_codes: tuple[ReasonCode, ...] = ()
    message: str = ""
    escalated: bool = False

    @property
    def is_stagnating(self) -> bool:
        """True for any level above NONE."""
        return self.level is not StagnationLevel.NONE
