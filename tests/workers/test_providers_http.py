"""Retries, timeouts and error mapping, one suite run against both HTTP providers."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any
from urllib.parse import quote

import pytest
from pydantic import SecretStr

from shared.conversation import Conversation, ConversationMessage
from shared.errors import ConfigError
from shared.inference import InferenceOptions, InferenceResponse
from tests.fakes.llm_server import (
    FakeAnthropicServer,
    FakeLLMServer,
    FakeOpenAIServer,
    RecordingSleep,
    closed_port_url,
)
from workers.http_pool import pooled_session
from workers.providers import (
    AnthropicProvider,
    ContextOverflowError,
    InferenceError,
    InferenceProvider,
    InferenceTimeoutError,
    InvalidRequestError,
    ModelUnavailableError,
    OpenAICompatProvider,
    ProviderError,
    RateLimitedError,
    ResponseParseError,
    RetryPolicy,
)
from workers.providers._http import Endpoint

KEY = "sk-secret-test-key-9f8e7d6c5b4a"


@dataclass
class Harness:
    """A fake server of one wire format and a way to build the matching provider."""

    name: str
    server: FakeLLMServer
    sleep: RecordingSleep
    build: Callable[..., InferenceProvider]
    success_fixture: str

    def provider(self, **kwargs: Any) -> InferenceProvider:
        """A provider on the fake server, zero jitter, the recording sleep."""
        options: dict[str, Any] = {
            "base_url": self.server.base_url,
            "api_key": KEY,
            "sleep": self.sleep,
            "rand": lambda: 0.0,
        }
        options.update(kwargs)
        return self.build(**options)

    def respond_success(self) -> None:
        """Queue a normal text reply."""
        self.server.respond_fixture(self.success_fixture)


WIRES: dict[str, tuple[type[FakeLLMServer], Callable[..., InferenceProvider], str]] = {
    "openai": (FakeOpenAIServer, OpenAICompatProvider, "openai_text.json"),
    "anthropic": (FakeAnthropicServer, AnthropicProvider, "anthropic_text.json"),
}


@pytest.fixture(params=sorted(WIRES))
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Each HTTP provider with its fake server; the server must end without handler errors."""
    server_class, build, success_fixture = WIRES[request.param]
    with server_class(api_key=KEY) as server:
        yield Harness(request.param, server, RecordingSleep(), build, success_fixture)
    assert not server.errors, server.errors


def complete(
    provider: InferenceProvider, options: InferenceOptions | None = None
) -> InferenceResponse:
    """Run one completion synchronously."""
    conversation = Conversation(messages=[ConversationMessage.user("hi")])
    return asyncio.run(provider.complete(conversation, options or InferenceOptions()))


def failure(provider: InferenceProvider, error: type[InferenceError]) -> InferenceError:
    """The error one completion raises; it must be of type ``error`` and never show the key."""
    with pytest.raises(error) as caught:
        complete(provider)
    assert KEY not in str(caught.value)
    assert KEY not in repr(caught.value)
    return caught.value


# -- retries -------------------------------------------------------------------------------


def test_retry_after_seconds_is_honoured_through_the_injected_sleep(harness: Harness) -> None:
    """A 429 with ``Retry-After: 3`` waits 3 s (recorded, not slept), then succeeds."""
    harness.server.respond_rate_limited("3")
    harness.respond_success()
    response = complete(harness.provider())
    assert response.content
    assert harness.sleep.delays == [3.0]
    assert len(harness.server.requests) == 2


def test_retry_after_as_an_http_date_is_honoured(harness: Harness) -> None:
    """A Retry-After date about 20 s ahead waits about 20 s."""
    when = datetime.now(UTC) + timedelta(seconds=20)
    harness.server.respond_rate_limited(format_datetime(when, usegmt=True))
    harness.respond_success()
    complete(harness.provider())
    assert len(harness.sleep.delays) == 1
    assert 17.0 <= harness.sleep.delays[0] <= 20.0


def test_retry_after_is_capped(harness: Harness) -> None:
    """A Retry-After beyond the cap waits the cap."""
    harness.server.respond_rate_limited("3600")
    harness.respond_success()
    complete(harness.provider(retry=RetryPolicy(retry_after_cap_s=15)))
    assert harness.sleep.delays == [15.0]


def test_a_missing_retry_after_uses_the_backoff_not_a_long_wait(harness: Harness) -> None:
    """Without the header the waits are the exponential backoff 0.5, 1, 2 s (Symbiont: 1,000 s)."""
    for _ in range(3):
        harness.server.respond_rate_limited()
    harness.respond_success()
    complete(harness.provider())
    assert harness.sleep.delays == [0.5, 1.0, 2.0]


def test_backoff_adds_jitter(harness: Harness) -> None:
    """The jitter scales with the injected random number."""
    harness.server.respond_rate_limited()
    harness.respond_success()
    retry = RetryPolicy(backoff_base_s=1.0, jitter_s=0.4)
    complete(harness.provider(retry=retry, rand=lambda: 0.5))
    assert harness.sleep.delays == [pytest.approx(1.2)]


@pytest.mark.parametrize("status", [500, 502, 503, 529])
def test_server_errors_are_retried_then_succeed(harness: Harness, status: int) -> None:
    """5xx answers (Anthropic's 529 overloaded included) are retried with backoff."""
    harness.server.respond_error(status, "Overloaded")
    harness.server.respond_error(status, "Overloaded")
    harness.respond_success()
    assert complete(harness.provider()).content
    assert harness.sleep.delays == [0.5, 1.0]
    assert len(harness.server.requests) == 3


def test_exhausted_rate_limits_raise_rate_limited_with_the_next_wait(harness: Harness) -> None:
    """After max_retries 429s the error carries the wait the server asked for."""
    for _ in range(3):
        harness.server.respond_rate_limited("7")
    error = failure(harness.provider(retry=RetryPolicy(max_retries=2)), RateLimitedError)
    assert isinstance(error, RateLimitedError)
    assert error.retry_after_s == 7.0
    assert "HTTP 429" in str(error)
    assert "Rate limit reached" in str(error)
    assert harness.sleep.delays == [7.0, 7.0]
    assert len(harness.server.requests) == 3


def test_exhausted_rate_limits_without_header_report_the_backoff(harness: Harness) -> None:
    """Without Retry-After the error's retry_after_s is the next backoff delay."""
    for _ in range(2):
        harness.server.respond_rate_limited()
    error = failure(harness.provider(retry=RetryPolicy(max_retries=1)), RateLimitedError)
    assert isinstance(error, RateLimitedError)
    assert error.retry_after_s == 1.0


def test_exhausted_server_errors_raise_provider_error(harness: Harness) -> None:
    """Four 500s with the default three retries give ProviderError quoting the provider."""
    for _ in range(4):
        harness.server.respond_error(500, "The server had an error")
    error = failure(harness.provider(), ProviderError)
    assert "HTTP 500" in str(error)
    assert "The server had an error" in str(error)
    assert len(harness.server.requests) == 4
    assert len(harness.sleep.delays) == 3


def test_zero_retries_fails_at_once(harness: Harness) -> None:
    """With max_retries 0 a 503 is not retried and nothing sleeps."""
    harness.server.respond_error(503, "down")
    failure(harness.provider(retry=RetryPolicy(max_retries=0)), ProviderError)
    assert harness.sleep.delays == []
    assert len(harness.server.requests) == 1


def test_an_unreachable_server_is_retried_then_a_provider_error(harness: Harness) -> None:
    """A refused connection is retried like a 5xx, then says the server could not be reached."""
    provider = harness.provider(base_url=closed_port_url(), retry=RetryPolicy(max_retries=1))
    error = failure(provider, ProviderError)
    assert "could not reach" in str(error)
    assert "ORGA_BASE_URL" in str(error)
    assert harness.sleep.delays == [0.5]


def test_retries_are_logged_as_events_without_the_key(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Each retry logs ``inference.retry`` with the delay; no record contains the key."""
    harness.server.respond_rate_limited("2")
    harness.respond_success()
    with caplog.at_level(logging.DEBUG):
        complete(harness.provider())
    retries = [r for r in caplog.records if r.getMessage() == "inference.retry"]
    assert len(retries) == 1
    assert retries[0].__dict__["delay_s"] == 2.0
    for record in caplog.records:
        assert KEY not in record.getMessage()
        assert KEY not in str(record.__dict__)


# -- 4xx and bodies ------------------------------------------------------------------------


@pytest.mark.parametrize("base_url", ["http://[llm.test/v1", "http://llm.test:99999/v1"])
def test_a_malformed_base_url_is_a_config_error_at_once(harness: Harness, base_url: str) -> None:
    """A base URL aiohttp cannot parse (it passed the settings' scheme check) is the
    deployment's mistake, not an outage of the provider: a ConfigError naming the setting,
    never tried (an outage would be waited out again and again)."""
    with pytest.raises(ConfigError) as caught:  # refused when built
        harness.provider(base_url=base_url, retry=RetryPolicy(max_retries=3))
    assert "ORGA_BASE_URL" in str(caught.value)
    assert "llm.test" in str(caught.value)
    assert harness.sleep.delays == []


def test_a_base_url_without_a_host_is_a_config_error_at_the_call(harness: Harness) -> None:
    """``http:///v1`` parses, and aiohttp refuses it (no host): a ConfigError too, never
    retried."""
    provider = harness.provider(base_url="http:///v1", retry=RetryPolicy(max_retries=3))
    conversation = Conversation(messages=[ConversationMessage.user("hi")])
    with pytest.raises(ConfigError, match="ORGA_BASE_URL"):
        asyncio.run(provider.complete(conversation, InferenceOptions()))
    assert harness.sleep.delays == []


def test_a_400_is_an_invalid_request_with_the_provider_message(harness: Harness) -> None:
    """The provider's own message is extracted from the JSON error body; no retry."""
    fixture = f"{harness.name}_error_400.json"
    harness.server.respond_fixture(fixture, status=400)
    error = failure(harness.provider(), InvalidRequestError)
    assert "HTTP 400" in str(error)
    assert "temperature" in str(error)
    assert '{"' not in str(error)
    assert harness.sleep.delays == []


@pytest.mark.parametrize("status", [401, 403])
def test_a_rejected_key_names_the_variable_to_set(harness: Harness, status: int) -> None:
    """401/403 say the key was rejected and which variable sets it; the key is not printed."""
    harness.server.respond_error(status, "invalid x-api-key")
    error = failure(harness.provider(api_key_env="ORGA_API_KEY"), InvalidRequestError)
    assert "rejected the API key" in str(error)
    assert "set ORGA_API_KEY" in str(error)


def test_a_wrong_key_is_rejected_by_the_fake_server_like_the_real_one(harness: Harness) -> None:
    """The fake checks the key; the provider reports it as a rejected key."""
    error = failure(harness.provider(api_key="sk-wrong"), InvalidRequestError)
    assert "rejected the API key (HTTP 401)" in str(error)


def test_an_echoed_key_is_redacted(harness: Harness) -> None:
    """A provider that quotes the key back in its error body never gets it into the message."""
    harness.server.respond_error(400, f"bad request for key {KEY}")
    error = failure(harness.provider(), InvalidRequestError)
    assert "key **********" in str(error)


ESCAPED_KEY = 'sk-or/v1+ab"cd\\ef=='
"""A key holding the characters JSON escapes: a slash (optionally), a quote and a backslash."""


@pytest.fixture(params=sorted(WIRES))
def escaping_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Each HTTP provider with its fake server, whose key is ESCAPED_KEY."""
    server_class, build, success_fixture = WIRES[request.param]
    with server_class(api_key=ESCAPED_KEY) as server:
        yield Harness(request.param, server, RecordingSleep(), build, success_fixture)
    assert not server.errors, server.errors


def _escaped_failure(harness: Harness, body: str) -> str:
    """The message of the InvalidRequestError a 400 with ``body`` gives; no piece of the key."""
    harness.server.respond_raw(body, status=400)
    with pytest.raises(InvalidRequestError) as caught:
        complete(harness.provider(api_key=ESCAPED_KEY))
    message = str(caught.value)
    for piece in ("sk-or", "v1+ab", "cd", "ef=="):
        assert piece not in message, message
    assert "**********" in message
    return message


@pytest.mark.parametrize(
    "body",
    [
        # PHP and Java encoders escape '/': the echo sits in a field the provider does not read.
        r'{"errors": [{"reason": "invalid key sk-or\/v1+ab\"cd\\ef=="}]}',
        # Every character as \u, upper-case hex, in a body cut short (not JSON).
        r'{"detail": "key \u0073\u006B\u002D\u006F\u0072\u002F\u0076\u0031\u002B\u0061\u0062'
        r"\u0022\u0063\u0064\u005C\u0065\u0066\u003D\u003D is not valid",
        # JSON inside the provider's own message: escaped once more after decoding.
        json.dumps({"error": {"message": json.dumps({"key": ESCAPED_KEY}).replace("/", r"\/")}}),
    ],
)
def test_a_json_escaped_echo_of_the_key_is_redacted(escaping_harness: Harness, body: str) -> None:
    """A key echoed JSON-escaped (issue 12, item 17), at any nesting, never reaches a message."""
    _escaped_failure(escaping_harness, body)


@pytest.mark.parametrize(
    "echo",
    [
        json.dumps("sk-é😀/x"),  # ensure_ascii: \u00e9 and a surrogate pair
        r"sk-\u00E9\uD83D\uDE00\/x",  # upper-case hex, an escaped slash
        json.dumps("sk-é😀/x", ensure_ascii=False),
        json.dumps(json.dumps("sk-é😀/x")),
        "sk-%C3%A9%F0%9F%98%80%2Fx",  # percent-encoded in a quoted URL
    ],
)
def test_every_escaped_form_of_a_unicode_key_is_redacted(echo: str) -> None:
    """JSON escapes (either hex case, surrogate pairs, nested) and URL encoding are redacted."""
    endpoint = Endpoint("fake", "http://fake", "ORGA_API_KEY", SecretStr("sk-é😀/x"))
    redacted = endpoint.redact(f"bad key {echo}!")
    assert "é" not in redacted
    assert "00e9" not in redacted.lower()
    assert "C3" not in redacted
    assert "**********" in redacted


_PLAIN_KEY = "sk-ant-api03-Q7vX2mZp9LwK4tRb8NcY"


@pytest.mark.parametrize(
    "echo",
    [
        base64.b64encode(_PLAIN_KEY.encode()).decode(),
        base64.b64encode(f"Bearer {_PLAIN_KEY}".encode()).decode(),
        quote(f"{_PLAIN_KEY}/+=", safe=""),
        "".join(f"%{byte:02x}" for byte in _PLAIN_KEY.encode()),
        _PLAIN_KEY.encode().hex(),
        _PLAIN_KEY.upper(),
        _PLAIN_KEY[:16] + "...",
    ],
    ids=["base64", "base64-shifted", "percent", "percent-every-byte", "hex", "upper", "truncated"],
)
def test_an_encoded_or_cut_short_echo_of_the_key_is_redacted(echo: str) -> None:
    """Base64, percent-encoded, hex, upper-cased and truncated echoes never reach a message."""
    endpoint = Endpoint("fake", "http://fake", "ORGA_API_KEY", SecretStr(_PLAIN_KEY))
    redacted = endpoint.redact(f"bad key {echo}!")
    assert redacted.startswith("bad key ")
    assert "**********" in redacted
    assert _PLAIN_KEY[8:20].lower() not in redacted.lower()
    assert base64.b64encode(_PLAIN_KEY.encode()).decode()[8:20] not in redacted
    assert _PLAIN_KEY.encode().hex()[16:40] not in redacted.lower()


@pytest.mark.timeout(10)
def test_redaction_is_linear_on_a_hostile_body() -> None:
    """A body of 200 000 backslashes and near-misses is redacted at once (RE2, no backtracking)."""
    endpoint = Endpoint("fake", "http://fake", "ORGA_API_KEY", SecretStr(ESCAPED_KEY))
    body = "\\" * 200_000 + r"sk-or\/v1+ab" * 20_000
    started = time.monotonic()
    assert endpoint.redact(body) == body
    assert time.monotonic() - started < 2


def test_a_404_names_the_model_and_base_url(harness: Harness) -> None:
    """A 404 is ModelUnavailableError naming the model and where it was asked."""
    harness.server.respond_error(404, "model: claude-nope-1")
    error = failure(harness.provider(model="claude-nope-1"), ModelUnavailableError)
    assert "'claude-nope-1'" in str(error)
    assert harness.server.base_url in str(error)


@pytest.mark.parametrize(
    "fixture", ["openai_error_context_length.json", "anthropic_error_prompt_too_long.json"]
)
def test_context_length_errors_are_context_overflow(harness: Harness, fixture: str) -> None:
    """Context-length messages (OpenAI and Anthropic wording) give ContextOverflowError."""
    harness.server.respond_fixture(fixture, status=400)
    error = failure(harness.provider(), ContextOverflowError)
    assert "context window" in str(error)


def test_a_413_is_context_overflow(harness: Harness) -> None:
    """Request too large is a context overflow."""
    harness.server.respond_error(413, "Request exceeds the maximum allowed number of bytes.")
    failure(harness.provider(), ContextOverflowError)


def test_other_4xx_are_invalid_requests(harness: Harness) -> None:
    """A 422 is an invalid request, not retried."""
    harness.server.respond_error(422, "Unprocessable")
    error = failure(harness.provider(), InvalidRequestError)
    assert "HTTP 422" in str(error)
    assert len(harness.server.requests) == 1


def test_a_non_json_success_body_is_a_parse_error(harness: Harness) -> None:
    """A 200 with an HTML body is ResponseParseError quoting its start."""
    harness.server.respond_raw("<html>Bad gateway page</html>")
    error = failure(harness.provider(), ResponseParseError)
    assert "not JSON" in str(error)
    assert "<html>Bad gateway page" in str(error)


def test_a_json_array_body_is_a_parse_error(harness: Harness) -> None:
    """A JSON body that is not an object is ResponseParseError."""
    harness.server.respond_json([1, 2])
    error = failure(harness.provider(), ResponseParseError)
    assert "expected an object" in str(error)


def test_a_non_json_error_body_is_quoted(harness: Harness) -> None:
    """A 502 HTML page from a proxy is retried, then quoted in the ProviderError."""
    for _ in range(2):
        harness.server.respond_raw("<h1>502 Bad Gateway</h1>", status=502)
    error = failure(harness.provider(retry=RetryPolicy(max_retries=1)), ProviderError)
    assert "502 Bad Gateway" in str(error)


def test_a_slow_answer_is_a_timeout(harness: Harness) -> None:
    """No answer within timeout_s gives InferenceTimeoutError at once, without retries."""
    harness.server.respond_json({}, delay_s=5.0)
    started = time.monotonic()
    error = failure(harness.provider(timeout_s=0.2), InferenceTimeoutError)
    assert time.monotonic() - started < 2.0
    assert "within 0.2 s" in str(error)
    assert harness.sleep.delays == []
    assert len(harness.server.requests) == 1


def test_a_shared_session_is_used_and_left_open(harness: Harness) -> None:
    """A caller's aiohttp session (the worker's pooled one) serves the calls over one kept-alive
    connection and is not closed by the provider."""
    harness.respond_success()
    harness.respond_success()

    async def two_calls() -> bool:
        session = pooled_session(8)
        try:
            provider = harness.provider(session=session)
            conversation = Conversation(messages=[ConversationMessage.user("hi")])
            await provider.complete(conversation, InferenceOptions())
            await provider.complete(conversation, InferenceOptions())
            return session.closed
        finally:
            await session.close()

    assert asyncio.run(two_calls()) is False
    assert len(harness.server.requests) == 2


def test_a_redirect_is_not_followed_and_the_key_stays(harness: Harness) -> None:
    """A 307 to another host is an invalid request naming the status; nothing is sent there."""
    with type(harness.server)(api_key=KEY) as elsewhere:
        harness.server.respond_json(
            {"error": {"message": "moved"}},
            status=307,
            headers={"location": f"{elsewhere.base_url}/chat/completions"},
        )
        error = failure(harness.provider(), InvalidRequestError)
        assert "HTTP 307" in str(error)
        assert elsewhere.requests == []
    assert len(harness.server.requests) == 1


def test_a_session_on_the_fake_server_sees_the_headers_once(harness: Harness) -> None:
    """The request carries the provider's headers as given (one content type, JSON body)."""
    harness.respond_success()
    complete(harness.provider())
    request = harness.server.last_request
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.raw_body) == request.body
