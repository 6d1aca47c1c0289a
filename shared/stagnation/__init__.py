"""Output-side stagnation detection: is the agent still learning or changing anything?

Pure, synchronous, no I/O. Feed every assistant message to :class:`StagnationDetector` as a
:class:`ModelTurn` and every tool result as a :class:`ToolEvent`, tell it about verified
milestones and context compactions, and act on the :class:`StagnationVerdict` it returns.
Design and evaluation: ``docs/stagnation.md``.
"""

from shared.stagnation.config import Ladder, StagnationConfig
from shared.stagnation.detector import StagnationDetector
from shared.stagnation.events import ToolEvent, ToolKind
from shared.stagnation.plans import ModelTurn
from shared.stagnation.verdict import (
    ReasonCode,
    StagnationKind,
    StagnationLevel,
    StagnationVerdict,
)

__all__ = [
    "Ladder",
    "ModelTurn",
    "ReasonCode",
    "StagnationConfig",
    "StagnationDetector",
    "StagnationKind",
    "StagnationLevel",
    "StagnationVerdict",
    "ToolEvent",
    "ToolKind",
]
