"""An ``httpx2`` transport that connects to addresses checked beforehand, not to what a second
DNS lookup answers: how a task's MCP server over streamable HTTP is reached
(:mod:`workers.tools.mcp`) once :func:`~workers.tools.address_policy.checked_addresses` allowed
its host.

The MCP SDK's ``streamable_http_client`` takes the ``httpx2.AsyncClient`` it posts with; this
is that client's transport. Each request keeps its URL's host in the ``Host`` header and, over
TLS, as the server name (``sni_hostname``), so certificates are checked against the name; only
the TCP connection goes to the pinned address. A request to any other host is refused (the
SDK follows a same-origin 307/308 only, which comes back here for the same host). Imported by
the first HTTP connection only (``httpx2`` comes with the SDK).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx2

from workers.tools.address_policy import IPAddress, ip_literal

__all__ = ["PinnedTransport"]


class PinnedTransport(httpx2.AsyncBaseTransport):
    """Sends every request for ``host`` to the first of ``addresses`` that accepts a
    connection (the rest are tried in order after a connection error)."""

    def __init__(
        self,
        host: str,
        addresses: Sequence[IPAddress],
        inner: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        if not addresses:
            raise ValueError(f"PinnedTransport for {host!r} needs at least one checked address")
        self.host = host
        self.addresses = tuple(addresses)
        self._inner = inner or httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """The response of the first pinned address that accepts the connection."""
        url = request.url
        host = url.raw_host.decode("ascii")
        if host != self.host:
            raise httpx2.ConnectError(
                f"refused {url.scheme}://{host}: this client may reach {self.host!r} only "
                "(its addresses were checked before connecting)",
                request=request,
            )
        if ip_literal(host) is None and url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        failure: httpx2.ConnectError | None = None
        for address in self.addresses:
            request.url = url.copy_with(host=str(address))
            try:
                return await self._inner.handle_async_request(request)
            except httpx2.ConnectError as exc:
                failure = exc
            finally:
                request.url = url
        assert failure is not None  # addresses is never empty
        raise failure

    async def aclose(self) -> None:
        """Close the connections of the inner transport."""
        await self._inner.aclose()
