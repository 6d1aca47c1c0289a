"""One HTTP client per model endpoint, its connections split over small pools.

httpcore's connection pool scans every connection it holds for each queued request
(``_assign_requests_to_connections``), so one pool of 200 connections spends most of a
worker's CPU choosing a connection: measured 16.9 ms of CPU per model call with 1 pool of 200
connections against 1.4 ms with 10 pools of 20 (docs/performance.md). :class:`ShardedTransport`
keeps the one-client-per-endpoint API the providers use and routes each request to the least
busy of several small pools::

    transport = ShardedTransport(max_connections=512, per_shard=20)
    client = httpx.AsyncClient(transport=transport)

A request counts against its shard until its response is closed, so a streamed body keeps its
connection's slot for as long as it is read.

Each time a pool assigns a request (and each time a response is closed), httpcore asks every
idle connection of the pool whether its socket became readable (the server closed it):
``get_extra_info("is_readable")``, which looks the raw socket up through anyio's typed
attributes (a dict of lambdas built on every call) before polling it. The shards' connections
keep their raw socket instead (:class:`SocketKeepingBackend`): the same poll of the same
socket, without the lookup, about a quarter of the client's CPU per request with 200 calls in
flight. And the shards share one TLS context (:func:`shared_ssl_context`) instead of loading
the certificate store once per shard.
"""

from __future__ import annotations

import functools
import math
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import anyio
import httpcore
import httpx
from httpcore._backends.anyio import AnyIOBackend, AnyIOStream
from httpcore._utils import is_socket_readable

__all__ = ["ShardedTransport", "SocketKeepingBackend", "pooled_client", "shared_ssl_context"]


class _SocketKeepingStream(AnyIOStream):
    """httpcore's anyio stream, which looks its raw socket up once (it never changes)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        super().__init__(stream)
        raw = anyio.abc.SocketAttribute.raw_socket
        # anyio's typed attributes (ruff takes ``extra`` for Django's).
        self._socket: socket.socket | None = stream.extra(raw, None)  # noqa: S610

    def get_extra_info(self, info: str) -> Any:
        """As httpcore's, with ``is_readable`` polling the kept socket."""
        if info == "is_readable":
            return is_socket_readable(self._socket)
        return super().get_extra_info(info)

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """As httpcore's; the TLS stream keeps the same raw socket."""
        tls = await super().start_tls(ssl_context, server_hostname, timeout)
        assert isinstance(tls, AnyIOStream)
        return _SocketKeepingStream(tls._stream)


class SocketKeepingBackend(AnyIOBackend):
    """httpcore's anyio network backend, whose TCP streams keep their raw socket."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Connect as httpcore does."""
        stream = await super().connect_tcp(host, port, timeout, local_address, socket_options)
        assert isinstance(stream, AnyIOStream)
        return _SocketKeepingStream(stream._stream)


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context per process, what ``verify=True`` builds (certifi's roots, or
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``): building one costs about 20 ms of CPU and 1 MB, and
    each shard's transport would build its own (26 per endpoint by default)."""
    return httpx.create_ssl_context()


def _http_shard(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    transport = httpx.AsyncHTTPTransport(limits=limits, verify=shared_ssl_context())
    pool = getattr(transport, "_pool", None)
    # httpx builds its httpcore pool without a way to pass a network backend; the pool keeps
    # it in this attribute and hands it to each connection it opens (an httpcore that no
    # longer does keeps its own backend: correct, only slower; a test watches for it).
    if isinstance(pool, httpcore.AsyncConnectionPool) and hasattr(pool, "_network_backend"):
        pool._network_backend = SocketKeepingBackend()
    return transport


class ShardedTransport(httpx.AsyncBaseTransport):
    """Routes each request to the shard with the fewest requests in flight.

    ``max_connections`` is the endpoint's whole budget; it is split into shards of at most
    ``per_shard`` connections, so no shard's pool grows past the size where choosing a
    connection stays cheap.
    """

    def __init__(
        self,
        max_connections: int,
        per_shard: int,
        shard: Callable[[httpx.Limits], httpx.AsyncBaseTransport] = _http_shard,
    ) -> None:
        if max_connections < 1 or per_shard < 1:
            raise ValueError(
                f"max_connections ({max_connections}) and per_shard ({per_shard}) must be "
                "at least 1"
            )
        count = math.ceil(max_connections / per_shard)
        size = math.ceil(max_connections / count)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self.shards = [shard(limits) for _ in range(count)]
        self.in_flight = [0] * count

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the least busy shard."""
        index = min(range(len(self.shards)), key=self.in_flight.__getitem__)
        self.in_flight[index] += 1
        try:
            response = await self.shards[index].handle_async_request(request)
        except BaseException:
            self.in_flight[index] -= 1
            raise
        stream = response.stream
        if not isinstance(stream, httpx.AsyncByteStream):  # pragma: no cover - httpx's contract
            self.in_flight[index] -= 1
            raise TypeError(f"an async transport returned a sync stream: {stream!r}")
        response.stream = _Counted(stream, self, index)
        return response

    def release(self, index: int) -> None:
        """One request of shard ``index`` is over (its response closed)."""
        self.in_flight[index] -= 1

    async def aclose(self) -> None:
        """Close every shard's connections."""
        for shard in self.shards:
            await shard.aclose()


class _Counted(httpx.AsyncByteStream):
    """A response stream that frees its shard's slot once, when it is closed."""

    def __init__(
        self, stream: httpx.AsyncByteStream, transport: ShardedTransport, index: int
    ) -> None:
        self._stream = stream
        self._transport = transport
        self._index = index
        self._open = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._open:
                self._open = False
                self._transport.release(self._index)


def pooled_client(max_connections: int, per_shard: int) -> httpx.AsyncClient:
    """An ``AsyncClient`` whose connections are spread over shards of ``per_shard``."""
    return httpx.AsyncClient(
        transport=ShardedTransport(max_connections=max_connections, per_shard=per_shard)
    )
