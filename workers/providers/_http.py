"""One JSON-over-HTTP implementation for every HTTP provider: timeouts, retries, error mapping.

The providers build a body and parse a reply; everything between (the client, the retry loop,
``Retry-After``, turning statuses into the ``InferenceError`` tree) lives here, once. The
client is aiohttp: the worker process's one ``ClientSession`` (:mod:`workers.http_pool`).

Status mapping after the retries:

====================  ==========================================================
429                   ``RateLimitedError`` (``retry_after_s`` = the next wait)
5xx                   ``ProviderError``
400, other 4xx        ``InvalidRequestError``, or ``ContextOverflowError`` when the
                      provider's message is about the context length
401, 403              ``AuthenticationError``: the key was rejected, set <env var>
404                   ``ModelUnavailableError`` naming the model and the base URL
413                   ``ContextOverflowError``
timeout               ``InferenceTimeoutError``: no complete answer within ``timeout_s``
                      (a deadline per attempt); not retried, the wait was long
connection failure    retried like a 5xx, then ``ProviderError``
URL not parsable      ``ConfigError`` naming ORGA_BASE_URL, at once (not an outage)
URL with user:pass@   ``ConfigError`` too, when the provider sends its key in an
                      ``Authorization`` header (OpenAI-compatible): the two cannot go
                      together (the Anthropic wire sends them as Basic auth, its key in
                      ``x-api-key``)
2xx, body not JSON    ``ResponseParseError``
2xx, body too large   ``ResponseParseError``: more than ``max_body_bytes`` (64 MiB;
                      a stream counts all its bytes), refused as it comes in
====================  ==========================================================

An error answer's body is read up to that limit too (what is past it is dropped, the
connection closed): a 500 whose body never ends is a ``ProviderError``, not a timeout.

The API key never reaches a message: it lives in a ``SecretStr``, the request headers are never
quoted, and any echo of the key in a provider's error body is replaced by ``**********``: as
written, in any case, percent-, hex- or base64-encoded, or cut short to 12 characters or more
(:mod:`shared.redaction`), and as JSON may escape it at any depth of nesting (``\\/``,
``\\"``, ``\\\\``, ``\\u00e9`` in either case of hex, surrogate pairs, JSON inside a JSON
string) or as a URL percent-encodes it. The pattern of those echoes is matched by RE2, in time
linear in the body.

A URL is never quoted whole: every error message and the retry log name the base URL, the
URL called, and any URL an aiohttp error quotes (a proxy named ``http://user:password@host``)
without its userinfo and with its query shown as ``***`` (``?api-key=...``)
(:func:`shared.redaction.redact_url`, :func:`without_credentials` for a text).
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import json
import logging
import random
import re
import reprlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import SecretStr

from shared.errors import ConfigError
from shared.inference import ProviderWait
from shared.redaction import REDACTED, Redactor, redact_url, redact_urls, url_secrets
from shared.safe_regex import UserPattern, compile_user_pattern
from workers.http_pool import SessionSource, env_proxy, shared_ssl_context
from workers.providers.base import (
    AuthenticationError,
    BaseUrlError,
    ContextOverflowError,
    InferenceError,
    InferenceTimeoutError,
    InvalidRequestError,
    ModelUnavailableError,
    ProviderError,
    RateLimitedError,
    ResponseParseError,
)
from workers.providers.rate_limit import NoThrottle, ProviderThrottle, record_wait
from workers.providers.retry import (
    RetryPolicy,
    SleepFn,
    is_retryable_status,
    parse_retry_after,
)
from workers.providers.waiting import wait_out

__all__ = [
    "MAX_BODY_BYTES",
    "Endpoint",
    "HttpAnswer",
    "JsonPoster",
    "StreamConsumer",
    "json_count",
    "json_error_message",
    "provider_error_message",
    "shown",
    "without_credentials",
]

_log = logging.getLogger(__name__)

_SNIPPET_CHARS = 500
MAX_BODY_BYTES = 64 * 1024 * 1024
"""The most an answer may hold, decompressed (a whole body, or all the lines of a stream): a
model's longest answer is a few MB, streamed perhaps 30 MB with each token's event; a body
past it is refused as it comes, never held (200 calls in flight share one process)."""
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 3
_SHOWN.maxdict = 6
_SHOWN.maxlist = 6
_SHOWN.maxstring = 120
_SHOWN.maxother = 120
_SHOWN.maxlong = 40
_REDACTED = REDACTED
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "reduce the length",
)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Who is called: what error messages name. The key, and the secrets the base URL carries
    (a password, an ``api-key`` query parameter), are only used to redact echoes of them."""

    provider: str
    base_url: str
    api_key_env: str
    api_key: SecretStr | None = None

    def url(self, path: str) -> str:
        """``base_url`` joined with ``path`` by exactly one slash (the query, if the base URL
        has one, stays after the path: ``https://h/v1?api-key=k`` gives
        ``https://h/v1/chat/completions?api-key=k``)."""
        base, has_query, query = self.base_url.partition("?")
        joined = f"{base.rstrip('/')}/{path.lstrip('/')}"
        return f"{joined}?{query}" if has_query else joined

    @property
    def shown_base_url(self) -> str:
        """``base_url`` as messages show it (:func:`shared.redaction.redact_url`)."""
        return redact_url(self.base_url)

    def redact(self, text: str) -> str:
        """``text`` with every occurrence of the API key and of the base URL's secrets
        (:func:`shared.redaction.url_secrets`), plain or escaped, replaced."""
        key = self.api_key.get_secret_value() if self.api_key is not None else ""
        for secret in (key, *_url_secrets_of(self.base_url)):
            if not secret:
                continue
            text = _redactor_of(secret).redact(text)
            echoes = _echoes_of(secret)
            text = echoes.sub(_REDACTED, text) if echoes is not None else text
        return text


@functools.lru_cache(maxsize=8)
def _url_secrets_of(base_url: str) -> tuple[str, ...]:
    """The base URL's secrets, found once per URL."""
    return tuple(url_secrets(base_url))


@functools.lru_cache(maxsize=32)
def _redactor_of(secret: str) -> Redactor:
    """The key's plain, upper/lower-cased, percent-, hex- and base64-encoded and cut-short
    echoes (:mod:`shared.redaction`), computed once per key."""
    return Redactor([secret])


_JSON_SHORT_ESCAPES = {'"': '"', "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_URL_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPE = r"\\+"  # one backslash per level of JSON nesting: \u00e9, \\\u00e9, ...
"""RE2 text of the backslashes that introduce a JSON escape, at any depth of nesting."""


@functools.lru_cache(maxsize=32)
def _echoes_of(secret: str) -> UserPattern | None:
    """An RE2 pattern of the key as an error body may echo it (escaped), or None.

    None when RE2 refuses the pattern (a very long key): plain echoes are still redacted. The
    refusal is dropped unread, since its message would quote the key.
    """
    pattern = "".join(_char_forms(char) for char in secret)
    try:
        return compile_user_pattern(pattern, where="api key", max_chars=len(pattern))
    except ConfigError:
        return None


def _char_forms(char: str) -> str:
    """RE2 alternatives for one character of the key: as is, JSON-escaped or percent-encoded."""
    literal = _ESCAPE if char == "\\" else re.escape(char)  # a backslash doubles per level
    utf16 = char.encode("utf-16-be", "surrogatepass")
    units = [utf16[i : i + 2].hex() for i in range(0, len(utf16), 2)]  # two for a surrogate pair
    forms = [literal, "".join(f"{_ESCAPE}u{_any_case(unit)}" for unit in units)]
    if char in _JSON_SHORT_ESCAPES:
        forms.append(_ESCAPE + re.escape(_JSON_SHORT_ESCAPES[char]))
    if char not in _URL_UNRESERVED:
        forms.append("".join(f"%{_any_case(f'{byte:02x}')}" for byte in _utf8(char)))
    return "(?:" + "|".join(forms) + ")"


def _utf8(char: str) -> bytes:
    """The UTF-8 bytes of ``char``; a lone surrogate (a key read from a non-UTF-8 environment)
    is kept, and the pattern holding it is then refused, leaving the plain redaction."""
    return char.encode("utf-8", "surrogatepass")


def _any_case(hex_digits: str) -> str:
    """RE2 text matching ``hex_digits`` in upper or lower case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in hex_digits)


StreamConsumer = Callable[[AsyncIterator[str]], Awaitable[dict[str, Any]]]
"""Reads the lines of a streamed 2xx answer into the JSON object a non-streamed one would be
(:class:`workers.providers.streaming.StreamReader`)."""


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A whole HTTP answer, read: what the status mapping and the JSON decoding look at."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    charset: str | None = None
    """The ``charset`` of the content type (None: UTF-8)."""

    @property
    def text(self) -> str:
        """The body as text, undecodable bytes replaced (a snippet for an error message)."""
        try:
            return self.body.decode(self.charset or "utf-8", errors="replace")
        except LookupError:  # a charset Python does not know
            return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not JSON)."""
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class _Request:
    """One POST: where, with which headers and body (JSON, encoded once for every try), for
    which model (named in errors); ``consume`` reads a streamed answer (None: one JSON body)."""

    url: str
    headers: dict[str, str]
    payload: bytes
    model: str
    consume: StreamConsumer | None = None


@dataclass(frozen=True, slots=True)
class _RetryableFailure:
    """An attempt that may be retried after ``delay_s``; ``error`` is raised if it may not.
    ``status`` is the HTTP status (0: no answer); ``retry_after``: the server set the delay."""

    delay_s: float
    error: InferenceError
    status: int = 0
    retry_after: bool = False


class JsonPoster:
    """POSTs a JSON body and returns the JSON object answered, with retries and clear errors.

    ``session`` is the process's ``aiohttp.ClientSession`` (:func:`workers.http_pool.
    pooled_session`), used as is and never closed (it belongs to the loop it was built on), or
    a :data:`~workers.http_pool.SessionSource` asked for it at each call. Without it a fresh
    session serves each call (safe across event loops, which a caller running ``asyncio.run``
    per call needs) and the call goes through the proxy the environment names
    (:func:`workers.http_pool.env_proxy`), as a fresh httpx client did.
    ``throttle`` is the rate limit shared with every caller of the same provider and key
    (:mod:`workers.providers.rate_limit`): each try waits for it, and a 429 extends it.

    Timeouts per try: ``timeout_s`` to get a connection (from the pool or a new one), between
    two reads of the answer, and for the whole try (``asyncio.timeout``, which also bounds a
    stream); redirects are not followed (a 3xx is an invalid request, and the key never
    leaves for another host). An answer is read up to ``max_body_bytes``
    (:data:`MAX_BODY_BYTES`): a 2xx body or stream past it is a ``ResponseParseError``, an
    error body past it is cut there.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout_s: float,
        retry: RetryPolicy,
        sleep: SleepFn,
        rand: Callable[[], float] | None = None,
        session: aiohttp.ClientSession | SessionSource | None = None,
        throttle: ProviderThrottle | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
        self._max_body_bytes = max_body_bytes
        self._endpoint = endpoint
        self._check_url("")  # a base URL that cannot be parsed is refused when built
        self._throttle: ProviderThrottle = throttle if throttle is not None else NoThrottle()
        self._clock = clock
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._http_timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
        )
        self._retry = retry
        self._sleep = sleep
        self._rand = rand if rand is not None else random.SystemRandom().random
        self._session: SessionSource | None = (
            functools.partial(_same, session)
            if isinstance(session, aiohttp.ClientSession)
            else session
        )
        self._proxy = env_proxy(endpoint.base_url) if session is None else None

    async def post(
        self,
        path: str,
        *,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        model: str,
        consume: StreamConsumer | None = None,
    ) -> dict[str, Any]:
        """The JSON object answered to ``POST {base_url}/{path}``, or an ``InferenceError``.

        With ``consume`` the answer is read as it streams (a ``text/event-stream`` 2xx); a
        server that answers one JSON body instead is read as without it."""
        # Encoded at once: the call holds its request body once (bytes), not its text as well.
        payload = json.dumps(
            body, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
        sent = dict(headers)
        if not any(name.lower() == "content-type" for name in sent):
            sent["content-type"] = "application/json"
        url = self._check_url(path)
        if _has_userinfo(url) and any(name.lower() == "authorization" for name in sent):
            raise self._bad_url(
                url,
                "it carries user:password@, which cannot be sent with the API key's "
                "Authorization header; remove it",
            )
        request = _Request(url, sent, payload, model, consume)
        started = self._clock()
        async with self._open_session() as session:
            attempt = 0
            while True:
                await self._wait_turn(started)
                outcome = await self._attempt(session, request, attempt)
                if not isinstance(outcome, _RetryableFailure):
                    return outcome
                if not self._retry.allows(attempt, self._clock() - started, outcome.delay_s):
                    raise outcome.error
                await self._back_off(request.url, attempt, outcome)
                attempt += 1

    def _check_url(self, path: str) -> str:
        """The URL of ``path``, or ConfigError when it cannot be parsed (a bad port, an open
        ``[``): the deployment's mistake, which retries (as an outage) would not mend."""
        url = self._endpoint.url(path)
        try:
            urlsplit(url).port  # noqa: B018 - parsed for its ValueError
        except ValueError as exc:
            raise self._bad_url(url, str(exc)) from None
        return url

    def _bad_url(self, url: str, why: str) -> BaseUrlError:
        return BaseUrlError(
            f"{self._endpoint.provider}: {redact_url(url)} is not a valid URL "
            f"({without_credentials(why)}); set ORGA_BASE_URL (or the task's provider.base_url) "
            "to a URL such as https://api.openai.com/v1"
        )

    async def _wait_turn(self, started: float) -> None:
        """Wait while the deployment holds this provider and key off (another call's 429),
        at most until the retry deadline."""
        blocked_s = await self._throttle.blocked_for_s()
        if blocked_s <= 0:
            return
        if self._retry.deadline_s > 0:
            left_s = self._retry.deadline_s - (self._clock() - started)
            blocked_s = min(blocked_s, left_s)
            if blocked_s <= 0:
                return
        wait = ProviderWait(provider=self._endpoint.provider, wait_s=blocked_s, shared=True)
        record_wait(wait)
        await wait_out(wait, blocked_s, self._sleep)

    async def _back_off(self, url: str, attempt: int, failure: _RetryableFailure) -> None:
        """Wait before the next try; a 429 holds every caller of this key off as long."""
        if failure.status == 429:
            await self._throttle.block(failure.delay_s)
        wait = ProviderWait(
            provider=self._endpoint.provider,
            status=failure.status,
            wait_s=failure.delay_s,
            retry_after=failure.retry_after,
        )
        record_wait(wait)
        self._log_retry(url, attempt, failure)
        await wait_out(wait, failure.delay_s, self._sleep)

    @asynccontextmanager
    async def _open_session(self) -> AsyncIterator[aiohttp.ClientSession]:
        if self._session is not None:
            yield self._session()
            return
        connector = aiohttp.TCPConnector(ssl=shared_ssl_context())
        async with aiohttp.ClientSession(
            connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
        ) as session:
            yield session

    async def _attempt(
        self, session: aiohttp.ClientSession, request: _Request, attempt: int
    ) -> dict[str, Any] | _RetryableFailure:
        try:
            async with asyncio.timeout(self._timeout_s):
                answered = await self._exchange(session, request)
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors
            timed_out = self._timeout_error(request.url, request.model)
            if self._retry.deadline_s <= 0:
                raise timed_out from exc
            return _RetryableFailure(self._retry.backoff_delay(attempt, self._rand()), timed_out)
        except aiohttp.InvalidURL as exc:  # the base URL (or the proxy's) aiohttp cannot use
            raise self._bad_url(request.url, str(exc) or type(exc).__name__) from None
        except aiohttp.ClientError as exc:  # refused, reset, cut short, a stream without its end
            delay = self._retry.backoff_delay(attempt, self._rand())
            return _RetryableFailure(delay, self._unreachable_error(request.url, attempt + 1, exc))
        if isinstance(answered, dict):
            return answered
        response = answered
        if is_retryable_status(response.status):
            delay = self._retry.retry_delay(response.headers, attempt, self._rand())
            error = exhausted_error(response, self._endpoint, request.url, delay)
            hinted = parse_retry_after(response.headers) is not None
            return _RetryableFailure(delay, error, response.status, hinted)
        raise status_error(response, self._endpoint, request.url, request.model)

    async def _exchange(
        self, session: aiohttp.ClientSession, request: _Request
    ) -> dict[str, Any] | HttpAnswer:
        """The 2xx answer's JSON object (streamed or not), or the error answer, read.

        Leaving the ``async with`` early (an error, a cancellation, the stream's end marker
        before the connection's end) closes the connection instead of returning it to the
        pool, so the server sees the caller go."""
        async with session.post(
            request.url,
            data=request.payload,
            headers=request.headers,
            timeout=self._http_timeout,
            allow_redirects=False,
            proxy=self._proxy,
        ) as response:
            success = 200 <= response.status < 300
            if request.consume is not None and success and _is_event_stream(response):
                chunks = self._capped(response.content.iter_any(), request)
                return await request.consume(_lines(chunks))
            answer = HttpAnswer(
                response.status,
                response.reason or "",
                response.headers,
                await self._body(response, request, success),
                response.charset,
            )
        if success:
            return decode_json_object(answer, self._endpoint, request.url)
        return answer

    async def _body(
        self, response: aiohttp.ClientResponse, request: _Request, success: bool
    ) -> bytes:
        """The body, up to ``max_body_bytes``: past it, a 2xx is refused (ResponseParseError)
        and an error answer's body is cut (only its start is ever quoted)."""
        limit = self._max_body_bytes
        declared = response.content_length
        if success and declared is not None and declared > limit:
            raise self._too_large(request, f"declared a body of {declared} bytes")
        kept: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            if size + len(chunk) > limit:
                if success:
                    raise self._too_large(request, "answered a body")
                kept.append(chunk[: limit - size])
                break  # the rest is dropped with the connection
            kept.append(chunk)
            size += len(chunk)
        return b"".join(kept)

    async def _capped(
        self, chunks: AsyncIterator[bytes], request: _Request
    ) -> AsyncIterator[bytes]:
        """A stream's chunks, ResponseParseError once they pass ``max_body_bytes`` in all."""
        size = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > self._max_body_bytes:
                raise self._too_large(request, "streamed an answer")
            yield chunk

    def _too_large(self, request: _Request, what: str) -> ResponseParseError:
        return ResponseParseError(
            f"{self._endpoint.provider} at {redact_url(request.url)} {what} larger "
            f"than the {self._max_body_bytes} bytes an answer may hold (model "
            f"{request.model!r}); refused unread: no model answer is that large, check the base "
            "URL (ORGA_BASE_URL) names a model endpoint"
        )

    def _timeout_error(self, url: str, model: str) -> InferenceTimeoutError:
        return InferenceTimeoutError(
            f"{self._endpoint.provider} at {redact_url(url)} gave no answer within "
            f"{self._timeout_s:g} s (model {model!r}); raise the timeout (ORGA_TIMEOUT_S) "
            "or use a faster model"
        )

    def _unreachable_error(
        self, url: str, attempts: int, exc: aiohttp.ClientError
    ) -> ProviderError:
        # aiohttp's errors quote URLs, a proxy's among them (``HTTPS_PROXY`` may hold a user
        # and password): a URL's credentials never reach the message.
        reason = self._endpoint.redact(without_credentials(str(exc) or type(exc).__name__))
        return ProviderError(
            f"could not reach {self._endpoint.provider} at {redact_url(url)} after "
            f"{attempts} attempt(s): {reason}; check the base URL (ORGA_BASE_URL), the proxy "
            "(HTTPS_PROXY / HTTP_PROXY) and the network"
        )

    def _log_retry(self, url: str, attempt: int, failure: _RetryableFailure) -> None:
        _log.warning(
            "inference.retry",
            extra={
                "provider": self._endpoint.provider,
                "url": redact_url(url),
                "attempt": attempt + 1,
                "delay_s": round(failure.delay_s, 3),
                "error": str(failure.error),
            },
        )


def without_credentials(text: str) -> str:
    """``text`` with every URL in it shown without its userinfo and its query
    (:func:`shared.redaction.redact_urls`): an HTTP error quotes the URL it called or the
    proxy it went through, and either may carry a password or a key."""
    return redact_urls(text)


def _has_userinfo(url: str) -> bool:
    """Whether ``url`` (parsable) names a user or a password (``user:password@host``)."""
    parts = urlsplit(url)
    return parts.username is not None or parts.password is not None


def _same(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    return session


def _is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return "text/event-stream" in response.headers.get("content-type", "")


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The text lines of a byte stream as the chunks arrive (``\\n``, ``\\r\\n`` or ``\\r``
    end a line, as in SSE), without a limit on a line's length; the last line without its
    end is given at the end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    async for chunk in chunks:
        text = pending + decoder.decode(chunk)
        if text.endswith("\r"):  # its "\n" may be in the next chunk
            text, pending = text[:-1], "\r"
        else:
            pending = ""
        lines = text.splitlines()
        if text and text[-1] not in "\r\n":
            pending = lines.pop() + pending
        for line in lines:
            yield line
    tail = pending + decoder.decode(b"", final=True)
    for line in tail.splitlines():
        yield line


def decode_json_object(response: HttpAnswer, endpoint: Endpoint, url: str) -> dict[str, Any]:
    """The body as a JSON object, or ``ResponseParseError`` quoting the start of it (the URL
    is redacted only then: an answer that reads costs no redaction)."""
    try:
        data = response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content-type")
        raise ResponseParseError(
            f"{endpoint.provider} at {redact_url(url)} answered HTTP {response.status} with a "
            f"body that is not JSON ({kind}): {_snippet(response.text, endpoint)!r}"
        ) from None
    except RecursionError:
        raise ResponseParseError(
            f"{endpoint.provider} at {redact_url(url)} answered HTTP {response.status} with "
            f"JSON nested too deeply to read: {_snippet(response.text, endpoint)!r}"
        ) from None
    if not isinstance(data, dict):
        raise ResponseParseError(
            f"{endpoint.provider} at {redact_url(url)} answered a JSON {type(data).__name__}, "
            f"expected an object: {_snippet(response.text, endpoint)!r}"
        )
    return data


def exhausted_error(
    response: HttpAnswer, endpoint: Endpoint, url: str, next_delay_s: float
) -> InferenceError:
    """The error for a 429 or 5xx that is still there after the last retry."""
    url = redact_url(url)
    status = response.status
    message = provider_error_message(response, endpoint)
    if status == 429:
        return RateLimitedError(
            f"{endpoint.provider} at {url} is rate limiting (HTTP 429) and kept doing so through "
            f"the retries; retry after {next_delay_s:g} s or lower the request rate: {message}",
            retry_after_s=next_delay_s,
        )
    return ProviderError(
        f"{endpoint.provider} at {url} answered HTTP {status} {response.reason} through "
        f"the retries; the provider is failing, try again later: {message}"
    )


def status_error(response: HttpAnswer, endpoint: Endpoint, url: str, model: str) -> InferenceError:
    """The error for a 4xx answer other than 429 (never retried)."""
    url = redact_url(url)
    status = response.status
    message = provider_error_message(response, endpoint)
    where = f"{endpoint.provider} at {url}"
    if status in (401, 403):
        return AuthenticationError(
            f"{where} rejected the API key (HTTP {status}): {message}; "
            f"set {endpoint.api_key_env} to a valid key"
        )
    if status == 404:
        return ModelUnavailableError(
            f"model {model!r} is not available from {endpoint.provider} at "
            f"{endpoint.shown_base_url} (HTTP 404 for {url}): {message}; check the model "
            "(ORGA_MODEL) and the base URL (ORGA_BASE_URL)"
        )
    if status == 413 or _is_context_overflow(message, response, endpoint):
        return ContextOverflowError(
            f"{where}: the conversation does not fit model {model!r}'s context window "
            f"(HTTP {status}): {message}; shorten the conversation or lower the context budget"
        )
    return InvalidRequestError(f"{where} rejected the request (HTTP {status}): {message}")


def provider_error_message(response: HttpAnswer, endpoint: Endpoint) -> str:
    """The provider's own explanation from an error body, or the start of the body."""
    try:
        data = response.json()
    except (ValueError, RecursionError):
        return _snippet(response.text, endpoint) or "(empty body)"
    found = json_error_message(data)
    return endpoint.redact(found) if found else _snippet(response.text, endpoint)


def json_error_message(data: Any) -> str | None:
    """The error text of a JSON body, or None.

    Shapes: ``{error: {message}}`` (OpenAI, Anthropic, OpenRouter, llama.cpp), ``{error: "..."}``
    (Ollama), ``{message}`` (vLLM) and ``{detail}`` (FastAPI servers).
    """
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    for key in ("message", "detail"):
        if isinstance(data.get(key), str) and data[key]:
            return str(data[key])
    return None


def shown(value: Any) -> str:
    """A piece of a reply quoted in an error: a ``repr`` cut in length and depth, so a 10 MB or
    deeply nested reply still gives a message an operator can read."""
    return _SHOWN.repr(value)


def json_count(value: Any) -> int:
    """A token count from a reply: a positive integer as is, anything else (null, junk) is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _is_context_overflow(message: str, response: HttpAnswer, endpoint: Endpoint) -> bool:
    haystack = f"{message} {_snippet(response.text, endpoint)}".lower()
    return any(marker in haystack for marker in _CONTEXT_MARKERS)


def _snippet(text: str, endpoint: Endpoint) -> str:
    cleaned = endpoint.redact(text.strip())
    if len(cleaned) <= _SNIPPET_CHARS:
        return cleaned
    return cleaned[:_SNIPPET_CHARS] + "..."
