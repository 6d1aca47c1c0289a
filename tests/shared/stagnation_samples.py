"""Sample texts and events the stagnation tests share (cut from labelled runs)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.stagnation import ToolEvent, ToolKind

__all__ = ["REWORDED_REQUESTS", "reservation_lookup"]

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
