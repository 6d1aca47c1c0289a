"""A task's MCP server over streamable HTTP reaches public addresses only (web_fetch's address
policy): loopback, private and link-local hosts, and names resolving to them, are refused when
the server is connected, unless the operator allows the private network or declared the
server; the connection goes to the checked address."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from shared.mcp import McpServerSpec
from tests.fakes.mcp_http import HttpMcpServer
from workers.tools.address_policy import IPAddress
from workers.tools.mcp import McpSessions
from workers.tools.pinned_transport import PinnedTransport


class _Names:
    """A resolver with a fixed table (no DNS)."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append(host)
        if host not in self.table:
            raise OSError(f"unknown name {host}")
        return [ipaddress.ip_address(self.table[host])]


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpMcpServer]:
    """The fake server over streamable HTTP on 127.0.0.1."""
    with HttpMcpServer(tmp_path / "http-server.log") as server:
        yield server


def _error(sessions: McpSessions, url: str, workspace: Path) -> str | None:
    async def scenario() -> str | None:
        try:
            spec = McpServerSpec(name="web", url=url)
            return (await sessions.list_tools("t1", [spec], workspace, 10)).error
        finally:
            await sessions.aclose()

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("url", "finding"),
    [
        ("http://127.0.0.1:6379/mcp", "127.0.0.1 is a loopback address"),
        ("http://10.1.2.3:8000/mcp", "10.1.2.3 is a private address"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
        ("http://[::1]:8000/mcp", "::1 is a loopback address"),
        ("http://search.internal:8000/mcp", "host 'search.internal' resolves to 127.0.0.1,"),
    ],
)
def test_a_task_server_on_a_non_public_address_is_refused(
    tmp_path: Path, url: str, finding: str
) -> None:
    """The listing fails naming the server, the URL, the address, its kind and the fix; no
    connection is made."""
    resolver = _Names({"search.internal": "127.0.0.1"})
    error = _error(McpSessions(resolver=resolver), url, tmp_path)
    assert error is not None and "MCP server 'web'" in error and finding in error
    assert "ORGA_MCP_SERVERS" in error and "ORGA_ALLOW_PRIVATE_NETWORK=true" in error


def test_the_refusal_quotes_the_url_redacted(tmp_path: Path) -> None:
    """Userinfo and a credential query parameter of the URL never reach the error."""
    error = _error(McpSessions(), "http://me:hunter2@10.0.0.7/mcp?token=s3cr3t", tmp_path)
    assert error is not None and "10.0.0.7 is a private address" in error
    assert "hunter2" not in error and "s3cr3t" not in error


def test_a_name_that_does_not_resolve_is_a_configuration_error(tmp_path: Path) -> None:
    """A host the resolver does not know fails the listing naming it."""
    error = _error(McpSessions(resolver=_Names({})), "http://nowhere.example/mcp", tmp_path)
    assert error is not None and "could not resolve host 'nowhere.example'" in error


def test_the_private_network_setting_lets_a_task_server_on_loopback_be_listed(
    tmp_path: Path, http_server: HttpMcpServer
) -> None:
    """With ORGA_ALLOW_PRIVATE_NETWORK the fake on 127.0.0.1 is listed (nothing resolved)."""
    resolver = _Names({})
    assert _error(McpSessions(resolver=resolver), http_server.url, tmp_path) is not None
    allowed = McpSessions(allow_private_network=True, resolver=resolver)
    assert _error(allowed, http_server.url, tmp_path) is None
    assert resolver.asked == []


def test_an_operator_server_on_loopback_is_not_checked(
    tmp_path: Path, http_server: HttpMcpServer
) -> None:
    """A server of ORGA_MCP_SERVERS (the same declaration) is trusted; a task's server of
    another name on the same URL is not."""
    operator = McpServerSpec(name="web", url=http_server.url)
    assert _error(McpSessions(trusted=[operator]), http_server.url, tmp_path) is None
    other = McpServerSpec(name="ops", url=http_server.url)
    assert _error(McpSessions(trusted=[other]), http_server.url, tmp_path) is not None


def test_the_pinned_transport_connects_to_the_checked_address() -> None:
    """The request goes to the checked address with the original Host header (and TLS server
    name); a request to another host is refused; the next address is tried after a failed
    connection."""
    sent: list[tuple[str, object]] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        sent.append((request.url.host, request.extensions.get("sni_hostname")))
        if request.url.host == "203.0.113.9":
            raise httpx2.ConnectError("refused", request=request)
        return httpx2.Response(200, text=f"{request.url.host} {request.headers['host']}")

    addresses = [ipaddress.ip_address("203.0.113.9"), ipaddress.ip_address("198.51.100.4")]

    async def scenario() -> None:
        transport = PinnedTransport("mcp.example", addresses, httpx2.MockTransport(answer))
        async with httpx2.AsyncClient(transport=transport) as client:
            response = await client.post("https://mcp.example:8443/mcp", json={})
            assert response.text == "198.51.100.4 mcp.example:8443"
            assert str(response.request.url) == "https://mcp.example:8443/mcp"
            with pytest.raises(httpx2.ConnectError, match=r"may reach 'mcp\.example' only"):
                await client.post("https://other.example/mcp", json={})

    asyncio.run(scenario())
    assert sent == [("203.0.113.9", "mcp.example"), ("198.51.100.4", "mcp.example")]
