"""The sharded transport behind each worker's model-endpoint client."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest

from workers import http_pool
from workers.http_pool import (
    ShardedTransport,
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


def test_the_pool_uses_public_modules_only() -> None:
    """No private module of httpx, httpcore or anyio is imported (issue 27)."""
    imports = [
        line.split()[1]
        for line in Path(http_pool.__file__).read_text().splitlines()
        if line.startswith(("import ", "from "))
    ]
    assert imports, "the module's imports were not found"
    private = [m for m in imports if m != "__future__" and ("._" in m or m.startswith("_"))]
    assert not private
    assert not [m for m in imports if m.startswith("httpcore")]


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
    """An idle connection the server closed is not used again: the next request opens a new
    connection and gets its answer."""

    async def scenario() -> None:
        server, writers = await _closing_server()
        port = server.sockets[0].getsockname()[1]
        async with server, pooled_client(4, 4) as client:
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "hello"
            writers[0].close()
            await writers[0].wait_closed()
            await asyncio.sleep(0.05)
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "hello"
            assert len(writers) == 2

    asyncio.run(scenario())


def test_default_shards_share_one_verifying_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shard's transport is built with the process's one TLS context, which verifies as
    httpx's ``verify=True`` does (the same roots, hostname checked, certificates required)."""
    verify: list[object] = []
    built = httpx.AsyncHTTPTransport

    def transport(**kwargs: object) -> httpx.AsyncHTTPTransport:
        verify.append(kwargs.get("verify"))
        return built(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx, "AsyncHTTPTransport", transport)
    ShardedTransport(60, 20)
    assert len(verify) == 3
    assert all(v is shared_ssl_context() for v in verify)
    own = httpx.create_ssl_context()
    shared = shared_ssl_context()
    assert shared.verify_mode == own.verify_mode == ssl.CERT_REQUIRED
    assert shared.check_hostname and own.check_hostname
    assert shared.cert_store_stats() == own.cert_store_stats()
    assert shared.minimum_version == own.minimum_version
