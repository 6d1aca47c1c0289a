"""Pre-hydration: extraction, concurrent resolution, budget, timeout and formatting (§11, §13.3)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.errors import ConfigError
from shared.events import JOURNAL_TEXT_CHARS, PreHydrationComplete, ReferenceFailure
from shared.pre_hydration import (
    MAX_CUSTOM_PATTERNS,
    MAX_MATCHES_PER_PATTERN,
    TRUNCATION_MARKER,
    ExtractedReference,
    FailedReference,
    FunctionResolver,
    HydratedContext,
    PreHydrationConfig,
    PreHydrationEngine,
    ReferencePattern,
    ReferenceResolver,
    ResolutionResult,
    ResolvedReference,
    truncate_utf8,
)
from shared.redaction import REDACTED, Redactor


class FakeResolver:
    """Answers each reference value with a fixed content after an optional delay; records calls."""

    def __init__(
        self,
        contents: Mapping[str, str] | None = None,
        delays: Mapping[str, float] | None = None,
        errors: Mapping[str, str] | None = None,
        default_delay: float = 0.0,
    ) -> None:
        self.contents = dict(contents or {})
        self.delays = dict(delays or {})
        self.errors = dict(errors or {})
        self.default_delay = default_delay
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []

    async def resolve(
        self, call_id: str, tool_name: str, arguments: dict[str, Any]
    ) -> ResolutionResult:
        self.calls.append((call_id, tool_name, arguments))
        value = arguments["input"]
        try:
            await asyncio.sleep(self.delays.get(value, self.default_delay))
        except asyncio.CancelledError:
            self.cancelled.append(call_id)
            raise
        self.finished.append(call_id)
        if value in self.errors:
            return ResolutionResult(call_id=call_id, content=self.errors[value], is_error=True)
        return ResolutionResult(call_id=call_id, content=self.contents.get(value, f"<{value}>"))


def url(value: str) -> ExtractedReference:
    """A url reference."""
    return ExtractedReference(ref_type="url", value=value)


def engine_with(**config: Any) -> PreHydrationEngine:
    """An engine whose config has ``config`` over the defaults."""
    return PreHydrationEngine(PreHydrationConfig(**config))


def pairs(refs: list[ExtractedReference]) -> list[tuple[str, str]]:
    """References as (type, value) pairs."""
    return [(r.ref_type, r.value) for r in refs]


def hydrate(
    engine: PreHydrationEngine, refs: list[ExtractedReference], resolver: ReferenceResolver
) -> HydratedContext:
    """Run ``engine.hydrate`` to completion."""
    return asyncio.run(engine.hydrate(refs, resolver))


URL_TOOLS = {"url": "web_fetch"}

# ---- ports of Symbiont's tests (§13.3) -------------------------------------------------------


def test_extract_urls() -> None:
    """Two URLs are extracted in order of appearance."""
    refs = PreHydrationEngine().extract_references(
        "Check https://example.com/api and https://docs.rs/tokio for details"
    )
    assert pairs(refs) == [("url", "https://example.com/api"), ("url", "https://docs.rs/tokio")]


def test_extract_file_paths() -> None:
    """Relative and home-relative file paths are extracted."""
    refs = PreHydrationEngine().extract_references("Read ./src/main.rs and ~/config.toml")
    assert pairs(refs) == [("file", "./src/main.rs"), ("file", "~/config.toml")]


def test_extract_issues() -> None:
    """Issue numbers keep their ``#``."""
    refs = PreHydrationEngine().extract_references("Related to #42 and #100")
    assert pairs(refs) == [("issue", "#42"), ("issue", "#100")]


def test_extract_prs() -> None:
    """A PR reference yields one pr ref and, before it, the issue ref of its number."""
    refs = PreHydrationEngine().extract_references("See PR #55 for context")
    assert pairs(refs) == [("issue", "#55"), ("pr", "PR #55")]


def test_max_references_cap() -> None:
    """Extraction stops at ``max_references``."""
    refs = engine_with(max_references=2).extract_references("Issues #1, #2, #3, #4, #5")
    assert pairs(refs) == [("issue", "#1"), ("issue", "#2")]


def test_deduplication() -> None:
    """The same URL twice is extracted once."""
    refs = PreHydrationEngine().extract_references(
        "Visit https://example.com and again https://example.com"
    )
    assert pairs(refs) == [("url", "https://example.com")]


def test_empty_input() -> None:
    """Empty text has no references."""
    assert PreHydrationEngine().extract_references("") == []


def test_format_context_empty() -> None:
    """Nothing resolved formats to the empty string, even when references failed."""
    failed = [FailedReference(reference=url("https://x.io"), error="boom")]
    assert PreHydrationEngine.format_context(HydratedContext()) == ""
    assert PreHydrationEngine.format_context(HydratedContext(failed=failed)) == ""


def test_format_context_with_content() -> None:
    """One resolved URL formats exactly as Symbiont's (§11.6)."""
    resolved = ResolvedReference(
        reference=url("https://example.com"), content="Example content", token_estimate=4
    )
    text = PreHydrationEngine().format_context(HydratedContext(resolved=[resolved], total_tokens=4))
    assert text == (
        "[PRE_HYDRATED_CONTEXT]\nThe following references were resolved from the task input:"
        "\n\n--- https://example.com (url) ---\nExample content"
    )


def test_custom_patterns() -> None:
    """A custom pattern adds its own reference type."""
    engine = engine_with(custom_patterns=[ReferencePattern(ref_type="jira", pattern=r"[A-Z]+-\d+")])
    assert pairs(engine.extract_references("Check PROJ-123 for details")) == [("jira", "PROJ-123")]


def test_hydrate_empty_refs() -> None:
    """Hydrating no references calls nothing and returns an empty context."""
    resolver = FakeResolver()
    result = hydrate(engine_with(resolution_tools=URL_TOOLS), [], resolver)
    assert result == HydratedContext(resolved=[], failed=[], total_tokens=0)
    assert resolver.calls == []


def test_default_config() -> None:
    """The defaults are Symbiont's."""
    config = PreHydrationConfig()
    assert config.timeout == timedelta(seconds=15)
    assert config.max_references == 10
    assert config.max_context_tokens == 4000
    assert config.custom_patterns == []
    assert config.resolution_tools == {}


# ---- the pattern table (§11.2) ---------------------------------------------------------------

PATTERN_TABLE = [
    # url
    ("(https://x.io/a) <http://y.io/b> [http://z.io/c]", [
        ("url", "https://x.io/a"), ("url", "http://y.io/b"), ("url", "http://z.io/c")]),
    ("https://example.com/page#42.", [("url", "https://example.com/page#42."), ("issue", "#42")]),
    ('"https://q.io/x",', [("url", 'https://q.io/x",')]),
    ("HTTPS://EXAMPLE.COM/x", []),
    ("https://a.io https://a.io", [("url", "https://a.io")]),
    ("https://x.io/a/b.rs", [("url", "https://x.io/a/b.rs")]),
    # file: matches
    ("see ./src/main.rs", [("file", "./src/main.rs")]),
    ("see ~/config.toml", [("file", "~/config.toml")]),
    ("see ~/.bashrc", [("file", "~/.bashrc")]),
    ("see ../up/one.py", [("file", "../up/one.py")]),
    ("see .hidden.txt", [("file", ".hidden.txt")]),
    ("see /etc/hosts.conf", [("file", "/etc/hosts.conf")]),
    ("see ./x.tar.gz", [("file", "./x.tar.gz")]),
    ("./start.rs is first", [("file", "./start.rs")]),
    ("after a newline\n./n.rs", [("file", "./n.rs")]),
    ("after a tab\t./t.rs", [("file", "./t.rs")]),
    ("see ./src/main.rs.", [("file", "./src/main.rs")]),
    ("see ./b.rs,", [("file", "./b.rs")]),
    # file: no match
    ("see /etc/passwd", []),
    ("see src/lib.rs", []),
    ("see (./a.rs)", []),
    ("see ./dir/", []),
    ("see .x", []),
    ("see ./naïve.rs", []),
    # issue
    ("#42", [("issue", "#42")]),
    ("#1#2", [("issue", "#1"), ("issue", "#2")]),
    ("#3a", [("issue", "#3")]),
    # pr
    ("SPR #5", [("issue", "#5"), ("pr", "PR #5")]),
    ("pr#12", [("issue", "#12"), ("pr", "pr#12")]),
    ("Pr #13", [("issue", "#13"), ("pr", "Pr #13")]),
    ("PR  #7", [("issue", "#7"), ("pr", "PR  #7")]),
    ("PR\n#8", [("issue", "#8"), ("pr", "PR\n#8")]),
    ("pr #12 and pr#12", [("issue", "#12"), ("pr", "pr #12"), ("pr", "pr#12")]),
    # type order: url, file, issue, pr, whatever the position in the text
    ("PR #9 in ./a.rs, see https://h.io", [
        ("url", "https://h.io"), ("file", "./a.rs"), ("issue", "#9"), ("pr", "PR #9")]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), PATTERN_TABLE)
def test_pattern_table(text: str, expected: list[tuple[str, str]]) -> None:
    """Each built-in pattern matches and misses exactly as §11.2 lists."""
    assert pairs(PreHydrationEngine().extract_references(text)) == expected


def test_custom_pattern_capture_groups_are_ignored() -> None:
    """The whole match is the value, not the capture group."""
    engine = engine_with(custom_patterns=[ReferencePattern(ref_type="jira", pattern=r"JIRA:(\w+)")])
    assert pairs(engine.extract_references("see JIRA:ABC")) == [("jira", "JIRA:ABC")]


def test_custom_pattern_does_not_refind_a_url() -> None:
    """Dedup is global by value: a custom pattern re-finding a URL is dropped, url wins."""
    engine = engine_with(
        custom_patterns=[ReferencePattern(ref_type="link", pattern=r"https?://\S+")]
    )
    assert pairs(engine.extract_references("go to https://a.io now")) == [("url", "https://a.io")]


def test_max_references_zero_extracts_nothing() -> None:
    """``max_references=0`` yields no reference (Symbiont returns one)."""
    assert engine_with(max_references=0).extract_references("https://a.io #1 ./b.rs") == []


def test_max_references_stops_after_urls_first() -> None:
    """The cap keeps earlier types first: URLs before files before issues."""
    refs = engine_with(max_references=2).extract_references("#1 ./a.rs https://a.io")
    assert pairs(refs) == [("url", "https://a.io"), ("file", "./a.rs")]


def test_invalid_custom_regex_fails_validation() -> None:
    """An invalid custom regex fails the config's validation, naming the type, regex and fix."""
    bad = ReferencePattern(ref_type="jira", pattern=r"JIRA-(\d+")
    with pytest.raises(ValidationError) as caught:
        PreHydrationConfig(custom_patterns=[bad])
    assert (
        "pattern 0 ('jira'): the pattern 'JIRA-(\\\\d+' cannot be used: it is not valid RE2 "
        "syntax (RE2: missing ): JIRA-(\\d+); fix the pattern"
    ) in str(caught.value)


def test_unvalidated_invalid_custom_regex_is_a_config_error() -> None:
    """A config built without validation still fails engine construction with a ConfigError."""
    bad = ReferencePattern(ref_type="jira", pattern="(unclosed")
    config = PreHydrationConfig.model_construct(custom_patterns=[bad])
    with pytest.raises(ConfigError, match=r"^pre_hydration.custom_patterns: pattern 'jira': the "):
        PreHydrationEngine(config)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(?<=JIRA-)\d+", "it has a lookaround"),
        (r"(\w)\1", "it has a backreference"),
        (r"end\Z", "RE2 writes the end of the text as \\z"),
    ],
)
def test_patterns_re2_cannot_take_are_refused(pattern: str, why: str) -> None:
    """Python-only syntax in a custom pattern is refused with what RE2 lacks and the fix."""
    with pytest.raises(ValidationError, match=re.escape(why)):
        PreHydrationConfig(custom_patterns=[ReferencePattern(ref_type="x", pattern=pattern)])


@pytest.mark.timeout(10)
def test_catastrophic_custom_pattern_runs_in_linear_time() -> None:
    """``(a+)+$`` against 34 a's and a '!' (issue 12, item 1) returns at once, matching nothing."""
    engine = engine_with(custom_patterns=[ReferencePattern(ref_type="x", pattern="(a+)+$")])
    started = time.monotonic()
    refs = engine.extract_references("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!")
    assert refs == []
    assert time.monotonic() - started < 2
    assert pairs(engine.extract_references("x aaaa")) == [("x", "aaaa")]


def test_extraction_looks_at_a_bounded_number_of_matches() -> None:
    """A pattern is read up to MAX_MATCHES_PER_PATTERN matches: a later new value is not seen."""
    engine = engine_with(custom_patterns=[ReferencePattern(ref_type="x", pattern="[ab]")])
    text = "a" * MAX_MATCHES_PER_PATTERN + "b"
    assert pairs(engine.extract_references(text)) == [("x", "a")]
    assert pairs(engine.extract_references(text[1:])) == [("x", "a"), ("x", "b")]


def test_too_many_custom_patterns_fail_validation() -> None:
    """More than MAX_CUSTOM_PATTERNS custom patterns are refused."""
    many = [ReferencePattern(ref_type="x", pattern="a")] * (MAX_CUSTOM_PATTERNS + 1)
    with pytest.raises(ValidationError, match=f"at most {MAX_CUSTOM_PATTERNS} items"):
        PreHydrationConfig(custom_patterns=many)


# ---- hydrate ---------------------------------------------------------------------------------


def test_hydrate_resolves_real_references() -> None:
    """Each reference is resolved by its type's tool with ``{"input": value}`` and its call id."""
    engine = engine_with(resolution_tools={"url": "web_fetch", "file": "read_file"})
    refs = engine.extract_references("Read ./src/main.rs and https://example.com")
    resolver = FakeResolver({"https://example.com": "Example page", "./src/main.rs": "fn main"})
    result = hydrate(engine, refs, resolver)
    assert sorted(resolver.calls) == [
        ("prehydrate_0", "web_fetch", {"input": "https://example.com"}),
        ("prehydrate_1", "read_file", {"input": "./src/main.rs"}),
    ]
    assert result == HydratedContext(
        resolved=[
            ResolvedReference(reference=refs[0], content="Example page", token_estimate=3),
            ResolvedReference(reference=refs[1], content="fn main", token_estimate=1),
        ],
        total_tokens=4,
    )


def test_budget_worked_example() -> None:
    """Budget 10 tokens, contents 20/30/8 chars: whole, truncated, exhausted; total 13 (§11.5)."""
    refs = [url("https://a.io"), url("https://b.io"), url("https://c.io")]
    contents = {"https://a.io": "a" * 20, "https://b.io": "b" * 30, "https://c.io": "c" * 8}
    engine = engine_with(resolution_tools=URL_TOOLS, max_context_tokens=10)
    result = hydrate(engine, refs, FakeResolver(contents))
    assert result.resolved == [
        ResolvedReference(reference=refs[0], content="a" * 20, token_estimate=5),
        ResolvedReference(
            reference=refs[1], content="b" * 20 + TRUNCATION_MARKER, token_estimate=8
        ),
    ]
    assert result.failed == [FailedReference(reference=refs[2], error="Token budget exhausted")]
    assert result.total_tokens == 13


def test_truncation_never_splits_a_multibyte_character() -> None:
    """A 4-byte budget on "€€" (6 bytes) keeps one whole "€" plus the marker (Symbiont panics)."""
    engine = engine_with(resolution_tools=URL_TOOLS, max_context_tokens=1)
    result = hydrate(engine, [url("https://e.io")], FakeResolver({"https://e.io": "€€"}))
    assert result.resolved[0].content == "€" + TRUNCATION_MARKER
    assert result.resolved[0].token_estimate == (3 + len(TRUNCATION_MARKER)) // 4
    assert result.total_tokens == 4


def test_budget_counts_utf8_bytes() -> None:
    """Budget and estimate count UTF-8 bytes: "é" * 4 is 8 bytes, 2 tokens."""
    engine = engine_with(resolution_tools=URL_TOOLS)
    result = hydrate(engine, [url("https://e.io")], FakeResolver({"https://e.io": "éééé"}))
    assert result.resolved[0].token_estimate == 2


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_truncate_utf8_is_the_longest_whole_character_prefix(text: str, max_bytes: int) -> None:
    """``truncate_utf8`` returns the longest prefix of whole characters within the byte limit."""
    cut = truncate_utf8(text, max_bytes)
    encoded = len(cut.encode("utf-8", "surrogatepass"))
    assert text.startswith(cut)
    assert encoded <= max_bytes
    if cut != text:
        assert len(text[: len(cut) + 1].encode("utf-8", "surrogatepass")) > max_bytes


def test_timeout_fails_only_unresolved_references() -> None:
    """On timeout the finished references are kept and only the slow one fails."""
    refs = [url("https://fast.io"), url("https://slow.io"), url("https://quick.io")]
    resolver = FakeResolver(delays={"https://slow.io": 30.0})
    engine = engine_with(resolution_tools=URL_TOOLS, timeout="200ms")
    started = time.perf_counter()
    result = hydrate(engine, refs, resolver)
    assert time.perf_counter() - started < 5.0
    assert [r.reference for r in result.resolved] == [refs[0], refs[2]]
    assert result.failed == [
        FailedReference(reference=refs[1], error="Resolution timed out after 200ms")
    ]
    assert resolver.cancelled == ["prehydrate_1"]


def test_zero_timeout_fails_every_pending_reference() -> None:
    """A zero timeout fails a pending reference, naming the duration in the message."""
    engine = engine_with(resolution_tools=URL_TOOLS, timeout=0)
    result = hydrate(engine, [url("https://a.io")], FakeResolver(default_delay=30.0))
    assert result.failed == [
        FailedReference(reference=url("https://a.io"), error="Resolution timed out after 0s")
    ]


def test_reference_without_tool_fails_explicitly() -> None:
    """A reference type with no tool is reported failed, next to resolved ones (not dropped)."""
    engine = engine_with(resolution_tools=URL_TOOLS)
    refs = engine.extract_references("See https://a.io and #7")
    resolver = FakeResolver()
    result = hydrate(engine, refs, resolver)
    assert [r.reference for r in result.resolved] == [url("https://a.io")]
    assert result.failed == [
        FailedReference(
            reference=ExtractedReference(ref_type="issue", value="#7"),
            error="No resolution tool configured for reference type 'issue'",
        )
    ]
    assert [call[0] for call in resolver.calls] == ["prehydrate_0"]


def test_no_tool_at_all_fails_every_reference_without_calls() -> None:
    """With no tools configured, every reference fails and the resolver is never called."""
    engine = PreHydrationEngine()
    refs = engine.extract_references("https://a.io #7")
    resolver = FakeResolver()
    result = hydrate(engine, refs, resolver)
    assert [f.error for f in result.failed] == [
        "No resolution tool configured for reference type 'url'",
        "No resolution tool configured for reference type 'issue'",
    ]
    assert result.resolved == []
    assert resolver.calls == []


def test_results_are_paired_by_call_id_when_answers_arrive_out_of_order() -> None:
    """Answers that complete in reverse order still land on their own references."""
    refs = [url(f"https://{n}.io") for n in range(4)]
    delays = {ref.value: 0.05 * (4 - i) for i, ref in enumerate(refs)}
    resolver = FakeResolver(delays=delays)
    result = hydrate(engine_with(resolution_tools=URL_TOOLS), refs, resolver)
    assert resolver.finished == ["prehydrate_3", "prehydrate_2", "prehydrate_1", "prehydrate_0"]
    assert [(r.reference.value, r.content) for r in result.resolved] == [
        (ref.value, f"<{ref.value}>") for ref in refs
    ]


def test_answer_with_a_foreign_call_id_is_not_paired() -> None:
    """An answer carrying another call id is not attached to the reference that was asked."""

    class WrongIdResolver:
        async def resolve(
            self, call_id: str, tool_name: str, arguments: dict[str, Any]
        ) -> ResolutionResult:
            return ResolutionResult(call_id="unknown", content="stray")

    result = hydrate(
        engine_with(resolution_tools=URL_TOOLS), [url("https://a.io")], WrongIdResolver()
    )
    assert result.failed == [
        FailedReference(
            reference=url("https://a.io"),
            error="The resolver returned no result for call id 'prehydrate_0'",
        )
    ]


def test_call_ids_index_all_references() -> None:
    """Call ids count every reference, so a reference without a tool leaves a gap."""
    engine = engine_with(resolution_tools={"issue": "get_issue"})
    refs = engine.extract_references("https://a.io #1")
    resolver = FakeResolver()
    hydrate(engine, refs, resolver)
    assert resolver.calls == [("prehydrate_1", "get_issue", {"input": "#1"})]


def test_resolutions_run_concurrently() -> None:
    """Ten resolutions of 0.2 s each finish in about 0.2 s, not 2 s."""
    engine = engine_with(resolution_tools={"issue": "get_issue"})
    refs = engine.extract_references(" ".join(f"#{n}" for n in range(1, 11)))
    assert len(refs) == 10
    started = time.perf_counter()
    result = hydrate(engine, refs, FakeResolver(default_delay=0.2))
    assert time.perf_counter() - started < 1.0
    assert len(result.resolved) == 10


def test_error_results_fail_and_use_no_budget() -> None:
    """An error answer fails its reference with the error text and costs no tokens."""
    refs = [url("https://bad.io"), url("https://ok.io")]
    resolver = FakeResolver({"https://ok.io": "x" * 40}, errors={"https://bad.io": "HTTP 404"})
    result = hydrate(engine_with(resolution_tools=URL_TOOLS, max_context_tokens=10), refs, resolver)
    assert result.failed == [FailedReference(reference=refs[0], error="HTTP 404")]
    assert result.resolved == [
        ResolvedReference(reference=refs[1], content="x" * 40, token_estimate=10)
    ]


def test_errors_after_the_budget_keep_their_own_reason() -> None:
    """After the budget is spent, resolved refs fail for the budget; errors keep their reason."""
    refs = [url("https://big.io"), url("https://bad.io"), url("https://ok.io")]
    resolver = FakeResolver({"https://big.io": "x" * 100}, errors={"https://bad.io": "HTTP 500"})
    result = hydrate(engine_with(resolution_tools=URL_TOOLS, max_context_tokens=10), refs, resolver)
    assert [r.reference for r in result.resolved] == [refs[0]]
    assert result.failed == [
        FailedReference(reference=refs[1], error="HTTP 500"),
        FailedReference(reference=refs[2], error="Token budget exhausted"),
    ]


def test_zero_token_budget_keeps_nothing() -> None:
    """``max_context_tokens=0`` fails every resolved reference for the budget."""
    engine = engine_with(resolution_tools=URL_TOOLS, max_context_tokens=0)
    result = hydrate(engine, [url("https://a.io")], FakeResolver())
    assert result.resolved == []
    assert result.failed == [
        FailedReference(reference=url("https://a.io"), error="Token budget exhausted")
    ]


def test_resolver_exception_fails_only_its_reference() -> None:
    """A resolver that raises fails its own reference; the others still resolve."""

    class FlakyResolver:
        async def resolve(
            self, call_id: str, tool_name: str, arguments: dict[str, Any]
        ) -> ResolutionResult:
            if arguments["input"] == "https://bad.io":
                raise RuntimeError("connection reset")
            return ResolutionResult(call_id=call_id, content="fine")

    refs = [url("https://bad.io"), url("https://ok.io")]
    result = hydrate(engine_with(resolution_tools=URL_TOOLS), refs, FlakyResolver())
    assert result.failed == [
        FailedReference(reference=refs[0], error="Resolver failed: RuntimeError: connection reset")
    ]
    assert [r.content for r in result.resolved] == ["fine"]


def test_function_resolver_wraps_a_plain_async_callable() -> None:
    """``FunctionResolver`` turns return values into content and exceptions into errors."""

    async def fetch(tool_name: str, arguments: dict[str, Any]) -> str:
        if arguments["input"] == "https://bad.io":
            raise ValueError("no such host")
        return f"{tool_name}:{arguments['input']}"

    resolver = FunctionResolver(fetch)
    assert isinstance(resolver, ReferenceResolver)
    refs = [url("https://ok.io"), url("https://bad.io")]
    result = hydrate(engine_with(resolution_tools=URL_TOOLS), refs, resolver)
    assert [r.content for r in result.resolved] == ["web_fetch:https://ok.io"]
    assert [f.error for f in result.failed] == ["ValueError: no such host"]


# ---- format and event ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failed", "footer"),
    [
        (1, "\n\n(1 reference could not be resolved)"),
        (2, "\n\n(2 references could not be resolved)"),
    ],
)
def test_format_context_footer_singular_and_plural(failed: int, footer: str) -> None:
    """The footer counts failures in the singular for one, the plural otherwise."""
    resolved = [ResolvedReference(reference=url("https://a.io"), content="A", token_estimate=0)]
    failures = [FailedReference(reference=url(f"https://{n}.io"), error="x") for n in range(failed)]
    text = PreHydrationEngine.format_context(HydratedContext(resolved=resolved, failed=failures))
    assert text.endswith("--- https://a.io (url) ---\nA" + footer)


def test_format_context_lists_resolved_in_order() -> None:
    """Several resolved references each get a header line then their content."""
    resolved = [
        ResolvedReference(reference=url("https://a.io"), content="A", token_estimate=0),
        ResolvedReference(
            reference=ExtractedReference(ref_type="file", value="./b.rs"),
            content="B\nB2",
            token_estimate=1,
        ),
    ]
    text = PreHydrationEngine.format_context(HydratedContext(resolved=resolved))
    assert text.split("\n")[2:] == [
        "",
        "--- https://a.io (url) ---",
        "A",
        "",
        "--- ./b.rs (file) ---",
        "B",
        "B2",
    ]


def test_completion_event_counts_every_reference() -> None:
    """The PreHydrationComplete event counts found, resolved, failed and tokens, and names
    each failed reference with its reason."""
    refs = [url("https://a.io"), url("https://b.io")]
    resolver = FakeResolver({"https://a.io": "a" * 8}, errors={"https://b.io": "nope"})
    result = hydrate(engine_with(resolution_tools=URL_TOOLS), refs, resolver)
    assert result.completion_event() == PreHydrationComplete(
        references_found=2,
        references_resolved=1,
        references_failed=1,
        total_tokens=2,
        failures=[ReferenceFailure(ref_type="url", reference="https://b.io", error="nope")],
    )


def test_completion_event_redacts_and_caps_the_reasons() -> None:
    """A failure's reason is redacted with the given redactor and capped."""
    secret = "sk-live-0123456789abcdefXYZ"
    refs = [url("https://b.io")]
    reason = f"401 for key {secret} " + "x" * (JOURNAL_TEXT_CHARS * 2)
    resolver = FakeResolver({}, errors={"https://b.io": reason})
    result = hydrate(engine_with(resolution_tools=URL_TOOLS), refs, resolver)
    (failure,) = result.completion_event(Redactor([secret])).failures
    assert secret not in failure.error and REDACTED in failure.error
    assert len(failure.error) == JOURNAL_TEXT_CHARS


def test_hydrated_context_json_round_trip() -> None:
    """A hydrated context survives a JSON round trip unchanged."""
    result = hydrate(
        engine_with(resolution_tools=URL_TOOLS),
        [url("https://a.io"), ExtractedReference(ref_type="issue", value="#1")],
        FakeResolver(),
    )
    assert HydratedContext.model_validate_json(result.model_dump_json()) == result
