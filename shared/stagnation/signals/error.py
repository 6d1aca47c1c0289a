"""Repeated errors: the same error text from the same tool, whatever the arguments."""

from __future__ import annotations

from shared.stagnation.signal import (
    Evidence,
    SignalInput,
    first_line,
    occurrences,
    world_error,
)
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["ErrorSignal"]


class ErrorSignal:
    """The same error in the episode, or the same error from the world
    (:func:`~shared.stagnation.signal.world_error`) in the last ``history`` events, whatever
    the arguments and whatever came between: ``javac: command not found``, ``find.: command
    not found``, ``mvn: command not found`` among a few new reads (doubao ``xml-531``)."""

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence on the ``error`` ladder; None below it and for a turn."""
        event, fp = step.event, step.fingerprint
        if event is None or fp is None:
            return None
        count = step.window.error_count(fp.error)
        if world_error(event, fp) is not None:
            count = max(count, step.window.recent_errors(fp.error))
        level = step.config.error.rung(occurrences(event, count))
        if level is StagnationLevel.NONE:
            return None
        return Evidence(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.SAME_ERROR,),
            lambda: (
                f"{event.tool_name} failed {count} times with the same error "
                f"({first_line(event.output)!r}) whatever the arguments"
            ),
        )
