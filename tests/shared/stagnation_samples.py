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

__all__ = [
    "OTHER_TARGET_REQUEST",
    "REWORDED_REQUESTS",
    "SAME_TARGET_REQUESTS",
    "grep_read",
    "reservation_lookup",
    "warmed_detector",
]

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

SAME_TARGET_REQUESTS = (
    "Please visit the '10 Best Yellowstone Kid Friendly Hikes - Tales of a Mountain Mama' page "
    "and gather the list of top recommended family-friendly hikes in Yellowstone.",
    "Please click on and explore the '10 Best Yellowstone Kid Friendly Hikes - Tales of a "
    "Mountain Mama' link to gather the names of the specific hikes recommended for young kids.",
    "Please visit the '10 Best Yellowstone Kid Friendly Hikes - Tales of a Mountain Mama' page "
    "directly by using the link and gather the recommended hikes.",
)
"""Who&When 38: the same page asked for three times (rounds 9, 13, 21), the second in other
words (content words 0.56 alike with the first, under ``plan_paraphrase``). The run's second
request ends "recommended for families with kids", which rule 20 (a plural in ``-ies`` read as
its ``-y`` word) already makes 0.67 alike; here it ends "for young kids", so that only the
quoted target joins the two."""

OTHER_TARGET_REQUEST = (
    "Please visit the 'Best Hikes Near Bozeman - Montana Trail Guide' page and gather the list "
    "of top recommended family-friendly hikes in Yellowstone."
)
"""The first of :data:`SAME_TARGET_REQUESTS` about another page: a batch's next request
(content words 0.44 alike with it, another quoted target)."""


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
