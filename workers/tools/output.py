"""Shaping what a tool returns: content hashes, byte caps that never split a character, errors.

Every cap in the tools is a cap on the *body* of the output, in UTF-8 bytes. A short marker that
says what was left out (and how to see it) comes on top, so a capped content is at most
``max_output_bytes`` plus about a hundred bytes.
"""

from __future__ import annotations

import hashlib

from workers.tools.base import ToolOutput

__all__ = [
    "BINARY_SNIFF_BYTES",
    "cap_bytes",
    "cap_text",
    "error_output",
    "looks_binary",
    "sha256_hex",
    "utf8_prefix",
    "utf8_suffix",
]

BINARY_SNIFF_BYTES = 8192
"""How many leading bytes are searched for a NUL byte to call a file binary (git's heuristic)."""

_UTF8_CONTINUATION_MASK = 0xC0
_UTF8_CONTINUATION = 0x80
_MAX_UTF8_BACKOFF = 3


def sha256_hex(data: bytes) -> str:
    """The SHA-256 digest of ``data`` in lowercase hexadecimal."""
    return hashlib.sha256(data).hexdigest()


def looks_binary(head: bytes) -> bool:
    """True when the leading bytes of a file or body contain a NUL byte."""
    return b"\x00" in head[:BINARY_SNIFF_BYTES]


def _is_continuation(byte: int) -> bool:
    return byte & _UTF8_CONTINUATION_MASK == _UTF8_CONTINUATION


def utf8_prefix(data: bytes, max_bytes: int) -> bytes:
    """At most ``max_bytes`` leading bytes of ``data``, backing off so no character is split."""
    end = max(min(max_bytes, len(data)), 0)
    floor = max(end - _MAX_UTF8_BACKOFF, 0)
    while floor < end < len(data) and _is_continuation(data[end]):
        end -= 1
    return data[:end]


def utf8_suffix(data: bytes, max_bytes: int) -> bytes:
    """At most ``max_bytes`` trailing bytes of ``data``, moving forward so no character is split.

    Continuation bytes at the start are dropped even when nothing is cut: ``data`` may itself
    be the tail of a longer stream, cut inside a character.
    """
    start = max(len(data) - max(max_bytes, 0), 0)
    ceiling = min(start + _MAX_UTF8_BACKOFF, len(data))
    while start < ceiling and _is_continuation(data[start]):
        start += 1
    return data[start:]


def cap_text(text: str, max_bytes: int, *, hint: str) -> str:
    """``text`` cut to ``max_bytes`` UTF-8 bytes, followed by a marker ending with ``hint``.

    Returns ``text`` unchanged when it fits. The cut never splits a character.
    """
    return cap_bytes(text.encode("utf-8"), max_bytes, hint=hint)


def cap_bytes(data: bytes, max_bytes: int, *, hint: str, total_bytes: int | None = None) -> str:
    """``data`` decoded as UTF-8 and cut to ``max_bytes``, with a marker when something is cut.

    ``total_bytes`` is the size of the whole text when ``data`` is already only its beginning.
    Invalid UTF-8 is replaced by U+FFFD; the cut never splits a character.
    """
    total = len(data) if total_bytes is None else total_bytes
    if total <= max_bytes:
        return data.decode("utf-8", errors="replace")
    kept = utf8_prefix(data, max_bytes)
    marker = f"[output truncated: showing {len(kept)} of {total} bytes; {hint}]"
    return kept.decode("utf-8", errors="replace") + "\n" + marker


def error_output(message: str, *, error_type: str, **metadata: str) -> ToolOutput:
    """An ``is_error`` output whose metadata carries ``error_type`` and the given values."""
    return ToolOutput(
        content=message, is_error=True, metadata={**metadata, "error_type": error_type}
    )
