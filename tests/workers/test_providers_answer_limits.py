"""A provider's answer has limits: a huge body (or stream) is refused, not held; a server
that accepts and never answers, or a stream that stalls mid-way, is a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from workers.providers import (
    InferenceTimeoutError,
    ProviderError,
    ResponseParseError,
    RetryPolicy,
)
from workers.providers._http import Endpoint, JsonPoster, StreamConsumer

LIMIT = 1 << 20  # 1 MiB

Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _chunked(head: bytes, pieces: Callable[[], Any]) -> Answer:
    """An answer of ``head`` and a chunked body of ``pieces()`` (an iterable, maybe endless)."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
        for piece in pieces():
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    return answer


def _post(answer: Answer, consume: StreamConsumer | None = None, timeout_s: float = 20.0) -> Any:
    """POST once (no retry) to a local server answering with ``answer``, ``max_body_bytes``
    at :data:`LIMIT`; the server's handlers are ended before the loop closes."""
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            await answer(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def scenario() -> Any:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        endpoint = Endpoint("fake", f"http://127.0.0.1:{port}/v1", "FAKE_API_KEY")
        poster = JsonPoster(
            endpoint,
            timeout_s=timeout_s,
            retry=RetryPolicy(max_retries=0),
            sleep=asyncio.sleep,
            max_body_bytes=LIMIT,
        )
        try:
            async with server:
                return await poster.post(
                    "chat", headers={}, body={"q": 1}, model="m", consume=consume
                )
        finally:
            for task in handlers:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*handlers, return_exceptions=True)

    return asyncio.run(scenario())


def _forever(piece: bytes) -> Callable[[], Any]:
    def pieces() -> Any:
        while True:
            yield piece

    return pieces


def test_a_success_body_over_the_limit_is_refused_naming_the_limit() -> None:
    """A 2xx JSON body of 4 MiB against a 1 MiB limit: a ResponseParseError saying so (the
    whole body is never held)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    pieces = [b'{"content": "', *[b"a" * 65536] * 64, b'"}']
    with pytest.raises(ResponseParseError) as caught:
        _post(_chunked(head, lambda: pieces))
    message = str(caught.value)
    assert f"{LIMIT} bytes" in message and "ORGA_BASE_URL" in message


def test_a_body_within_the_limit_is_read_whole() -> None:
    """Just under the limit, the JSON body is the answer."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    text = b"a" * (LIMIT - 100)
    pieces = [b'{"content": "', text[: LIMIT // 2], text[LIMIT // 2 :], b'"}']
    assert _post(_chunked(head, lambda: pieces)) == {"content": text.decode()}


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    """A ``content-length`` above the limit is refused on the head alone."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: 10000000000\r\n\r\n{"
        )
        await writer.drain()
        await asyncio.sleep(30)  # never sends the rest

    started = time.monotonic()
    with pytest.raises(ResponseParseError, match="10000000000"):
        _post(answer)
    assert time.monotonic() - started < 10


def test_an_endless_error_body_is_cut_at_the_limit() -> None:
    """A 500 whose body never ends: the error is a ProviderError quoting its start, given
    once the limit is read, not a timeout."""
    head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
    started = time.monotonic()
    with pytest.raises(ProviderError, match="HTTP 500"):
        _post(_chunked(head, _forever(b"x" * 65536)))
    assert time.monotonic() - started < 10


def test_a_stream_over_the_limit_is_refused() -> None:
    """A streamed answer that never ends (an SSE comment line after another) is refused once
    it passed the limit, not read until the timeout."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"

    async def consume(lines: AsyncIterator[str]) -> dict[str, Any]:
        async for _line in lines:
            pass
        return {}

    started = time.monotonic()
    with pytest.raises(ResponseParseError, match=f"{LIMIT} bytes"):
        _post(_chunked(head, _forever(b": keep-alive\n" * 4096)), consume)
    assert time.monotonic() - started < 10


async def _read_all(lines: AsyncIterator[str]) -> dict[str, Any]:
    async for _line in lines:
        pass
    return {}


def test_a_server_that_accepts_and_never_answers_is_a_timeout() -> None:
    """The request is read, no status line ever comes: InferenceTimeoutError after about
    ``timeout_s``, naming it."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(60)

    started = time.monotonic()
    with pytest.raises(InferenceTimeoutError, match="within 1 s"):
        _post(answer, timeout_s=1.0)
    assert time.monotonic() - started < 5


def test_a_stream_that_stalls_mid_way_is_a_timeout() -> None:
    """A 200 event stream that sends a first event and then nothing: a timeout, not a wait
    for ever."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        event = b'data: {"choices": []}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(60)

    started = time.monotonic()
    with pytest.raises(InferenceTimeoutError):
        _post(answer, _read_all, timeout_s=1.0)
    assert time.monotonic() - started < 5


def test_a_stream_that_keeps_trickling_is_bounded_by_the_whole_try() -> None:
    """A comment line every 0.2 s (each read within ``timeout_s``) for ever: the try's own
    deadline ends it."""

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(b": x\n"), b": x\n"))
            await writer.drain()
            await asyncio.sleep(0.2)

    started = time.monotonic()
    with pytest.raises(InferenceTimeoutError):
        _post(answer, _read_all, timeout_s=1.0)
    assert time.monotonic() - started < 5


def test_a_compressed_body_is_limited_as_it_decompresses() -> None:
    """A gzip body of about 8 KiB that inflates to 8 MiB (a "zip bomb" of JSON): the limit
    counts the inflated bytes, refused as they come, not once all are held."""
    inflated = b'{"content": "' + b"0" * (8 << 20) + b'"}'
    body = gzip.compress(inflated, compresslevel=9)
    assert len(body) < LIMIT // 16

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    with pytest.raises(ResponseParseError, match=f"{LIMIT} bytes"):
        _post(answer)
