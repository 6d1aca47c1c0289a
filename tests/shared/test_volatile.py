"""Masking of volatile tokens: what it masks, and that its shortcuts change nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.volatile import _RULES, normalize_volatile


def _every_rule(text: str) -> str:
    """The masking without the substring shortcuts: every pattern, in order."""
    for pattern, placeholder, _needs in _RULES:
        text = pattern.sub(placeholder, text)
    return text


def test_masks_timestamps_ids_paths_and_numbers() -> None:
    """Each kind of volatile token becomes its placeholder."""
    text = (
        "2026-11-30T04:05:06Z 12:01:02 3f2b9c1e-1d2a-4b3c-8d4e-5f6a7b8c9d0e "
        "/tmp/pytest-7/x.py 0xdeadbeef 9fceb02 line 334"
    )
    assert normalize_volatile(text) == "<ts> <ts> <uuid> <tmp> <hex> <hex> line <n>"


_PIECES = st.sampled_from(
    ["-", ":", "/tmp/", "/var/tmp/", "/var/folders/", "/private", "0x", "T", " ", "\n", "Z",
     "+", ".", ",", "a", "F", "g", "7", "12", "2026", "0", "ab12cd3", "'", ")"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=60).map("".join))
def test_the_shortcuts_never_change_the_result(text: str) -> None:
    """Skipping a rule whose required substrings are absent gives the same text as running it."""
    assert normalize_volatile(text) == _every_rule(text)
