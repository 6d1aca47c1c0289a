"""Output shaping: byte caps never split a character, and hashes are SHA-256."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from workers.tools.output import (
    cap_bytes,
    cap_text,
    error_output,
    looks_binary,
    sha256_hex,
    utf8_prefix,
    utf8_suffix,
)


@given(text=st.text(), cap=st.integers(min_value=0, max_value=64))
def test_prefix_is_a_whole_character_prefix(text: str, cap: int) -> None:
    """The prefix decodes strictly, fits the cap and starts the text."""
    data = text.encode("utf-8")
    kept = utf8_prefix(data, cap)
    assert len(kept) <= cap
    assert text.startswith(kept.decode("utf-8"))
    assert len(kept) > cap - 4 or len(kept) == len(data)


@given(text=st.text(), cap=st.integers(min_value=0, max_value=64))
def test_suffix_is_a_whole_character_suffix(text: str, cap: int) -> None:
    """The suffix decodes strictly, fits the cap and ends the text."""
    kept = utf8_suffix(text.encode("utf-8"), cap)
    assert len(kept) <= cap
    assert text.endswith(kept.decode("utf-8"))


@given(text=st.text(), cap=st.integers(min_value=0, max_value=64))
def test_cap_text_marks_what_it_cut(text: str, cap: int) -> None:
    """Text that fits is unchanged; cut text keeps a prefix and ends with the marker."""
    capped = cap_text(text, cap, hint="ask for less")
    if len(text.encode("utf-8")) <= cap:
        assert capped == text
    else:
        body, marker = capped.rsplit("\n", 1)
        assert text.startswith(body)
        assert len(body.encode("utf-8")) <= cap
        assert marker.startswith("[output truncated: showing")
        assert marker.endswith("ask for less]")
        assert "\ufffd" not in body or "\ufffd" in text


def test_cap_bytes_reports_the_whole_size() -> None:
    """When only the beginning was read, the marker names the full size."""
    capped = cap_bytes(b"abcdef", 3, hint="h", total_bytes=1000)
    assert capped == "abc\n[output truncated: showing 3 of 1000 bytes; h]"


def test_sha256_and_binary_sniffing() -> None:
    """Hashes are SHA-256 hex; a NUL byte in the head marks binary content."""
    assert sha256_hex(b"x") == hashlib.sha256(b"x").hexdigest()
    assert looks_binary(b"ab\x00c")
    assert not looks_binary("héllo".encode())


def test_error_output_carries_its_type() -> None:
    """An error output is is_error and tags its error_type next to the given metadata."""
    output = error_output("boom", error_type="timeout", kind="command")
    assert output.is_error
    assert output.metadata == {"kind": "command", "error_type": "timeout"}


def test_suffix_drops_a_leading_partial_character() -> None:
    """A buffer that starts inside a character loses the orphan continuation bytes."""
    assert utf8_suffix("é".encode()[1:] + b"ab", 10) == b"ab"
