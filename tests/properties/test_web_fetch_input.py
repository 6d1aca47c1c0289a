"""web_fetch against loopback, private and otherwise non-public targets (hypothesis).

Every URL is refused before any connection: the transport is a recorder that must see no
request, and the resolver answers like ``getaddrinfo`` (numeric spellings as ``inet_aton``
reads them, ``localhost`` names to loopback, a table of internal names) without touching the
network. No traffic leaves the process.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.tools import SystemResolver, ToolContext, ToolOutput, WebFetchTool
from workers.tools.web import IPAddress, blocked_address_reason

PUBLIC = "93.184.216.34"
NAMES = {
    "internal.example": ["10.1.2.3"],
    "metadata.example": ["169.254.169.254"],
    "mixed.example": [PUBLIC, "192.168.0.10"],
    "v6only.example": ["fd00::1"],
    "public.example": [PUBLIC],
}


class GetaddrinfoLike:
    """Answers as the system resolver would, from a table; records every name asked."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """``inet_aton`` spellings, localhost names, the table; anything else does not exist."""
        self.calls.append(host)
        try:
            return [ipaddress.IPv4Address(socket.inet_aton(host))]
        except OSError:
            pass
        name = host.lower().rstrip(".")
        if name == "localhost" or name.endswith(".localhost"):
            return [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
        if name in NAMES:
            return [ipaddress.ip_address(a) for a in NAMES[name]]
        raise OSError(f"unknown host {host!r}")


class Recorder(httpx.AsyncBaseTransport):
    """A transport that records requests and answers from a script (no network at all)."""

    def __init__(self, answer: httpx.Response | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.answer = answer or httpx.Response(200, text="public page")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Record the request; answer the scripted response."""
        self.requests.append(request)
        return httpx.Response(
            self.answer.status_code, headers=self.answer.headers, content=self.answer.content
        )


def _fetch(url: str, transport: Recorder, resolver: Any) -> ToolOutput:
    tool = WebFetchTool(transport=transport, resolver=resolver)
    context = ToolContext(workspace=Path("/tmp"), timeout_s=5.0)
    output: ToolOutput = asyncio.run(tool.run({"url": url}, context))
    return output


def _assert_refused(output: ToolOutput, transport: Recorder) -> None:
    assert output.is_error, output.content
    assert output.metadata["error_type"] == "blocked_url", output.content
    assert output.content.startswith("web_fetch refused")
    assert transport.requests == []


# -- addresses --------------------------------------------------------------------------------

BLOCKED_V4_NETWORKS = [
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "224.0.0.0/4", "240.0.0.0/4", "0.0.0.0/8", "100.64.0.0/10", "198.18.0.0/15",
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "255.255.255.255/32",
]  # fmt: skip
BLOCKED_V6_NETWORKS = [
    "::1/128", "::/128", "fe80::/10", "fc00::/7", "ff00::/8", "fec0::/10", "2001:db8::/32",
    "100::/64", "::/96",
]  # fmt: skip
BLOCKED_V4 = st.one_of(*(st.ip_addresses(network=n) for n in BLOCKED_V4_NETWORKS))
BLOCKED_V6 = st.one_of(*(st.ip_addresses(network=n) for n in BLOCKED_V6_NETWORKS))


def _spellings(address: ipaddress.IPv4Address) -> list[str]:
    """Ways to write one IPv4 host in a URL: dotted, decimal, hex, octal, short, mixed, IPv6."""
    n = int(address)
    a, b, c, d = address.packed
    return [
        str(address),
        str(n),
        f"0x{n:x}",
        f"0x{n:08X}",
        f"0{n:o}",
        f"{a}.{n & 0xFFFFFF}",
        f"{a}.{b}.{n & 0xFFFF}",
        f"0x{a:x}.{n & 0xFFFFFF}",
        f"0x{a:02x}.0x{b:02x}.0x{c:02x}.0x{d:02x}",
        f"[::ffff:{address}]",
        f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]",
        f"[0:0:0:0:0:ffff:{address}]",
        f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::1]",
    ]


@st.composite
def blocked_hosts(draw: st.DrawFn) -> str:
    """A host that leads to a non-public address, however it is spelled."""
    kind = draw(st.sampled_from(["v4", "v4", "v6", "name"]))
    if kind == "v4":
        return draw(st.sampled_from(_spellings(draw(BLOCKED_V4))))
    if kind == "v6":
        return f"[{draw(BLOCKED_V6)}]"
    return draw(
        st.sampled_from(
            [
                "localhost", "LOCALHOST", "localhost.", "LocalHost", "app.localhost",
                "a.b.localhost.", "internal.example", "metadata.example", "mixed.example",
                "v6only.example", "INTERNAL.EXAMPLE",
            ]
        )
    )  # fmt: skip


@st.composite
def blocked_urls(draw: st.DrawFn) -> str:
    """An http(s) URL to a blocked host, with the decorations attackers use."""
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "hTTps"]))
    userinfo = draw(st.sampled_from(["", "user:pw@", f"{PUBLIC}@", "public.example@", "@"]))
    port = draw(st.sampled_from(["", ":80", ":443", ":6379", ":8080", ":0", ":65535"]))
    path = draw(st.text(alphabet="abc/._-%?=&#", max_size=20))
    return f"{scheme}://{userinfo}{draw(blocked_hosts())}{port}/{path}"


@settings(deadline=None, max_examples=300)
@given(blocked_urls())
def test_non_public_targets_are_refused_before_any_connection(url: str) -> None:
    """Loopback, private, link-local, multicast, reserved, mapped and 6to4 addresses, in any
    spelling, with userinfo or ports: refused, and the transport sees no request."""
    transport = Recorder()
    _assert_refused(_fetch(url, transport, GetaddrinfoLike()), transport)


@settings(deadline=None, max_examples=100)
@given(blocked_urls(), st.sampled_from([301, 302, 303, 307, 308]))
def test_a_redirect_to_a_non_public_target_is_refused(url: str, status: int) -> None:
    """A public page redirecting inward: the second hop is refused, only the first was sent."""
    answer = httpx.Response(status, headers={"location": url})
    transport = Recorder(answer)
    output = _fetch("http://public.example/start", transport, GetaddrinfoLike())
    assert output.is_error, output.content
    assert output.metadata["error_type"] == "blocked_url"
    assert [r.url.host for r in transport.requests] == [PUBLIC]


@settings(deadline=None, max_examples=100)
@given(
    st.sampled_from(
        [
            "file", "ftp", "gopher", "dict", "ldap", "ws", "wss", "redis", "jar", "netdoc",
            "sftp", "tftp", "data", "javascript", "about", "chrome", "view-source", "smb",
        ]
    ),
    st.sampled_from(["127.0.0.1", "localhost", "public.example", PUBLIC, ""]),
    st.text(alphabet="abc/.", max_size=10),
)  # fmt: skip
def test_other_schemes_are_refused_before_resolution(scheme: str, host: str, path: str) -> None:
    """Only http and https: any other scheme is refused without resolving or connecting."""
    transport = Recorder()
    resolver = GetaddrinfoLike()
    output = _fetch(f"{scheme}://{host}/{path}", transport, resolver)
    _assert_refused(output, transport)
    assert resolver.calls == []


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/",
        "http://0x7f.1/",
        "http://017700000001/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://0/",
        "http://0.0.0.0:6379/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://[::127.0.0.1]/",
        "http://[2002:7f00:1::]/",
        "http://[2002:a9fe:a9fe::]/latest/meta-data/",
        "http://[fec0::1]/",
        "http://[fe80::1%25eth0]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://127。0。0。1/",
        "http://user:pw@127.0.0.1/",
        "http://public.example@127.0.0.1/",
        "http://127.0.0.1#@public.example/",
        "http://0177.0.0.1/",
        "http:127.0.0.1/",
        "http:/127.0.0.1/",
        "//127.0.0.1/",
        "127.0.0.1",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_INFO",
    ],
)
def test_classic_ssrf_spellings_are_refused(url: str) -> None:
    """The usual SSRF payloads: each refused with a reason, no request sent."""
    transport = Recorder()
    _assert_refused(_fetch(url, transport, GetaddrinfoLike()), transport)


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "017700000001", "127.1", "0"])
def test_numeric_spellings_are_refused_with_the_system_resolver(host: str) -> None:
    """With the real resolver too: getaddrinfo reads these as numbers (no DNS query), and the
    address it gives is refused before any connection."""
    socket.inet_aton(host)  # a numeric spelling: getaddrinfo answers without the network
    transport = Recorder()
    _assert_refused(_fetch(f"http://{host}/", transport, SystemResolver()), transport)


@settings(deadline=None, max_examples=200)
@given(st.one_of(BLOCKED_V4, BLOCKED_V6))
def test_blocked_address_reason_refuses_every_non_public_address(address: IPAddress) -> None:
    """Every address of the blocked ranges has a reason, and so do its mapped and 6to4 forms."""
    assert blocked_address_reason(address) is not None
    if isinstance(address, ipaddress.IPv4Address):
        mapped = ipaddress.IPv6Address(f"::ffff:{address}")
        sixtofour = ipaddress.IPv6Address((0x2002 << 112) | (int(address) << 80) | 1)
        assert blocked_address_reason(mapped) is not None
        assert blocked_address_reason(sixtofour) is not None


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "2002:5db8:d822::1"]
)
def test_public_addresses_are_not_refused(address: str) -> None:
    """The policy is not 'refuse everything': public addresses, and 6to4 of a public one, pass."""
    assert blocked_address_reason(ipaddress.ip_address(address)) is None


def test_a_public_name_is_fetched_through_the_checked_address() -> None:
    """The control case: a public name is fetched, pinned to the address that was checked."""
    transport = Recorder()
    output = _fetch("http://public.example/page", transport, GetaddrinfoLike())
    assert not output.is_error, output.content
    assert [r.url.host for r in transport.requests] == [PUBLIC]
    assert transport.requests[0].headers["host"] == "public.example"
