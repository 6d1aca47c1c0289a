"""Repeats: the same answer coming back, and the same failing call failing the same way."""

from __future__ import annotations

from shared.stagnation.events import ToolKind
from shared.stagnation.memory import StaleWindow
from shared.stagnation.signal import (
    Evidence,
    SignalInput,
    first_line,
    occurrences,
    recurrence_key,
)
from shared.stagnation.verdict import ReasonCode, StagnationKind, StagnationLevel

__all__ = ["RepeatSignal", "RetrySignal"]


def _recurrences(window: StaleWindow, pair: str) -> int:
    """How often an answer came back in the last ``history`` events, unless a cycle going round
    explains it: an answer in a cycle comes back once per round, one round before the cycle
    has come round in full; the cycle is the more specific name for that."""
    recurrences = window.retries(pair)
    cycle = window.cycle()
    return recurrences if cycle is None or recurrences > cycle[1] + 1 else 0


class RepeatSignal:
    """The same (call, result) pair in the episode, or an answer (not a failure: that is
    :class:`RetrySignal`) that came back in the last ``history`` events, whatever came between:
    the same check run after every edit, answering the same each time although a search found
    something new between two runs (gpt-4o-mini ``databind-4249``, whose edits re-apply ones
    already made).

    A **negative result** is no repeat: an answer with content that comes back unchanged after
    a new, distinct edit (``SignalInput.tested_writes``) says the edit did not change it, which
    is what a debugging experiment asks (resolved Gemini runs ``django-16100``, ``xarray-4695``,
    ``sphinx-9320``: a debug print or a fix at another place each time, the same output, then
    the explanation). It is left to the stale window, where it still counts. A silent answer
    is not such a result: silence after a debug print in code the command never runs is what
    the stuck doubao ``databind-4186`` gets seven times; it stays a repeat.
    """

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence on the ``repeat`` ladder; None below it and for a turn."""
        event, fp, pair = step.event, step.fingerprint, step.pair
        if event is None or fp is None or pair is None:
            return None
        if step.tested_writes and not event.failed and fp.head.strip():
            return None
        count = step.window.count(pair)
        if not event.failed and event.kind is not ToolKind.WRITE:
            count = max(count, _recurrences(step.window, fp.pair))
        level = step.config.repeat.rung(occurrences(event, count))
        if level is StagnationLevel.NONE:
            return None
        return Evidence(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.REPEATED_RESULT,),
            lambda: f"{event.describe()} returned the same result {count} times",
        )


class RetrySignal:
    """The same failing call, unchanged, failing the same way again, whatever came between.

    A new result in between ends the stale run but not this count: re-issuing a call whose
    failure the agent already has is a loop even when it learns something else meanwhile.
    """

    def observe(self, step: SignalInput) -> Evidence | None:
        """Evidence on the ``repeat`` ladder for a retried failure; None otherwise."""
        event, fp = step.event, step.fingerprint
        if event is None or fp is None or not event.failed:
            return None
        key = recurrence_key(event, fp)
        if key is None:
            return None
        count = step.window.retries(key)
        level = step.config.repeat.rung(occurrences(event, count))
        if level is StagnationLevel.NONE:
            return None
        history = step.config.history
        return Evidence(
            level,
            StagnationKind.REPEAT,
            (ReasonCode.RETRIED_FAILURE,),
            lambda: (
                f"{event.describe()} failed the same way {count} times in the last "
                f"{history} calls ({first_line(event.output)!r})"
            ),
        )
