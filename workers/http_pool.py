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

The shards share one TLS context (:func:`shared_ssl_context`) instead of loading the
certificate store once per shard. Only httpx's public API is used (``AsyncHTTPTransport``,
``verify=``); an earlier version swapped httpcore's private network backend for one that kept
each connection's raw socket (about a quarter of the client's CPU per request with 200 calls in
flight), removed for issue 27: httpcore is not a declared dependency and its private modules
may change in any release (docs/performance.md, *The HTTP client*).
"""

from __future__ import annotations

import functools
import math
import ssl
from collections.abc import AsyncIterator, Callable

import httpx

__all__ = ["ShardedTransport", "pooled_client", "shared_ssl_context"]


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context per process, what ``verify=True`` builds (certifi's roots, or
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``): building one costs about 20 ms of CPU and 1 MB, and
    each shard's transport would build its own (26 per endpoint by default)."""
    return httpx.create_ssl_context()


def _http_shard(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
    return httpx.AsyncHTTPTransport(limits=limits, verify=shared_ssl_context())


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
