"""The model's side: plans re-issued with nothing new since, and self-reports of being stuck."""

from __future__ import annotations

from shared.stagnation.signal import Evidence, SignalInput
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["PlanSignal"]


class PlanSignal:
    """The ``plan`` ladder on the detector's leaky count of stale turns (counted by
    :meth:`~shared.stagnation.detector.StagnationDetector.observe_turn`); it answers on stale
    turns and on stale tool events alike."""

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence when the stale turns reach a rung; None otherwise."""
        if step.turn is not None and not step.stale_turn:
            return None  # a turn that neither re-issued a plan nor said it is stuck
        count = step.plan_stale
        level = step.config.plan.rung(count)
        if level is StagnationLevel.NONE or step.plan_kind is None:
            return None
        if step.plan_kind is StagnationKind.REPEAT:
            return Evidence(
                level,
                StagnationKind.REPEAT,
                (ReasonCode.REISSUED_PLAN,),
                lambda: (
                    f"{count} of your recent messages repeated an earlier plan or request, "
                    "word for word or reworded, with nothing new come back in between"
                ),
            )
        return Evidence(
            level,
            StagnationKind.NO_GRADIENT,
            (ReasonCode.SELF_REPORTED_STALL,),
            lambda: f"{count} of your recent messages said you are stuck or not progressing",
        )
