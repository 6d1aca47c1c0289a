"""The detector's signals, one module each, behind :class:`~shared.stagnation.signal.Signal`.

:func:`default_signals` is the production set, in the order ties are broken (the first of equal
evidence wins): the stale run (always first: it answers on every stale tool event), cycles,
repeated results, repeated errors, retried failures, the model's stale turns, slots (an id,
a number) asked for again with nothing new since, and writes refused again on one target. A new
signal is a new module here with an ``observe`` method, added to this list or passed to
:class:`~shared.stagnation.detector.StagnationDetector` by a host.
"""

from __future__ import annotations

from shared.stagnation.signal import Signal
from shared.stagnation.signals.cycle import CycleSignal
from shared.stagnation.signals.error import ErrorSignal
from shared.stagnation.signals.plan import PlanSignal
from shared.stagnation.signals.refusal import RefusalSignal
from shared.stagnation.signals.repeat import RepeatSignal, RetrySignal
from shared.stagnation.signals.slot import SlotSignal
from shared.stagnation.signals.stale import StaleSignal

__all__ = [
    "CycleSignal",
    "ErrorSignal",
    "PlanSignal",
    "RefusalSignal",
    "RepeatSignal",
    "RetrySignal",
    "SlotSignal",
    "StaleSignal",
    "default_signals",
]


def default_signals() -> tuple[Signal, ...]:
    """The production signals, stale run first, in tie-breaking order (fresh instances: the
    slot signal keeps a memory of its own)."""
    return (
        StaleSignal(),
        CycleSignal(),
        RepeatSignal(),
        ErrorSignal(),
        RetrySignal(),
        PlanSignal(),
        SlotSignal(),
        RefusalSignal(),
    )
