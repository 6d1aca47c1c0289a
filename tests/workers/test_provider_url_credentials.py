"""A base URL's credentials (``user:password@``, ``?api-key=...``) never reach an error or a log.

Both wires, against the fake model servers: a 500 through the retries, a timeout, a reply that
is not JSON, a refused connection, a 404 and a server echoing the URL it was called with. The
credentials still reach the server (the query as written, the userinfo as Basic auth).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.errors import ConfigError
from shared.inference import InferenceOptions
from shared.redaction import redact_url, redact_urls, url_secrets
from tests.fakes.llm_server import (
    FakeAnthropicServer,
    FakeLLMServer,
    FakeOpenAIServer,
    RecordingSleep,
)
from workers.providers import (
    AnthropicProvider,
    InferenceError,
    InferenceProvider,
    InferenceTimeoutError,
    InvalidRequestError,
    ModelUnavailableError,
    OpenAICompatProvider,
    ProviderError,
    ResponseParseError,
    RetryPolicy,
)

PASSWORD = "secretpw"
QUERY_KEY = "secretkey"
SECRETS = (PASSWORD, QUERY_KEY)
ANTHROPIC_KEY = "sk-ant-url-test-key-0123456789"


def credentialed(port: int) -> str:
    """The base URL under test: a user and password, and a key in the query."""
    return f"http://user:{PASSWORD}@127.0.0.1:{port}/v1?api-key={QUERY_KEY}"


@dataclass
class Wire:
    """A fake server of one wire format and the matching provider on a credentialed URL."""

    name: str
    server: FakeLLMServer
    sleep: RecordingSleep
    build: Callable[..., InferenceProvider]
    key: str | None

    def provider(self, port: int | None = None, **kwargs: Any) -> InferenceProvider:
        options: dict[str, Any] = {
            "base_url": credentialed(self.server.port if port is None else port),
            "api_key": self.key,
            "sleep": self.sleep,
            "rand": lambda: 0.0,
            "retry": RetryPolicy(max_retries=1),
        }
        options.update(kwargs)
        return self.build(**options)


@pytest.fixture(params=["openai", "anthropic"])
def wire(request: pytest.FixtureRequest) -> Iterator[Wire]:
    """The OpenAI wire without a key (a local server: the userinfo goes as Basic auth, which
    an ``Authorization: Bearer`` key would exclude), the Anthropic wire with its key."""
    if request.param == "openai":
        with FakeOpenAIServer() as server:
            yield Wire("openai", server, RecordingSleep(), OpenAICompatProvider, None)
    else:
        with FakeAnthropicServer(api_key=ANTHROPIC_KEY) as server:
            yield Wire("anthropic", server, RecordingSleep(), AnthropicProvider, ANTHROPIC_KEY)
    assert not server.errors, server.errors


def fails(provider: InferenceProvider, error: type[InferenceError]) -> str:
    """The text of the error one completion raises (message and repr), which must be
    ``error`` and show neither secret of the URL."""
    conversation = Conversation(messages=[ConversationMessage.user("hi")])
    with pytest.raises(error) as caught:
        asyncio.run(provider.complete(conversation, InferenceOptions()))
    shown = f"{caught.value} {caught.value!r}"
    assert_clean(shown)
    return shown


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


def assert_logs_clean(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert_clean(record.getMessage())
        assert_clean(str(vars(record)))
    assert_clean(caplog.text)


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_500_through_the_retries_hides_the_url_credentials(
    wire: Wire, caplog: pytest.LogCaptureFixture
) -> None:
    """The error and the retry log name the host and path, never the password or the key;
    the server got both (the key in the query, the user and password as Basic auth)."""
    for _ in range(2):
        wire.server.respond_error(500, "upstream down")
    with caplog.at_level(logging.DEBUG):
        shown = fails(wire.provider(), ProviderError)
    assert f"127.0.0.1:{wire.server.port}/v1/" in shown
    assert "HTTP 500" in shown
    assert [r for r in caplog.records if r.getMessage() == "inference.retry"]
    assert_logs_clean(caplog)
    request = wire.server.last_request
    assert request.path.endswith(f"?api-key={QUERY_KEY}")
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert request.headers["authorization"] == f"Basic {basic}"


def test_a_timeout_hides_the_url_credentials(wire: Wire) -> None:
    wire.server.respond_json({}, delay_s=5.0)
    shown = fails(wire.provider(timeout_s=0.2), InferenceTimeoutError)
    assert "within 0.2 s" in shown
    assert f"127.0.0.1:{wire.server.port}" in shown


def test_an_unparsable_reply_hides_the_url_credentials(wire: Wire) -> None:
    wire.server.respond_raw("<html>proxy login page</html>")
    shown = fails(wire.provider(), ResponseParseError)
    assert "not JSON" in shown
    assert f"127.0.0.1:{wire.server.port}" in shown


def test_a_refused_connection_hides_the_url_credentials(
    wire: Wire, caplog: pytest.LogCaptureFixture
) -> None:
    port = closed_port()
    with caplog.at_level(logging.DEBUG):
        shown = fails(wire.provider(port=port), ProviderError)
    assert "could not reach" in shown
    assert f"127.0.0.1:{port}" in shown
    assert wire.sleep.delays == [0.5]
    assert_logs_clean(caplog)


def test_a_404_hides_the_url_credentials_of_base_url_and_called_url(wire: Wire) -> None:
    wire.server.respond_error(404, "no such model")
    shown = fails(wire.provider(), ModelUnavailableError)
    assert f"127.0.0.1:{wire.server.port}/v1?***" in shown  # the base URL, its query hidden


def test_a_server_echoing_the_url_it_was_called_with_is_redacted(wire: Wire) -> None:
    """A server that quotes the request line (``POST /v1/...?api-key=...``) or the
    password: the base URL's secrets are redacted from its message like the API key."""
    wire.server.respond_error(
        400, f"Unknown parameter in POST /v1/x?api-key={QUERY_KEY} for user:{PASSWORD}"
    )
    shown = fails(wire.provider(), InvalidRequestError)
    assert "Unknown parameter in POST /v1/x?api-key=**********" in shown


def test_a_provider_repr_hides_the_url_credentials(wire: Wire) -> None:
    assert_clean(repr(wire.provider()))


def test_userinfo_with_a_bearer_key_is_a_config_error_without_the_credentials() -> None:
    """The OpenAI wire sends its key as ``Authorization: Bearer``: a base URL with
    ``user:password@`` cannot go with it (aiohttp refuses the pair), a ConfigError at once that
    says so, never a crash, and never quoting the password or the query's key."""
    with FakeOpenAIServer(api_key="sk-bearer-key-0123456789") as server:
        provider = OpenAICompatProvider(
            base_url=credentialed(server.port),
            api_key="sk-bearer-key-0123456789",
            retry=RetryPolicy(max_retries=3),
            sleep=RecordingSleep(),
        )
        conversation = Conversation(messages=[ConversationMessage.user("hi")])
        with pytest.raises(ConfigError) as caught:
            asyncio.run(provider.complete(conversation, InferenceOptions()))
        assert not server.requests
    assert "user:password@" in str(caught.value)
    assert "ORGA_BASE_URL" in str(caught.value)
    assert_clean(str(caught.value))


def test_a_base_url_query_goes_after_the_path() -> None:
    """``https://h/v1?api-key=k`` calls ``https://h/v1/chat/completions?api-key=k`` (the
    key was sent as ``k/chat/completions`` when the path was appended to the query)."""
    with FakeOpenAIServer() as server:
        server.respond_text("hello")
        provider = OpenAICompatProvider(
            base_url=f"http://127.0.0.1:{server.port}/v1/?api-key={QUERY_KEY}"
        )
        conversation = Conversation(messages=[ConversationMessage.user("hi")])
        response = asyncio.run(provider.complete(conversation, InferenceOptions()))
        assert response.content == "hello"
        assert server.last_request.path == f"/v1/chat/completions?api-key={QUERY_KEY}"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@127.0.0.1:8080/v1?api-key=k#frag", "http://127.0.0.1:8080/v1?***"),
        ("https://api.openai.com/v1", "https://api.openai.com/v1"),
        ("https://[::1]:8443/v1", "https://[::1]:8443/v1"),
        ("http://u:p@llm.test:99999/v1?key=k", "http://llm.test:99999/v1?***"),  # bad port
        ("http://u:p@[llm.test/v1?key=k", "http://[llm.test/v1?***"),  # open bracket
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_urls_in_a_text_and_url_secrets() -> None:
    text = "Cannot connect to 'http://a:b@h:1/x?key=s' via (http://q:w@proxy:3128)"
    assert redact_urls(text) == "Cannot connect to 'http://h:1/x?***' via (http://proxy:3128)"
    assert url_secrets(credentialed(1)) == [PASSWORD, QUERY_KEY]
    assert url_secrets("http://h/v1?api-version=2024-06-01") == []
    assert url_secrets("http://u:p%40ss@h/v1") == ["p@ss"]
