"""The sharded transport behind each worker's model-endpoint client."""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from httpcore._backends.anyio import AnyIOStream

from workers.http_pool import (
    ShardedTransport,
    SocketKeepingBackend,
    pooled_client,
    shared_ssl_context,
)


class _Gate(httpx.AsyncBaseTransport):
    """A shard that holds every response until the test opens the gate, counting requests."""

    def __init__(self, opened: asyncio.Event) -> None:
        self.opened = opened
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        await self.opened.wait()
        return httpx.Response(200, stream=httpx.ByteStream(b"ok"))


def test_budget_is_split_into_shards_of_at_most_per_shard() -> None:
    """512 connections at 20 per shard make 26 shards of at most 20 connections."""
    sizes: list[int | None] = []

    def shard(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        sizes.append(limits.max_connections)
        return httpx.MockTransport(lambda request: httpx.Response(200))

    transport = ShardedTransport(512, 20, shard=shard)
    assert len(transport.shards) == 26
    assert all(size is not None and size <= 20 for size in sizes)
    assert sum(size or 0 for size in sizes) >= 512


def test_requests_go_to_the_least_busy_shard_and_free_it_when_closed() -> None:
    """Concurrent requests spread evenly over shards; a closed response frees its slot."""

    async def scenario() -> None:
        opened = asyncio.Event()
        gates: list[_Gate] = []

        def shard(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
            gates.append(_Gate(opened))
            return gates[-1]

        transport = ShardedTransport(40, 10, shard=shard)
        async with httpx.AsyncClient(transport=transport) as client:
            calls = [asyncio.create_task(client.get("http://model/x")) for _ in range(40)]
            await asyncio.sleep(0.01)
            assert [gate.requests for gate in gates] == [10, 10, 10, 10]
            assert transport.in_flight == [10, 10, 10, 10]
            opened.set()
            responses = await asyncio.gather(*calls)
            assert all(r.content == b"ok" for r in responses)
            assert transport.in_flight == [0, 0, 0, 0]

    asyncio.run(scenario())


def test_a_failed_request_frees_its_slot() -> None:
    """A transport error does not leave the shard counted as busy."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def scenario() -> None:
        transport = ShardedTransport(4, 2, shard=lambda limits: httpx.MockTransport(refuse))
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get("http://model/x")
        assert transport.in_flight == [0, 0]

    asyncio.run(scenario())


def test_invalid_sizes_are_refused_with_both_values() -> None:
    """A zero budget or shard size is refused naming the values."""
    with pytest.raises(ValueError, match=r"max_connections \(0\) and per_shard \(20\)"):
        ShardedTransport(0, 20)


def test_pooled_client_serves_a_real_local_server() -> None:
    """The default shards speak real HTTP (a loopback server answering one request)."""

    async def scenario() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, pooled_client(8, 4) as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
            assert response.text == "hello"

    asyncio.run(scenario())


def test_default_shards_open_connections_that_keep_their_socket() -> None:
    """The default shards' pools use :class:`SocketKeepingBackend` (an httpx or httpcore that
    stops taking it fails here, not silently slower)."""
    transport = ShardedTransport(40, 20)
    for shard in transport.shards:
        assert isinstance(shard, httpx.AsyncHTTPTransport)
        assert isinstance(shard._pool._network_backend, SocketKeepingBackend)


async def _closing_server() -> tuple[asyncio.Server, list[asyncio.StreamWriter]]:
    """A keep-alive server answering ``hello``; the test closes the connections it keeps."""
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), writers


def test_an_idle_connection_the_server_closed_is_seen_and_replaced() -> None:
    """``is_readable`` on the kept socket: False while the idle connection is open, True once
    the server closed it; the pool then opens a new connection for the next request."""

    async def scenario() -> None:
        server, writers = await _closing_server()
        port = server.sockets[0].getsockname()[1]
        async with server, pooled_client(4, 4) as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "hello"
            shard = client._transport.shards[0]  # type: ignore[attr-defined]
            (connection,) = shard._pool.connections
            stream = connection._connection._network_stream
            assert isinstance(stream, AnyIOStream) and type(stream) is not AnyIOStream
            assert stream.get_extra_info("is_readable") is False
            writers[0].close()
            await writers[0].wait_closed()
            await asyncio.sleep(0.05)
            assert stream.get_extra_info("is_readable") is True
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "hello"
            assert len(writers) == 2
            assert shard._pool.connections[0] is not connection

    asyncio.run(scenario())


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost`` and its key, made with the ``openssl`` command."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the TLS tests need the openssl command in CI", pytrace=False)
        pytest.skip("no openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_a_tls_stream_keeps_the_socket_too(tmp_path: Path) -> None:
    """``start_tls`` gives a stream that keeps the same raw socket and polls it as httpcore's
    own stream does."""
    cert, key = _self_signed(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)

        server = await asyncio.start_server(hold, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        async with server:
            plain = await SocketKeepingBackend().connect_tcp("127.0.0.1", port, timeout=5)
            stream = await plain.start_tls(client_context, "localhost", timeout=5)
            assert type(stream) is type(plain) and stream.get_extra_info("ssl_object")
            raw = stream.get_extra_info("socket")
            assert raw is not None and raw.fileno() == plain.get_extra_info("socket").fileno()
            assert stream.get_extra_info("is_readable") is False
            await asyncio.sleep(0.05)
            accepted[0].close()
            await asyncio.sleep(0.05)
            assert stream.get_extra_info("is_readable") is True
            await stream.aclose()

    asyncio.run(scenario())


def test_default_shards_share_one_verifying_tls_context() -> None:
    """Every shard's pool holds the process's one TLS context, which verifies as httpx's
    ``verify=True`` does (the same roots, hostname checked, certificates required)."""
    transport = ShardedTransport(60, 20)
    contexts = {id(shard._pool._ssl_context) for shard in transport.shards}
    assert contexts == {id(shared_ssl_context())}
    own = httpx.create_ssl_context()
    shared = shared_ssl_context()
    assert shared.verify_mode == own.verify_mode == ssl.CERT_REQUIRED
    assert shared.check_hostname and own.check_hostname
    assert shared.cert_store_stats() == own.cert_store_stats()
    assert shared.minimum_version == own.minimum_version
