"""The stale run: stale tool events in the episode, and how many re-learn old content."""

from __future__ import annotations

from shared.stagnation.signal import Evidence, SignalInput
from shared.stagnation.verdict import ReasonCode, StagnationKind

__all__ = ["StaleSignal"]


class StaleSignal:
    """The ``stale`` ladder on the episode's stale run; amnesia when at least half of it showed
    content first seen before the episode began (or before a compaction)."""

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence on every stale tool event (NONE below the ladder); None for a turn."""
        if step.event is None:
            return None
        level = step.config.stale.rung(step.stale_steps)
        stale, amnesia = step.stale_steps, step.amnesia_steps
        if amnesia and amnesia * 2 >= stale:
            return Evidence(
                level,
                StagnationKind.AMNESIA,
                (ReasonCode.STALE_WINDOW, ReasonCode.AMNESIA_REREAD),
                lambda: (
                    f"{amnesia} of the last {stale} steps showed again what you had already "
                    "seen before your last new result"
                ),
            )
        return Evidence(
            level,
            StagnationKind.NO_GRADIENT,
            (ReasonCode.STALE_WINDOW,),
            lambda: f"the last {stale} steps returned nothing you had not already seen",
        )
