"""Masking of volatile tokens (numbers, hex ids, timestamps, temp paths, UUIDs) before comparing.

Two error messages or tool outputs that differ only by a line number, a PID, a timestamp or a
temporary directory describe the same situation. Both the progress tracker and the stagnation
detector compare text after this normalisation.
"""

from __future__ import annotations

import re

__all__ = ["normalize_volatile"]

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # ISO-8601 and common log timestamps, before bare numbers eat them.
    (
        re.compile(
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
        ),
        "<ts>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<ts>"),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    # Temporary paths: /tmp/..., /var/folders/..., pytest and mkdtemp names.
    (re.compile(r"(?:/private)?/(?:tmp|var/folders|var/tmp)/[^\s'\"):,]*"), "<tmp>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # Hex ids of 7+ characters that contain at least one digit and one letter (git shas, ids).
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
)


def normalize_volatile(text: str) -> str:
    """Mask volatile tokens: ``line 334`` and ``line 352`` both become ``line <n>``."""
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return text
