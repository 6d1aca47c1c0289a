"""Tool profiles: glob filtering of the tools the model sees (Symbiont §9).

A profile only *hides* tool definitions from the model; it is not enforcement. The policy gate is.
The globs come from the task, so they are matched by RE2 (:mod:`shared.safe_regex`), in time
linear in the name: ``*a*a*a*a*a*a*a*a*c`` cannot freeze the worker that filters the tools.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from pydantic import ConfigDict, Field, field_validator

from shared.inference import ToolDefinition
from shared.safe_regex import UserPattern, compile_user_pattern
from shared.wire import OmitNoneModel

__all__ = ["VERIFIED_MARKER", "ToolProfile", "glob_matches", "glob_to_regex"]

VERIFIED_MARKER = "[verified]"


def glob_to_regex(pattern: str) -> str:
    r"""Translate a tool glob into an anchored RE2 regex: ``*`` any run, ``?`` one character.

    Everything else is literal, including ``[`` and ``]`` (no character classes). The regex
    is anchored with ``\A`` and ``\z`` so that a trailing newline never matches.
    """
    translated = {"*": ".*", "?": "."}
    body = "".join(translated.get(char) or re.escape(char) for char in pattern)
    return r"\A" + body + r"\z"


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> UserPattern:
    return compile_user_pattern(glob_to_regex(pattern), where=f"tool_profile glob {pattern!r}")


def glob_matches(pattern: str, name: str) -> bool:
    """True when the whole ``name`` matches ``pattern`` (case-sensitive, newline not matched).

    Raises ConfigError for a glob RE2 cannot take: one of thousands of characters, or holding a
    lone surrogate (neither passes a ``ToolProfile``'s validation).
    """
    return _compiled(pattern).search(name) is not None


def _matches_any(patterns: Iterable[str], name: str) -> bool:
    return any(glob_matches(p, name) for p in patterns)


class ToolProfile(OmitNoneModel):
    """Which tools the model sees: include globs, then exclude globs, then verified, then a cap."""

    model_config = ConfigDict(frozen=True)
    omit_when_none = frozenset({"max_tools"})

    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    max_tools: int | None = Field(default=None, ge=0)
    require_verified: bool = False

    @field_validator("include", "exclude")
    @classmethod
    def _globs_compile(cls, globs: list[str]) -> list[str]:
        for glob in globs:
            _compiled(glob)  # a glob too long for RE2 is refused here, not in a worker
        return globs

    @classmethod
    def permissive(cls) -> ToolProfile:
        """A profile that keeps every tool."""
        return cls()

    @classmethod
    def include_only(cls, patterns: Sequence[str]) -> ToolProfile:
        """Keep only tools matching one of ``patterns``."""
        return cls(include=list(patterns))

    @classmethod
    def exclude_only(cls, patterns: Sequence[str]) -> ToolProfile:
        """Drop tools matching one of ``patterns``."""
        return cls(exclude=list(patterns))

    def filter_tools(self, tools: Sequence[ToolDefinition]) -> list[ToolDefinition]:
        """Apply include, exclude, ``[verified]`` and ``max_tools``, keeping the input order."""
        kept = list(tools)
        if self.include:
            kept = [t for t in kept if _matches_any(self.include, t.name)]
        if self.exclude:
            kept = [t for t in kept if not _matches_any(self.exclude, t.name)]
        if self.require_verified:
            kept = [t for t in kept if VERIFIED_MARKER in t.description]
        if self.max_tools is not None:
            kept = kept[: self.max_tools]
        return kept
