"""Untrusted patterns: compiled by RE2, matched in linear time, refused with the fix."""

from __future__ import annotations

import time

import pytest

from shared.errors import ConfigError
from shared.safe_regex import MAX_PATTERN_CHARS, compile_user_pattern

REDOS_TEXT = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|a)+$", "(a|aa)+$", "(.*a){20}$"])
def test_catastrophic_patterns_return_at_once(pattern: str) -> None:
    """Patterns that backtrack exponentially in ``re`` miss the issue-12 text at once."""
    compiled = compile_user_pattern(pattern)
    started = time.monotonic()
    assert compiled.search(REDOS_TEXT * 1000) is None
    assert time.monotonic() - started < 2


def test_search_and_finditer_give_the_whole_match() -> None:
    """``search`` gives the first whole match, ``finditer`` every one; groups are ignored."""
    compiled = compile_user_pattern(r"JIRA-(\d+)")
    assert compiled.search("see JIRA-12 and JIRA-7") == "JIRA-12"
    assert list(compiled.finditer("see JIRA-12 and JIRA-7")) == ["JIRA-12", "JIRA-7"]
    assert compiled.search("nothing") is None
    assert compiled.pattern == r"JIRA-(\d+)"


def test_ignore_case() -> None:
    """``ignore_case`` matches without regard to case."""
    assert compile_user_pattern("todo", ignore_case=True).search("a TODO here") == "TODO"
    assert compile_user_pattern("todo").search("a TODO here") is None


def test_non_ascii_text_and_lone_surrogates() -> None:
    """Matches are in characters; a lone surrogate (from JSON) does not raise."""
    compiled = compile_user_pattern("é.")
    assert compiled.search("café!") == "é!"
    assert compile_user_pattern("x.").search("x\ud800") == "x?"


@pytest.mark.parametrize(
    ("pattern", "why", "fix"),
    [
        ("(unclosed", "it is not valid RE2 syntax (RE2: missing ): (unclosed)", "fix the pattern"),
        (r"(?<=a)b", "it has a lookaround", "match the surrounding text"),
        (r"(?!a)b", "it has a lookaround", "match the surrounding text"),
        (r"(a)\1", "it has a backreference", "repeat the group's pattern"),
        (r"(?P<x>a)(?P=x)", "it has a backreference", "repeat the group's pattern"),
        (r"(?>a+)b", "atomic group or a possessive quantifier", "write (?:...)"),
        (r"a++", "atomic group or a possessive quantifier", "drop the extra +"),
        (r"end\Z", r"RE2 writes the end of the text as \z", r"write \z (or $)"),
        (r"a{1001}", "over RE2's limit of 1000", "a smaller count"),
    ],
)
def test_refusals_name_the_pattern_why_and_the_fix(pattern: str, why: str, fix: str) -> None:
    """A pattern RE2 cannot take raises ConfigError with where, the pattern, why and the fix."""
    with pytest.raises(ConfigError) as caught:
        compile_user_pattern(pattern, where="grep")
    message = str(caught.value)
    assert message.startswith(f"grep: the pattern {pattern!r} cannot be used: ")
    assert why in message
    assert fix in message


def test_a_pattern_with_a_lone_surrogate_is_refused() -> None:
    """A pattern that is not UTF-8 is a ConfigError, not a UnicodeEncodeError."""
    with pytest.raises(ConfigError, match="holds an unpaired surrogate"):
        compile_user_pattern("a\ud800")


def test_an_overlong_pattern_is_refused() -> None:
    """A pattern over MAX_PATTERN_CHARS is refused before RE2 sees it, giving the limit."""
    with pytest.raises(ConfigError, match=f"is {MAX_PATTERN_CHARS + 1} characters long; the "):
        compile_user_pattern("a" * (MAX_PATTERN_CHARS + 1))


def test_refusals_are_not_logged(capfd: pytest.CaptureFixture[str]) -> None:
    """RE2 writes nothing to stderr when it refuses a pattern: the error says it all."""
    with pytest.raises(ConfigError):
        compile_user_pattern("(unclosed")
    assert capfd.readouterr().err == ""


def test_sub_replaces_every_match_as_is() -> None:
    """``sub`` replaces each match with the replacement text, backslashes and all."""
    assert compile_user_pattern(r"k\d").sub(r"\1*", "k1 and k2, not k") == r"\1* and \1*, not k"
