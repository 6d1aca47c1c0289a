"""Tool profiles: Symbiont's test catalogue (§13.1) and the glob semantics of §9."""

from __future__ import annotations

import fnmatch
import json
import time
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.inference import ToolDefinition
from shared.tool_profile import VERIFIED_MARKER, ToolProfile, glob_matches, glob_to_regex


def _tool(name: str, description: str | None = None) -> ToolDefinition:
    return ToolDefinition(name=name, description=description or f"Tool {name}")


@pytest.fixture
def tools() -> list[ToolDefinition]:
    """Symbiont's fixture, in its order."""
    return [
        _tool("web_search"),
        _tool("file_read"),
        _tool("file_write"),
        _tool("code_execute"),
        _tool("verified_tool", "[verified] Tool verified_tool"),
    ]


def _names(tools: list[ToolDefinition]) -> list[str]:
    return [t.name for t in tools]


# --- §13.1 ------------------------------------------------------------------------------


def test_permissive_passthrough(tools: list[ToolDefinition]) -> None:
    """The permissive profile keeps all five tools."""
    assert ToolProfile.permissive().filter_tools(tools) == tools


def test_include_only(tools: list[ToolDefinition]) -> None:
    """Including ``file_*`` keeps exactly the two file tools."""
    kept = ToolProfile.include_only(["file_*"]).filter_tools(tools)
    assert _names(kept) == ["file_read", "file_write"]


def test_exclude(tools: list[ToolDefinition]) -> None:
    """Excluding ``file_*`` keeps the three others."""
    kept = ToolProfile.exclude_only(["file_*"]).filter_tools(tools)
    assert len(kept) == 3
    assert not any(name.startswith("file_") for name in _names(kept))


def test_combined_include_exclude(tools: list[ToolDefinition]) -> None:
    """Exclude wins over include: file_write goes, web_search and file_read stay."""
    profile = ToolProfile(include=["file_*", "web_*"], exclude=["file_write"])
    assert _names(profile.filter_tools(tools)) == ["web_search", "file_read"]


def test_max_tools_truncation(tools: list[ToolDefinition]) -> None:
    """``max_tools=2`` keeps the first two in input order."""
    assert _names(ToolProfile(max_tools=2).filter_tools(tools)) == ["web_search", "file_read"]


def test_require_verified(tools: list[ToolDefinition]) -> None:
    """``require_verified`` keeps only the tool whose description carries ``[verified]``."""
    assert _names(ToolProfile(require_verified=True).filter_tools(tools)) == ["verified_tool"]


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("web_*", "web_search", True),
        ("web_*", "web_fetch", True),
        ("web_*", "file_read", False),
        ("tool_?", "tool_a", True),
        ("tool_?", "tool_1", True),
        ("tool_?", "tool_ab", False),
        ("exact_name", "exact_name", True),
        ("exact_name", "other_name", False),
    ],
)
def test_glob_star_question_and_exact(pattern: str, name: str, expected: bool) -> None:
    """Symbiont's three glob tests: ``*``, ``?`` and an exact name."""
    assert glob_matches(pattern, name) is expected


def test_empty_input() -> None:
    """Filtering no tools gives no tools."""
    assert ToolProfile.permissive().filter_tools([]) == []


def test_serde_roundtrip() -> None:
    """All four fields survive a JSON round trip."""
    profile = ToolProfile(
        include=["web_*"], exclude=["debug_*"], max_tools=10, require_verified=True
    )
    restored = ToolProfile.model_validate_json(profile.model_dump_json())
    assert restored == profile
    assert restored.include == ["web_*"]
    assert restored.exclude == ["debug_*"]
    assert restored.max_tools == 10
    assert restored.require_verified is True


# --- §9 details --------------------------------------------------------------------------


def test_empty_object_is_permissive_and_none_cap_is_omitted() -> None:
    """``{}`` reads as the permissive profile, whose JSON leaves ``max_tools`` out."""
    profile = ToolProfile.model_validate({})
    assert profile == ToolProfile.permissive()
    assert json.loads(profile.model_dump_json()) == {
        "include": [],
        "exclude": [],
        "require_verified": False,
    }


def test_max_tools_zero_leaves_nothing(tools: list[ToolDefinition]) -> None:
    """``max_tools=0`` removes every tool."""
    assert ToolProfile(max_tools=0).filter_tools(tools) == []


def test_negative_max_tools_is_rejected() -> None:
    """A negative cap is a validation error."""
    with pytest.raises(ValidationError):
        ToolProfile(max_tools=-1)


def test_steps_apply_in_order_keeping_input_order() -> None:
    """Include, exclude, verified, then the cap, in the input order."""
    tools = [
        _tool("b_tool", "[verified] b"),
        _tool("a_tool", "[verified] a"),
        _tool("a_debug", "[verified] debug"),
        _tool("c_tool", "[verified] c"),
        _tool("a_other", "unverified"),
    ]
    profile = ToolProfile(
        include=["a_*", "c_*"], exclude=["*_debug"], require_verified=True, max_tools=2
    )
    assert _names(profile.filter_tools(tools)) == ["a_tool", "c_tool"]


@pytest.mark.parametrize(
    ("description", "kept"),
    [
        ("[verified]", True),
        ("A tool [verified] in the middle", True),
        ("[Verified] tool", False),
        ("verified tool", False),
        ("", False),
    ],
)
def test_verified_is_a_case_sensitive_substring(description: str, kept: bool) -> None:
    """Only the literal, case-sensitive ``[verified]`` marker counts, anywhere."""
    profile = ToolProfile(require_verified=True)
    assert bool(profile.filter_tools([_tool("t", description)])) is kept
    assert VERIFIED_MARKER == "[verified]"


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("web_*", "WEB_search", False),  # case-sensitive
        ("web_*", "web_search\n", False),  # end of text only
        ("*", "line\nbreak", False),  # * does not match a newline
        ("a?b", "a\nb", False),  # ? does not match a newline
        ("tool_?", "tool_é", True),  # a code point is one character
        ("[x]", "[x]", True),  # no character classes
        ("[x]", "x", False),
        ("[ab]_tool", "a_tool", False),
        ("a.b", "axb", False),  # regex metacharacters are literal
        ("a+(b)|{c}^$\\", "a+(b)|{c}^$\\", True),
        ("", "", True),  # the empty pattern matches only the empty name
        ("", "x", False),
        ("*", "", True),
        ("*", "anything_at_all", True),
        ("web", "web_search", False),  # whole-name match
        ("search", "web_search", False),
        ("*_*", "a_b", True),
        ("*search", "web_search", True),
    ],
)
def test_glob_semantics(pattern: str, name: str, expected: bool) -> None:
    """The glob rules of §9, case by case."""
    assert glob_matches(pattern, name) is expected


def test_glob_is_not_fnmatch() -> None:
    """``fnmatch`` treats ``[ab]`` as a class; our glob treats it literally."""
    assert fnmatch.fnmatchcase("a", "[ab]") is True
    assert glob_matches("[ab]", "a") is False


def test_glob_to_regex_is_anchored() -> None:
    """The regex is anchored at the start and at the very end of the text."""
    assert glob_to_regex("a*?") == r"\Aa.*.\z"


@pytest.mark.timeout(10)
def test_a_glob_with_many_stars_is_matched_in_linear_time() -> None:
    """``*a`` twelve times then ``*c`` against 64 a's (exponential in ``re``) answers at once."""
    started = time.monotonic()
    assert glob_matches("*a" * 12 + "*c", "a" * 64) is False
    assert glob_matches("*a" * 12 + "*c", "a" * 64 + "c") is True
    assert time.monotonic() - started < 2


def test_a_glob_with_a_lone_surrogate_is_refused_by_the_profile() -> None:
    """A glob that is not UTF-8 fails the profile's validation, naming the glob."""
    with pytest.raises(ValidationError, match="tool_profile glob '\\\\ud800'"):
        ToolProfile(exclude=["\ud800"])


def test_a_glob_too_long_is_refused_by_the_profile() -> None:
    """A glob RE2 would refuse fails the profile's validation, not a later filter."""
    with pytest.raises(ValidationError, match="tool_profile glob"):
        ToolProfile(include=["x" * 5000])


# --- properties -------------------------------------------------------------------------

_ALPHABET = st.sampled_from(["a", "b", "A", "_", ".", "[", "]", "\\", "\n", "é", "😀"])
_PATTERN_ALPHABET = st.one_of(_ALPHABET, st.sampled_from(["*", "?"]))
_names_st = st.text(alphabet=_ALPHABET, max_size=8)
_patterns_st = st.text(alphabet=_PATTERN_ALPHABET, max_size=6)
# Globs and names are UTF-8 text: a task holding a lone surrogate is refused at intake.
_plain_text = st.text(
    st.characters(blacklist_characters="*?\n", blacklist_categories=("Cs",)), max_size=12
)


def _oracle(pattern: str, name: str) -> bool:
    """§9 by definition: ``*`` any run, ``?`` one character, neither a newline; all else literal."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(name)
        token = pattern[i]
        if token == "*":
            return match(i + 1, j) or (j < len(name) and name[j] != "\n" and match(i, j + 1))
        if j == len(name):
            return False
        if token == "?":
            return name[j] != "\n" and match(i + 1, j + 1)
        return token == name[j] and match(i + 1, j + 1)

    return match(0, 0)


@given(_patterns_st, _names_st)
def test_glob_agrees_with_the_definition(pattern: str, name: str) -> None:
    """On random patterns and names the glob matches exactly when the §9 definition does."""
    assert glob_matches(pattern, name) is _oracle(pattern, name)


@given(_plain_text, _plain_text)
def test_a_pattern_without_wildcards_matches_only_itself(pattern: str, name: str) -> None:
    """Without ``*`` or ``?`` a pattern is a literal name: it matches itself and nothing else."""
    assert glob_matches(pattern, pattern)
    assert glob_matches(pattern, name) is (pattern == name)


@given(_plain_text, st.text(max_size=12))
def test_star_matches_any_suffix_without_newline(prefix: str, rest: str) -> None:
    """``prefix*`` matches ``prefix`` followed by anything that holds no newline."""
    assert glob_matches(prefix + "*", prefix + rest) is ("\n" not in rest)


@given(_plain_text, st.text(max_size=3))
def test_question_mark_matches_exactly_one_character(prefix: str, rest: str) -> None:
    """``prefix?`` matches ``prefix`` plus exactly one character other than a newline."""
    assert glob_matches(prefix + "?", prefix + rest) is (len(rest) == 1 and rest != "\n")


@given(st.text(alphabet=st.characters(whitelist_categories=("Lu", "Ll")), min_size=1, max_size=12))
def test_matching_is_case_sensitive(name: str) -> None:
    """A name whose case is swapped is a different name."""
    swapped = name.swapcase()
    assert glob_matches(name, swapped) is (swapped == name)


@given(st.lists(_names_st, max_size=8), st.lists(_patterns_st, max_size=3))
def test_filter_keeps_input_order_and_only_matching_names(
    names: list[str], include: list[str]
) -> None:
    """The kept tools are the matching ones, in their input order."""
    tools = [_tool(name) for name in names]
    kept = ToolProfile(include=include).filter_tools(tools)
    expected = [t for t in tools if not include or any(_oracle(p, t.name) for p in include)]
    assert kept == expected
