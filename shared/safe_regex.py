"""Patterns that come from a task, a policy or a model, matched by RE2 in linear time.

Python's ``re`` backtracks: ``(a+)+$`` against ``"a" * 34 + "!"`` runs for minutes on the
thread that tries it, and nothing can interrupt it. RE2 (``google-re2``) never backtracks, so a
search takes time linear in the text whatever the pattern, and a compiled pattern's memory is
bounded (RE2's default budget of 8 MiB). The price is RE2's syntax: no backreferences, no
lookarounds, no atomic groups or possessive quantifiers, ``\\z`` instead of ``\\Z``, and
``\\d``, ``\\w``, ``\\s``, ``\\b`` are ASCII-only (``\\pL``, ``\\pN`` match Unicode classes). A
pattern RE2 refuses raises :class:`~shared.errors.ConfigError` naming the pattern, what RE2
cannot take and the fix.

The project's own fixed patterns stay on ``re``: they are not input, and some need lookarounds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import re2

from shared.errors import ConfigError

__all__ = ["MAX_PATTERN_CHARS", "UserPattern", "compile_user_pattern", "refusal"]

MAX_PATTERN_CHARS = 4096
"""A longer pattern is refused before RE2 parses it."""

_SYNTAX = "https://github.com/google/re2/wiki/Syntax"


class UserPattern:
    """An untrusted pattern compiled by RE2; every search is linear in the length of the text."""

    __slots__ = ("_regexp",)

    def __init__(self, regexp: Any) -> None:
        self._regexp = regexp

    def __repr__(self) -> str:
        return f"UserPattern({self.pattern!r})"

    @property
    def pattern(self) -> str:
        """The pattern as written."""
        return str(self._regexp.pattern)

    def search(self, text: str) -> str | None:
        """The text of the first match, or None when the pattern does not occur in ``text``."""
        match = self._regexp.search(_encodable(text))
        return None if match is None else str(match.group(0))

    def finditer(self, text: str) -> Iterator[str]:
        """The text of every non-overlapping match, left to right."""
        for match in self._regexp.finditer(_encodable(text)):
            yield str(match.group(0))

    def sub(self, replacement: str, text: str) -> str:
        """``text`` with every non-overlapping match replaced by ``replacement`` (taken as is)."""
        return str(self._regexp.sub(lambda _: replacement, _encodable(text)))


def compile_user_pattern(
    pattern: str,
    *,
    where: str = "pattern",
    ignore_case: bool = False,
    max_chars: int = MAX_PATTERN_CHARS,
) -> UserPattern:
    """Compile an untrusted pattern with RE2; raise ConfigError naming ``where`` and the fix."""
    if len(pattern) > max_chars:
        raise ConfigError(
            f"{where}: the pattern {pattern[:60]!r}... is {len(pattern)} characters long; the "
            f"limit is {max_chars}; use a shorter pattern"
        )
    options = re2.Options()
    options.log_errors = False  # the refusal is raised, not written to stderr
    options.never_capture = True  # callers use the whole match only
    options.case_sensitive = not ignore_case
    try:
        return UserPattern(re2.compile(pattern, options))
    except re2.error as exc:
        raise ConfigError(f"{where}: {refusal(pattern, _detail(exc))}") from exc
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{where}: the pattern {pattern!r} holds an unpaired surrogate, which is not UTF-8; "
            "remove it"
        ) from exc


def refusal(pattern: str, detail: str) -> str:
    """Why RE2 refused ``pattern`` (its error ``detail``) and how to fix it, in one sentence."""
    why, fix = _explain(detail)
    return f"the pattern {pattern!r} cannot be used: {why} (RE2: {detail}); {fix}"


_REFUSALS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"operator: \(\?<?[=!]$"),
        "it has a lookaround ((?=, (?!, (?<=, (?<!), which the linear-time engine RE2 does not "
        "support",
        "match the surrounding text as part of the pattern instead",
    ),
    (
        re.compile(r"escape sequence: \\\d$|operator: \(\?P$"),
        "it has a backreference (\\1 or (?P=name)), which the linear-time engine RE2 does not "
        "support",
        "repeat the group's pattern instead of referring back to it",
    ),
    (
        re.compile(r"operator: \(\?>$|repetition operator: \S\+$"),
        "it has an atomic group or a possessive quantifier, which RE2 does not support (nor "
        "need: it never backtracks)",
        "write (?:...) for (?>...) and drop the extra + of *+, ++ or ?+",
    ),
    (
        re.compile(r"\\Z$"),
        "RE2 writes the end of the text as \\z",
        "write \\z (or $) instead of \\Z",
    ),
    (
        re.compile(r"^invalid repetition size"),
        "a repetition count is over RE2's limit of 1000 (nested counts multiply)",
        "use + or * or a smaller count",
    ),
    (
        re.compile(r"^pattern too large"),
        "it is too large once compiled",
        "make the pattern smaller or split it",
    ),
)
"""RE2's error messages (trusted patterns, on ``re``), what each means and the fix."""


def _explain(detail: str) -> tuple[str, str]:
    """What RE2's error means for the author of the pattern, and the fix."""
    for message, why, fix in _REFUSALS:
        if message.search(detail):
            return why, fix
    return "it is not valid RE2 syntax", f"fix the pattern (RE2 syntax: {_SYNTAX})"


def _detail(exc: Exception) -> str:
    """RE2's error text (the module raises it as bytes)."""
    raw = exc.args[0] if exc.args else exc
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _encodable(text: str) -> str:
    """``text`` as RE2 can take it: a lone surrogate (from JSON) becomes ``?``."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text
