"""Sample texts and events the stagnation tests share (cut from labelled runs)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.stagnation import (
    StagnationConfig,
    StagnationDetector,
    StagnationLevel,
    ToolEvent,
    ToolKind,
)

__all__ = ["REWORDED_REQUESTS", "grep_read", "reservation_lookup", "warmed_detector"]

REWORDED_REQUESTS = (
    "Please look up the shipping rates for mailing a DVD from Hartford, Connecticut to "
    "Colombia using USPS.",
    "Please continue to look up the shipping rates for mailing a DVD from Hartford, "
    "Connecticut to Colombia using USPS.",
    "Look up the USPS shipping rates for mailing a DVD from Hartford, Connecticut to Colombia, "
    "then revisit DHL.",
    "Find the USPS rate for mailing one DVD from Hartford, Connecticut to Colombia.",
)
"""Who&When 23, shortened: the orchestrator's USPS request four times in other words."""


def reservation_lookup(records: Sequence[str], number: int) -> ToolEvent:
    """tau-bench's ``get_reservation_details`` of reservation ``RES<number>``, answered with
    ``records[number]``: distinct lookups, each answer another record."""
    return ToolEvent(
        tool_name="get_reservation_details",
        arguments={"reservation_id": f"RES{number}"},
        output=records[number],
        kind=ToolKind.READ,
    )


def grep_read(word: str) -> ToolEvent:
    """A ``grep`` for the definition of ``word``: a read whose answer is new for each word."""
    return ToolEvent(
        tool_name="bash",
        arguments={"command": f"grep -n 'def {word}' app.py"},
        output=f"app.py: def {word}(self, request, obj): handles the {word} step",
        kind=ToolKind.READ,
    )


def warmed_detector() -> StagnationDetector:
    """A detector with the defaults, past its step gate on five new reads."""
    detector = StagnationDetector(StagnationConfig())
    for word in ("alpha", "beta", "gamma", "delta", "epsilon"):
        assert detector.observe(grep_read(word)).level is StagnationLevel.NONE
    return detector
