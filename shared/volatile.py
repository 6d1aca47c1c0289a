"""Masking of volatile tokens (numbers, hex ids, timestamps, temp paths, UUIDs) before comparing.

Two error messages or tool outputs that differ only by a line number, a PID, a timestamp or a
temporary directory describe the same situation. Both the progress tracker and the stagnation
detector compare text after this normalisation.
"""

from __future__ import annotations

import re

__all__ = ["normalize_volatile"]

_RULES: tuple[tuple[re.Pattern[str], str, tuple[str, ...]], ...] = (
    # Each rule: pattern, placeholder, and substrings of which the text must contain one for
    # the pattern to match at all (empty: no such shortcut). A rule whose substrings are all
    # absent is skipped: `in` scans at memory speed, a pattern that matches nothing still costs
    # a pass of the regex engine (about 1 ms per 64 KB each).
    # ISO-8601 and common log timestamps, before bare numbers eat them.
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        ),
        "<ts>",
        ("-",),
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<ts>", (":",)),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
        ("-",),
    ),
    # Temporary paths: /tmp/..., /var/folders/..., pytest and mkdtemp names.
    (
        re.compile(r"(?:/private)?/(?:tmp|var/folders|var/tmp)/[^\s'\"):,]*"),
        "<tmp>",
        ("/tmp/", "/var/folders/", "/var/tmp/"),  # noqa: S108 - text to find, not files to use
    ),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>", ("0x",)),
    # Hex ids of 7+ characters that contain at least one digit and one letter (git shas, ids).
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,}\b"), "<hex>", ()),
    # Bare numbers; digits that end a name (test_case12, HAT052, py3) are part of the name.
    (re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?"), "<n>", ()),
)


_NUMBERS = _RULES[-1][0]


def normalize_volatile(text: str, *, numbers: bool = True) -> str:
    """Mask volatile tokens: ``line 334`` and ``line 352`` both become ``line <n>``.

    ``numbers=False`` leaves bare numbers as they are (timestamps, UUIDs, temporary paths and
    hex ids are still masked): for a short answer whose numbers are its content.
    """
    for pattern, placeholder, needs in _RULES:
        if not numbers and pattern is _NUMBERS:
            continue
        if needs:
            for part in needs:  # a loop, not any() over a generator: this runs on every output
                if part in text:
                    break
            else:
                continue  # none of its substrings is there: the pattern cannot match
        text = pattern.sub(placeholder, text)
    return text
