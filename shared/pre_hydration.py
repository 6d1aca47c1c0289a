"""Pre-hydration: references in the task input resolved before the loop starts (Symbiont §11).

The engine finds URLs, file paths, issue and PR numbers (plus custom patterns) in the task text,
resolves each through a :class:`ReferenceResolver` concurrently, fits the results into a token
budget and formats them as a system message. It is pure: no network, no Celery. The resolver is
the seam through which the coordinator routes the calls (workers, policy gate).

Differences from Symbiont, all deliberate bug fixes:

- ``max_references=0`` extracts nothing (Symbiont still returns one reference).
- Custom patterns come from the task, so they are RE2 patterns (:mod:`shared.safe_regex`):
  matching takes time linear in the text, and ``(a+)+$`` cannot freeze a coordinator. One RE2
  cannot take (a syntax error, a backreference, a lookaround) fails validation of the
  configuration, naming the pattern and the fix, so a task holding it is rejected at intake;
  the engine raises :class:`~shared.errors.ConfigError` for one that bypassed validation
  (Symbiont drops it silently). As in Symbiont the whole match is the value and capture groups
  are ignored. The built-in patterns are the project's own and stay on Python ``re``.
- A task has at most ``MAX_CUSTOM_PATTERNS`` custom patterns, and extraction looks at the
  first ``MAX_MATCHES_PER_PATTERN`` matches of each pattern (duplicates included), so a pattern
  that matches everywhere in a 1 MB goal costs milliseconds, not minutes.
- Results are paired with references by call id (``prehydrate_{i}``), never by position.
- Every reference ends up either resolved or failed. A reference whose type has no tool in
  ``resolution_tools`` fails with ``No resolution tool configured for reference type '<t>'``
  (Symbiont drops such references silently as soon as one other reference has a tool).
- A timeout fails only the references still unresolved, with ``Resolution timed out after
  <timeout>``; the ones already resolved are kept (Symbiont fails all of them).
- Truncation counts UTF-8 **bytes**, as Symbiont does (so the numbers match Symbiont's and the
  budget stays conservative for non-ASCII text), but it cuts on a character boundary and never
  splits a character (Symbiont panics). The ``...[truncated]`` marker is kept and the estimate
  is ``utf8_len(content) // 4`` measured after the marker, so the total may exceed the budget by
  a few tokens, as in Symbiont.
- After the budget is exhausted, later references that resolved fail with ``Token budget
  exhausted``; later references that failed for their own reason keep that reason (Symbiont
  overwrites it). ``max_context_tokens=0`` therefore keeps nothing.
- The footer reads ``(1 reference could not be resolved)`` in the singular.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.durations import Duration, format_duration
from shared.redaction import Redactor
from shared.safe_regex import compile_user_pattern

if TYPE_CHECKING:
    from shared.events import PreHydrationComplete

__all__ = [
    "BUILTIN_PATTERNS",
    "MAX_CUSTOM_PATTERNS",
    "MAX_MATCHES_PER_PATTERN",
    "TRUNCATION_MARKER",
    "ExtractedReference",
    "FailedReference",
    "FunctionResolver",
    "HydratedContext",
    "PreHydrationConfig",
    "PreHydrationEngine",
    "ReferencePattern",
    "ReferenceResolver",
    "ResolutionResult",
    "ResolvedReference",
    "truncate_utf8",
]

TRUNCATION_MARKER = "...[truncated]"
_CONTEXT_HEADER = "[PRE_HYDRATED_CONTEXT]"
_CONTEXT_INTRO = "The following references were resolved from the task input:"
_BUDGET_EXHAUSTED = "Token budget exhausted"

MAX_CUSTOM_PATTERNS = 32
"""A task's ``pre_hydration.custom_patterns`` holds at most this many patterns."""

MAX_MATCHES_PER_PATTERN = 1000
"""Extraction looks at no more than this many matches of one pattern (duplicates count)."""


class ReferencePattern(BaseModel):
    """A custom reference type and the regex that finds it (the whole match is the value)."""

    model_config = ConfigDict(frozen=True)

    ref_type: str
    pattern: str


BUILTIN_PATTERNS: tuple[ReferencePattern, ...] = (
    ReferencePattern(ref_type="url", pattern=r"https?://[^\s\)>\]]+"),
    ReferencePattern(ref_type="file", pattern=r"(?:^|\s)([./~][a-zA-Z0-9_/.\-]+\.[a-zA-Z0-9]+)"),
    ReferencePattern(ref_type="issue", pattern=r"#(\d+)"),
    ReferencePattern(ref_type="pr", pattern=r"(?i)PR\s*#(\d+)"),
)
"""The built-in patterns, tried in this order before the custom ones."""

_BUILTIN_REGEXES = tuple((p.ref_type, re.compile(p.pattern)) for p in BUILTIN_PATTERNS)

_Finder = Callable[[str], Iterator[str]]
"""The text of each match of one pattern in a text, left to right."""


class PreHydrationConfig(BaseModel):
    """Which references to extract, which tool resolves each type, and the budget."""

    model_config = ConfigDict(frozen=True)

    custom_patterns: list[ReferencePattern] = Field(
        default_factory=list, max_length=MAX_CUSTOM_PATTERNS
    )
    resolution_tools: dict[str, str] = Field(default_factory=dict)
    timeout: Duration = timedelta(seconds=15)
    max_references: int = Field(default=10, ge=0)
    max_context_tokens: int = Field(default=4000, ge=0)

    @field_validator("custom_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[ReferencePattern]) -> list[ReferencePattern]:
        for index, pattern in enumerate(patterns):
            _custom_finder(pattern, f"pattern {index} ({pattern.ref_type!r})")
        return patterns


class ExtractedReference(BaseModel):
    """A reference found in the task input: its type (``url``, ``file``, ...) and its text."""

    model_config = ConfigDict(frozen=True)

    ref_type: str
    value: str


class ResolvedReference(BaseModel):
    """A reference with the content its tool returned (possibly truncated to the budget)."""

    model_config = ConfigDict(frozen=True)

    reference: ExtractedReference
    content: str
    token_estimate: int


class FailedReference(BaseModel):
    """A reference that could not be resolved, and why."""

    model_config = ConfigDict(frozen=True)

    reference: ExtractedReference
    error: str


class HydratedContext(BaseModel):
    """The outcome of :meth:`PreHydrationEngine.hydrate`; both lists keep the reference order."""

    model_config = ConfigDict(frozen=True)

    resolved: list[ResolvedReference] = Field(default_factory=list)
    failed: list[FailedReference] = Field(default_factory=list)
    total_tokens: int = 0

    @property
    def references_found(self) -> int:
        """How many references were hydrated (each is either resolved or failed)."""
        return len(self.resolved) + len(self.failed)

    def completion_event(self, redactor: Redactor | None = None) -> PreHydrationComplete:
        """The ``PreHydrationComplete`` journal event describing this outcome: the counts, and
        each failed reference with its reason (redacted with ``redactor``, capped)."""
        # Imported here: shared.events imports shared.loop_types, which imports this module.
        from shared.events import JOURNAL_TEXT_CHARS, PreHydrationComplete, ReferenceFailure

        def clean(text: str) -> str:
            return (redactor.redact(text) if redactor is not None else text)[:JOURNAL_TEXT_CHARS]

        return PreHydrationComplete(
            references_found=self.references_found,
            references_resolved=len(self.resolved),
            references_failed=len(self.failed),
            total_tokens=self.total_tokens,
            failures=[
                ReferenceFailure(
                    ref_type=f.reference.ref_type,
                    reference=clean(f.reference.value),
                    error=clean(f.error),
                )
                for f in self.failed
            ],
        )


class ResolutionResult(BaseModel):
    """What a resolver returns for one call: the content, or an error message."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    content: str
    is_error: bool = False


@runtime_checkable
class ReferenceResolver(Protocol):
    """Runs the tool that resolves one reference (the coordinator's seam to workers and gate)."""

    async def resolve(
        self, call_id: str, tool_name: str, arguments: dict[str, Any]
    ) -> ResolutionResult:
        """Call ``tool_name`` with ``arguments``; answer with the same ``call_id``."""
        ...


ResolveFunction = Callable[[str, dict[str, Any]], Awaitable[str]]


class FunctionResolver:
    """A :class:`ReferenceResolver` over ``async def fn(tool_name, arguments) -> str``.

    The returned text is the content; an exception raised by ``fn`` becomes an error result
    ``"<ExceptionType>: <message>"``.
    """

    def __init__(self, function: ResolveFunction) -> None:
        self._function = function

    async def resolve(
        self, call_id: str, tool_name: str, arguments: dict[str, Any]
    ) -> ResolutionResult:
        """Run the wrapped function and wrap its outcome."""
        try:
            content = await self._function(tool_name, arguments)
        except Exception as exc:
            return ResolutionResult(call_id=call_id, content=_describe(exc), is_error=True)
        return ResolutionResult(call_id=call_id, content=content)


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _utf8(text: str) -> bytes:
    # surrogatepass: content decoded from JSON may hold lone surrogates; never raise on them.
    return text.encode("utf-8", "surrogatepass")


def truncate_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``max_bytes`` bytes.

    The cut always falls on a character boundary, so no character is ever split.
    """
    encoded = _utf8(text)
    if len(encoded) <= max_bytes:
        return text
    end = max(max_bytes, 0)
    while end > 0 and encoded[end] & 0xC0 == 0x80:  # a continuation byte: inside a character
        end -= 1
    return encoded[:end].decode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class _PlannedCall:
    call_id: str
    reference: ExtractedReference
    tool: str | None


@dataclass(frozen=True, slots=True)
class _Resolutions:
    results: dict[str, ResolutionResult]
    timed_out: frozenset[str]


class PreHydrationEngine:
    """Extracts references from task text, resolves them concurrently, and formats the result."""

    def __init__(self, config: PreHydrationConfig | None = None) -> None:
        self._config = config or PreHydrationConfig()
        builtin = [(ref_type, _builtin_finder(regex)) for ref_type, regex in _BUILTIN_REGEXES]
        prefix = "pre_hydration.custom_patterns: pattern"
        custom = [
            (p.ref_type, _custom_finder(p, f"{prefix} {p.ref_type!r}"))
            for p in self._config.custom_patterns
        ]
        self._finders: list[tuple[str, _Finder]] = builtin + custom

    @property
    def config(self) -> PreHydrationConfig:
        """The configuration this engine runs with."""
        return self._config

    def extract_references(self, text: str) -> list[ExtractedReference]:
        """References in ``text``: patterns in order, whole matches, deduped by value, capped."""
        limit = self._config.max_references
        found: list[ExtractedReference] = []
        seen: set[str] = set()
        if limit == 0:
            return found
        for ref_type, finder in self._finders:
            for match in itertools.islice(finder(text), MAX_MATCHES_PER_PATTERN):
                value = match.strip()
                if not value or value in seen:
                    continue
                seen.add(value)
                found.append(ExtractedReference(ref_type=ref_type, value=value))
                if len(found) >= limit:
                    return found
        return found

    async def hydrate(
        self, refs: Sequence[ExtractedReference], resolver: ReferenceResolver
    ) -> HydratedContext:
        """Resolve ``refs`` concurrently within the timeout, then fit them into the budget."""
        planned = self._plan(refs)
        resolutions = await self._resolve_all(planned, resolver)
        return self._fit_budget(planned, resolutions)

    def planned_calls(self, refs: Sequence[ExtractedReference]) -> list[tuple[str, str, str]]:
        """``(call_id, tool name, value)`` of every reference that has a resolution tool.

        A coordinator dispatches these as tool calls (with arguments ``{"input": value}``) and
        later hands the answers to :meth:`assemble`.
        """
        return [(c.call_id, c.tool, c.reference.value) for c in self._plan(refs) if c.tool]

    def assemble(
        self,
        refs: Sequence[ExtractedReference],
        results: Mapping[str, ResolutionResult],
        timed_out: Iterable[str] = (),
    ) -> HydratedContext:
        """Fit resolutions gathered elsewhere (by call id) into the budget, as ``hydrate`` does."""
        resolutions = _Resolutions(results=dict(results), timed_out=frozenset(timed_out))
        return self._fit_budget(self._plan(refs), resolutions)

    @staticmethod
    def format_context(hydrated: HydratedContext) -> str:
        """The system message text; ``""`` when nothing was resolved."""
        if not hydrated.resolved:
            return ""
        lines = [_CONTEXT_HEADER, _CONTEXT_INTRO]
        for item in hydrated.resolved:
            lines.append(f"\n--- {item.reference.value} ({item.reference.ref_type}) ---")
            lines.append(item.content)
        failed = len(hydrated.failed)
        if failed:
            noun = "reference" if failed == 1 else "references"
            lines.append(f"\n({failed} {noun} could not be resolved)")
        return "\n".join(lines)

    def _plan(self, refs: Sequence[ExtractedReference]) -> list[_PlannedCall]:
        tools = self._config.resolution_tools
        return [
            _PlannedCall(call_id=f"prehydrate_{i}", reference=ref, tool=tools.get(ref.ref_type))
            for i, ref in enumerate(refs)
        ]

    async def _resolve_all(
        self, planned: Sequence[_PlannedCall], resolver: ReferenceResolver
    ) -> _Resolutions:
        calls = [(call, call.tool) for call in planned if call.tool is not None]
        if not calls:
            return _Resolutions(results={}, timed_out=frozenset())
        tasks = {
            asyncio.create_task(_resolve_one(resolver, call, tool)): call.call_id
            for call, tool in calls
        }
        try:
            done, pending = await asyncio.wait(tasks, timeout=self._config.timeout.total_seconds())
        finally:
            for task in tasks:
                task.cancel()  # a no-op on finished tasks
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        results: dict[str, ResolutionResult] = {}
        for task in tasks:  # in reference order, so a duplicated answer id resolves predictably
            if task in done and not task.cancelled():
                result = task.result()
                results.setdefault(result.call_id, result)
        return _Resolutions(results=results, timed_out=frozenset(tasks[t] for t in pending))

    def _outcome(self, call: _PlannedCall, resolutions: _Resolutions) -> ResolutionResult:
        if call.tool is None:
            error = f"No resolution tool configured for reference type '{call.reference.ref_type}'"
        elif call.call_id in resolutions.timed_out:
            error = f"Resolution timed out after {format_duration(self._config.timeout)}"
        elif call.call_id in resolutions.results:
            return resolutions.results[call.call_id]
        else:
            error = f"The resolver returned no result for call id '{call.call_id}'"
        return ResolutionResult(call_id=call.call_id, content=error, is_error=True)

    def _fit_budget(
        self, planned: Sequence[_PlannedCall], resolutions: _Resolutions
    ) -> HydratedContext:
        max_tokens = self._config.max_context_tokens
        resolved: list[ResolvedReference] = []
        failed: list[FailedReference] = []
        total = 0
        for call in planned:
            outcome = self._outcome(call, resolutions)
            if outcome.is_error:
                failed.append(FailedReference(reference=call.reference, error=outcome.content))
            elif total >= max_tokens:
                failed.append(FailedReference(reference=call.reference, error=_BUDGET_EXHAUSTED))
            else:
                item = _fit(call.reference, outcome.content, max_tokens * 4 - total * 4)
                resolved.append(item)
                total += item.token_estimate
        return HydratedContext(resolved=resolved, failed=failed, total_tokens=total)


def _fit(reference: ExtractedReference, content: str, remaining_bytes: int) -> ResolvedReference:
    """Keep ``content`` whole if it fits in ``remaining_bytes``; otherwise cut it and mark it."""
    if len(_utf8(content)) > remaining_bytes:
        content = truncate_utf8(content, remaining_bytes) + TRUNCATION_MARKER
    return ResolvedReference(
        reference=reference, content=content, token_estimate=len(_utf8(content)) // 4
    )


async def _resolve_one(
    resolver: ReferenceResolver, call: _PlannedCall, tool: str
) -> ResolutionResult:
    try:
        return await resolver.resolve(call.call_id, tool, {"input": call.reference.value})
    except Exception as exc:
        return ResolutionResult(
            call_id=call.call_id, content=f"Resolver failed: {_describe(exc)}", is_error=True
        )


def _builtin_finder(regex: re.Pattern[str]) -> _Finder:
    """A trusted pattern's matches (Python ``re``)."""

    def find(text: str) -> Iterator[str]:
        return (match.group(0) for match in regex.finditer(text))

    return find


def _custom_finder(pattern: ReferencePattern, where: str) -> _Finder:
    """A task's pattern's matches (RE2); raises ConfigError naming it when RE2 refuses it."""
    return compile_user_pattern(pattern.pattern, where=where).finditer
