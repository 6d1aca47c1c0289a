"""The aiohttp session behind each worker's model calls (``workers/http_pool.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import pytest

from shared.conversation import Conversation, ConversationMessage
from shared.inference import InferenceOptions
from tests.fakes.llm_server import closed_port_url
from workers import http_pool
from workers.http_pool import env_proxy, pooled_session, shared_ssl_context
from workers.providers import OpenAICompatProvider, ProviderError, RetryPolicy

_HELLO = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"


async def _keep_alive_server(
    hold: asyncio.Event | None = None,
) -> tuple[asyncio.Server, list[asyncio.StreamWriter], list[int]]:
    """A keep-alive server answering ``hello`` (after ``hold`` is set, when given); it records
    each connection's writer and the most connections open at once."""
    writers: list[asyncio.StreamWriter] = []
    peak = [0]
    open_now = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        open_now[0] += 1
        peak[0] = max(peak[0], open_now[0])
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                if hold is not None:
                    await hold.wait()
                writer.write(_HELLO)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            open_now[0] -= 1
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), writers, peak


def test_the_session_serves_a_real_local_server_over_one_kept_connection() -> None:
    """Two calls in a row to one endpoint use one connection, kept alive between them."""

    async def scenario() -> None:
        server, writers, _ = await _keep_alive_server()
        port = server.sockets[0].getsockname()[1]
        session = pooled_session(4)
        async with server, session:
            for _ in range(2):
                async with session.get(f"http://127.0.0.1:{port}/") as response:
                    assert await response.text() == "hello"
            assert len(writers) == 1

    asyncio.run(scenario())


def test_a_cookie_one_reply_sets_goes_with_no_later_call() -> None:
    """The pooled session serves every task's calls: a cookie a provider sets on one reply is
    not sent with the next call (one task's cookie would otherwise reach another's calls)."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                seen.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(
                    b"HTTP/1.1 200 OK\r\nset-cookie: session=task-a; Path=/\r\n"
                    b"content-length: 5\r\n\r\nhello"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def scenario() -> None:
        # A host name: aiohttp keeps no cookie for an IP address anyway.
        server = await asyncio.start_server(handle, "localhost", 0)
        port = server.sockets[0].getsockname()[1]
        session = pooled_session(4)
        async with server, session:
            for _ in range(2):
                async with session.get(f"http://localhost:{port}/") as response:
                    assert await response.text() == "hello"

    asyncio.run(scenario())
    assert len(seen) == 2
    assert b"cookie:" not in seen[1].lower(), seen[1]


def test_connections_to_one_endpoint_are_capped_at_max_per_host() -> None:
    """Ten calls at once with a cap of 4 open at most 4 connections; the rest wait their turn
    and are all answered."""

    async def scenario() -> None:
        hold = asyncio.Event()
        server, _, peak = await _keep_alive_server(hold)
        port = server.sockets[0].getsockname()[1]
        session = pooled_session(4)

        async def call() -> str:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                return await response.text()

        async with server, session:
            calls = [asyncio.create_task(call()) for _ in range(10)]
            await asyncio.sleep(0.2)
            assert peak[0] == 4
            hold.set()
            assert await asyncio.gather(*calls) == ["hello"] * 10
            assert peak[0] == 4

    asyncio.run(scenario())


def test_an_idle_connection_the_server_closed_is_seen_and_replaced() -> None:
    """An idle connection the server closed is not used again: the next request opens a new
    connection and gets its answer."""

    async def scenario() -> None:
        server, writers, _ = await _keep_alive_server()
        port = server.sockets[0].getsockname()[1]
        session = pooled_session(4)
        async with server, session:
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                assert await response.text() == "hello"
            writers[0].close()
            await writers[0].wait_closed()
            await asyncio.sleep(0.05)
            async with session.get(f"http://127.0.0.1:{port}/") as response:
                assert await response.text() == "hello"
            assert len(writers) == 2

    asyncio.run(scenario())


def test_an_invalid_cap_is_refused_naming_the_value_and_the_setting() -> None:
    """A cap below 1 is refused with the value and the variable that sets it."""
    with pytest.raises(ValueError, match=r"got 0: set ORGA_HTTP_MAX_CONNECTIONS"):
        pooled_session(0)


def test_the_pool_uses_public_modules_only() -> None:
    """No private module of aiohttp, httpx, httpcore or anyio is imported (issue 27)."""
    imports = [
        line.split()[1]
        for line in Path(http_pool.__file__).read_text().splitlines()
        if line.startswith(("import ", "from "))
    ]
    assert "aiohttp" in imports
    private = [m for m in imports if m != "__future__" and ("._" in m or m.startswith("_"))]
    assert not private
    assert not [m for m in imports if m.startswith("httpcore")]


def test_the_session_verifies_tls_with_the_shared_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connector is built with the process's one TLS context, which verifies as httpx's
    ``verify=True`` does (the same roots, hostname checked, certificates required)."""
    given: list[object] = []
    built = aiohttp.TCPConnector

    def connector(**kwargs: object) -> aiohttp.TCPConnector:
        given.append(kwargs.get("ssl"))
        return built(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(aiohttp, "TCPConnector", connector)

    async def scenario() -> None:
        await pooled_session(8).close()

    asyncio.run(scenario())
    assert given == [shared_ssl_context()]
    own = httpx.create_ssl_context()
    shared = shared_ssl_context()
    assert shared.verify_mode == own.verify_mode == ssl.CERT_REQUIRED
    assert shared.check_hostname and own.check_hostname
    assert shared.cert_store_stats() == own.cert_store_stats()
    assert shared.minimum_version == own.minimum_version


def test_a_server_with_a_self_signed_certificate_is_refused(tmp_path: Path) -> None:
    """TLS verification is on: a local TLS server whose certificate no trusted root signed is
    refused before any request reaches it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
        port = server.sockets[0].getsockname()[1]
        session = pooled_session(2)
        async with server, session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.get(f"https://127.0.0.1:{port}/")
        assert requests == []

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("env", "url", "expected"),
    [
        ({}, "https://api.openai.com/v1", None),
        ({"HTTPS_PROXY": "http://proxy:3128"}, "https://api.openai.com/v1", "http://proxy:3128"),
        ({"https_proxy": "http://proxy:3128"}, "http://llm.test/v1", None),
        ({"ALL_PROXY": "http://proxy:3128"}, "http://llm.test/v1", "http://proxy:3128"),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "llm.test"}, "http://llm.test/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": ".test"}, "http://a.llm.test/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, "http://llm.test/v1", None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "other"}, "http://llm.test/v1", "http://p:1"),
    ],
)
def test_env_proxy_follows_the_proxy_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str, expected: str | None
) -> None:
    """The proxy of a URL as httpx's ``trust_env`` chose it: by scheme, ALL_PROXY, NO_PROXY."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxy(url) == expected


HI = Conversation(messages=[ConversationMessage.user("hi")])

ProxyHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _proxy_in_env(
    monkeypatch: pytest.MonkeyPatch, handler: ProxyHandler, variable: str, credentials: str = ""
) -> AsyncIterator[int]:
    """A local proxy serving ``handler``, named in ``variable`` (``HTTP_PROXY``,
    ``HTTPS_PROXY``; ``credentials``: ``user:password@``) with no ``NO_PROXY``; its port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    monkeypatch.setenv(variable, f"http://{credentials}127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with server:
        yield port


def test_a_provider_without_a_session_goes_through_the_environment_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built without a session, a provider sends its call to ``HTTP_PROXY`` (absolute-form
    request line), as a fresh httpx client did; the worker's pooled session never does."""
    seen: list[bytes] = []
    reply = b'{"choices": [{"message": {"content": "via proxy"}}]}'

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(reply)}\r\n\r\n".encode()
            + reply
        )
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        async with _proxy_in_env(monkeypatch, proxy, "HTTP_PROXY"):
            fresh = OpenAICompatProvider(base_url="http://llm.test/v1", api_key="k")
            answer = await fresh.complete(HI, InferenceOptions())
            assert answer.content == "via proxy"
            assert seen == [b"POST http://llm.test/v1/chat/completions HTTP/1.1"]
            session = pooled_session(2)
            async with session:
                pooled = OpenAICompatProvider(
                    base_url=closed_port_url(),
                    api_key="k",
                    session=session,
                    retry=RetryPolicy(max_retries=0),
                )
                with pytest.raises(ProviderError, match="could not reach"):  # direct: refused
                    await pooled.complete(HI, InferenceOptions())
            assert len(seen) == 1

    asyncio.run(scenario())


def test_a_proxy_refusing_the_call_never_shows_its_credentials(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy named with a user and password (``HTTPS_PROXY=http://user:pw@host:port``) that
    refuses the tunnel (407): aiohttp's error quotes the proxy's URL, password included; the
    provider's error and its retry log say which proxy without the credentials."""

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
        writer.close()

    async def scenario() -> None:
        credentials = "orga-user:Pr0xyS3cret@"
        async with _proxy_in_env(monkeypatch, proxy, "HTTPS_PROXY", credentials) as port:
            provider = OpenAICompatProvider(
                base_url="https://llm.test/v1",
                api_key="k",
                retry=RetryPolicy(max_retries=1, backoff_base_s=0, jitter_s=0),
            )
            with pytest.raises(ProviderError) as caught:
                await provider.complete(HI, InferenceOptions())
        message = str(caught.value)
        assert f"127.0.0.1:{port}" in message  # which proxy, still said
        assert "Pr0xyS3cret" not in message
        assert "orga-user" not in message

    with caplog.at_level("WARNING"):
        asyncio.run(scenario())
    logged = " ".join(str(vars(r)) for r in caplog.records)
    assert "inference.retry" in logged
    assert "Pr0xyS3cret" not in logged
