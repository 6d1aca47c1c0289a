"""web_fetch: non-public addresses refused before any connection; a local server for the rest."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from workers.tools import ToolContext, ToolOutput, WebFetchTool, blocked_address_reason
from workers.tools.web import IPAddress, SystemResolver, html_to_text

PUBLIC_IP = "93.184.216.34"


class TableResolver:
    """Resolves names from a fixed table; anything else does not exist."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The table's addresses for ``host``."""
        self.calls.append(host)
        if host == "localhost":
            return await SystemResolver().resolve(host, port)
        if host not in self.table:
            raise OSError(f"unknown host {host}")
        return [ipaddress.ip_address(a) for a in self.table[host]]


class RecordingTransport(httpx.MockTransport):
    """A transport that records every request instead of touching the network."""

    def __init__(self, reply: httpx.Response | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.reply = reply or httpx.Response(200, text="should not be reached")
        super().__init__(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.reply


def _fetch(tool: WebFetchTool, tmp_path: Path, **arguments: Any) -> ToolOutput:
    limits = {
        key: arguments.pop(key)
        for key in ("allow_private_network", "timeout_s", "max_output_bytes")
        if key in arguments
    }
    context = ToolContext(workspace=tmp_path, **limits)
    return asyncio.run(tool.run(arguments, context))


REFUSED = [
    ("http://127.0.0.1/", "loopback"),
    ("http://127.0.0.1:6379/", "loopback"),
    ("http://localhost/admin", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://10.0.0.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://192.168.1.1/", "private"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://224.0.0.1/", "multicast"),
    ("http://100.64.0.1/", "non-global"),
    ("http://intranet.example/", "private"),
    ("http://mixed.example/", "private"),
    ("file:///etc/passwd", "scheme 'file' is not allowed"),
    ("ftp://ftp.example.com/file.txt", "scheme 'ftp' is not allowed"),
    ("gopher://example.com/", "scheme 'gopher' is not allowed"),
    ("http:///no-host", "has no host"),
]


@pytest.mark.parametrize(("url", "fragment"), REFUSED)
def test_refused_without_any_request(tmp_path: Path, url: str, fragment: str) -> None:
    """Loopback, private and other non-public targets and non-http schemes never get a request."""
    transport = RecordingTransport()
    resolver = TableResolver(
        {"intranet.example": ["10.1.2.3"], "mixed.example": [PUBLIC_IP, "10.0.0.5"]}
    )
    output = _fetch(WebFetchTool(transport=transport, resolver=resolver), tmp_path, url=url)
    assert output.is_error
    assert output.metadata["error_type"] == "blocked_url"
    assert fragment in output.content
    assert repr(url) in output.content or url.rstrip("/") in output.content
    assert transport.requests == []


def test_unknown_host_is_a_network_error(tmp_path: Path) -> None:
    """A name that does not resolve is a network error naming the host, sent nowhere."""
    transport = RecordingTransport()
    tool = WebFetchTool(transport=transport, resolver=TableResolver({}))
    output = _fetch(tool, tmp_path, url="http://unknown.example/")
    assert output.is_error
    assert output.metadata["error_type"] == "network"
    assert "could not resolve host 'unknown.example'" in output.content
    assert transport.requests == []


def test_redirect_to_loopback_is_refused(tmp_path: Path) -> None:
    """A public page redirecting to loopback stops before the second request."""
    transport = RecordingTransport(
        httpx.Response(302, headers={"Location": "http://127.0.0.1:8080/admin"})
    )
    resolver = TableResolver({"public.example": [PUBLIC_IP]})
    tool = WebFetchTool(transport=transport, resolver=resolver)
    output = _fetch(tool, tmp_path, url="http://public.example/start")
    assert output.is_error
    assert "127.0.0.1" in output.content
    assert "loopback" in output.content
    assert len(transport.requests) == 1


def test_redirect_to_a_name_resolving_privately_is_refused(tmp_path: Path) -> None:
    """A relative hop is checked too: the redirect target's host is resolved and refused."""
    transport = RecordingTransport(
        httpx.Response(301, headers={"Location": "http://intranet.example/"})
    )
    resolver = TableResolver({"public.example": [PUBLIC_IP], "intranet.example": ["10.9.9.9"]})
    output = _fetch(
        WebFetchTool(transport=transport, resolver=resolver), tmp_path, url="http://public.example/"
    )
    assert output.is_error
    assert "10.9.9.9" in output.content
    assert resolver.calls == ["public.example", "intranet.example"]


def test_connection_goes_to_the_checked_address(tmp_path: Path) -> None:
    """The request is sent to the address that was checked, naming the host for Host and SNI."""
    transport = RecordingTransport(
        httpx.Response(200, text="ok", headers={"Content-Type": "text/plain"})
    )
    resolver = TableResolver({"public.example": [PUBLIC_IP]})
    output = _fetch(
        WebFetchTool(transport=transport, resolver=resolver),
        tmp_path,
        url="https://public.example:8443/page?q=1",
    )
    assert not output.is_error
    (request,) = transport.requests
    assert request.url == httpx.URL(f"https://{PUBLIC_IP}:8443/page?q=1")
    assert request.headers["Host"] == "public.example:8443"
    assert request.extensions["sni_hostname"] == "public.example"
    assert output.metadata["url"] == "https://public.example:8443/page?q=1"


def test_too_many_redirects(tmp_path: Path) -> None:
    """A redirect loop ends after the maximum number of hops."""
    transport = RecordingTransport(httpx.Response(302, headers={"Location": "/again"}))
    resolver = TableResolver({"public.example": [PUBLIC_IP]})
    output = _fetch(
        WebFetchTool(transport=transport, resolver=resolver), tmp_path, url="http://public.example/"
    )
    assert output.is_error
    assert "more than 5 redirects" in output.content
    assert len(transport.requests) == 6


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("ff02::1", "multicast"),
        ("::ffff:192.168.0.1", "private"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_blocked_address_reason(address: str, reason: str | None) -> None:
    """Each kind of non-public address is named; public ones pass."""
    assert blocked_address_reason(ipaddress.ip_address(address)) == reason


def test_html_to_text() -> None:
    """Tags go, scripts and styles go, entities are decoded, blocks become lines."""
    html = (
        "<html><head><title>T</title><style>p{}</style><script>var x = '<p>';</script></head>"
        "<body><h1>Hello &amp; welcome</h1><p>One <b>bold</b>\n  word.</p><ul><li>a</li>"
        "<li>b</li></ul></body></html>"
    )
    assert html_to_text(html) == "T\nHello & welcome\nOne bold word.\na\nb"


BIG_BODY = b"0123456789" * 5000


class _Handler(BaseHTTPRequestHandler):
    """Routes of the local test server."""

    routes: ClassVar[dict[str, tuple[int, str, bytes]]] = {
        "/text": (200, "text/plain; charset=utf-8", "héllo wörld\n".encode()),
        "/page": (200, "text/html", b"<p>Hi <script>evil()</script>there</p>"),
        "/data": (200, "application/json", b'{"ok": true}'),
        "/big": (200, "text/plain", BIG_BODY),
        "/image": (200, "image/png", b"\x89PNG\r\n\x1a\n\x00\x00"),
        "/missing": (404, "text/plain", b"no such page"),
    }

    def do_GET(self) -> None:
        """Serve a route, a redirect, a slow answer or the Host header."""
        if self.path == "/redirect":
            self._reply(302, "text/plain", b"", location="/text")
        elif self.path == "/host":
            self._reply(200, "text/plain", self.headers["Host"].encode())
        elif self.path == "/slow":
            time.sleep(1.0)
            self._reply(200, "text/plain", b"late")
        else:
            self._reply(*self.routes.get(self.path, (404, "text/plain", b"?")))

    def _reply(self, status: int, content_type: str, body: bytes, location: str = "") -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if location:
                self.send_header("Location", location)
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet."""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A local HTTP server on 127.0.0.1; yields its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _local(tmp_path: Path, url: str, **arguments: Any) -> ToolOutput:
    return _fetch(WebFetchTool(), tmp_path, url=url, allow_private_network=True, **arguments)


def test_local_server_refused_by_default(tmp_path: Path, server: str) -> None:
    """Without allow_private_network even the local server is refused."""
    output = _fetch(WebFetchTool(), tmp_path, url=f"{server}/text")
    assert output.is_error
    assert "loopback" in output.content


def test_fetch_text(tmp_path: Path, server: str) -> None:
    """A text page comes back with its status, type, hash and decoded text."""
    output = _local(tmp_path, f"{server}/text")
    assert not output.is_error
    assert output.content == (
        f"url: {server}/text\nstatus: 200 OK\ncontent-type: text/plain; charset=utf-8\n\n"
        "héllo wörld\n"
    )
    assert output.metadata == {
        "kind": "other",
        "url": f"{server}/text",
        "status": "200",
        "content_type": "text/plain; charset=utf-8",
        "output_hash": hashlib.sha256("héllo wörld\n".encode()).hexdigest(),
    }


def test_fetch_html_is_reduced_to_text(tmp_path: Path, server: str) -> None:
    """HTML loses its tags and scripts."""
    output = _local(tmp_path, f"{server}/page")
    assert output.content.endswith("\n\nHi there")


def test_fetch_json(tmp_path: Path, server: str) -> None:
    """JSON is returned as it is."""
    assert _local(tmp_path, f"{server}/data").content.endswith('\n\n{"ok": true}')


def test_size_cap_stops_the_download(tmp_path: Path, server: str) -> None:
    """max_bytes cuts the body and says so."""
    output = _local(tmp_path, f"{server}/big", max_bytes=1000)
    body = output.content.split("\n\n", 1)[1]
    assert (
        body == BIG_BODY[:1000].decode() + "\n[download stopped at 1000 bytes; the page is longer]"
    )
    assert output.metadata["output_hash"] == hashlib.sha256(BIG_BODY[:1000]).hexdigest()


def test_output_cap_applies_to_the_text(tmp_path: Path, server: str) -> None:
    """The context's output cap bounds the returned text."""
    output = _local(tmp_path, f"{server}/big", max_output_bytes=500)
    assert "[output truncated: showing 500 of 50000 bytes" in output.content


def test_redirect_followed_on_the_local_server(tmp_path: Path, server: str) -> None:
    """An allowed redirect is followed and the final URL reported."""
    output = _local(tmp_path, f"{server}/redirect")
    assert output.metadata["url"] == f"{server}/text"
    assert output.content.endswith("héllo wörld\n")


def test_host_header_names_the_url_host(tmp_path: Path, server: str) -> None:
    """The server sees the URL's host and port in the Host header."""
    output = _local(tmp_path, f"{server}/host")
    assert output.content.endswith("\n\n" + server.removeprefix("http://"))


def test_binary_content_is_refused(tmp_path: Path, server: str) -> None:
    """An image is refused as binary."""
    output = _local(tmp_path, f"{server}/image")
    assert output.is_error
    assert output.metadata["error_type"] == "binary"
    assert "'image/png' is binary" in output.content


def test_http_error_status_is_an_ordinary_result(tmp_path: Path, server: str) -> None:
    """A 404 page is shown to the model with its status, not as a tool failure."""
    output = _local(tmp_path, f"{server}/missing")
    assert not output.is_error
    assert output.metadata["status"] == "404"
    assert "status: 404 Not Found" in output.content


def test_timeout(tmp_path: Path, server: str) -> None:
    """A server slower than the context's timeout gives a timeout error."""
    started = time.monotonic()
    output = _local(tmp_path, f"{server}/slow", timeout_s=0.2)
    assert time.monotonic() - started < 1.0
    assert output.is_error
    assert output.metadata["error_type"] == "timeout"
    assert "timed out after 0.2s" in output.content


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_is_a_network_error(tmp_path: Path) -> None:
    """A closed local port is a network error, not a crash."""
    output = _local(tmp_path, f"http://127.0.0.1:{_closed_port()}/")
    assert output.is_error
    assert output.metadata["error_type"] == "network"
