"""Cycles: the same 2..``max_period`` (call, result) pairs coming round again."""

from __future__ import annotations

from shared.stagnation.signal import Evidence, SignalInput
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["CycleSignal"]


class CycleSignal:
    """The ``cycle`` ladder on the full repetitions of the stale window's cycle."""

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence when a cycle reaches a rung; None otherwise and for a turn."""
        if step.event is None:
            return None
        found = step.window.cycle()
        if found is None:
            return None
        period, repetitions = found
        level = step.config.cycle.rung(repetitions)
        if level is StagnationLevel.NONE:
            return None
        return Evidence(
            level,
            StagnationKind.CYCLE,
            (ReasonCode.CYCLE,),
            lambda: f"the same {period} calls with the same results came round {repetitions} times",
        )
