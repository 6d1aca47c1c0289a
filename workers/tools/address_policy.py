"""The address policy of the tools that reach a host a task names (``web_fetch``, a task's MCP
server over streamable HTTP): which addresses they may connect to.

The host is resolved and *every* address it resolves to is checked; a loopback, private,
link-local, multicast, reserved, unspecified or otherwise non-global address refuses the whole
host (IPv4-mapped and 6to4 IPv6 addresses are checked as the IPv4 address they carry;
site-local ``fec0::/10`` is refused). One policy in one place, so that a rule added for one
tool holds for the other. The caller then connects to the addresses that were checked, not to
a second DNS answer (a rebinding DNS server cannot swap in an internal address after the
check); the operator's ``ORGA_ALLOW_PRIVATE_NETWORK`` (``ToolContext.allow_private_network``)
lifts the policy, for a local development server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Protocol

from workers.tools.errors import BlockedAddressError

__all__ = [
    "BLOCKED_KINDS",
    "IPAddress",
    "Resolver",
    "SystemResolver",
    "blocked_address_reason",
    "checked_addresses",
    "ip_literal",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

BLOCKED_KINDS = "loopback, private, link-local, multicast, reserved and unspecified"
"""What an error says is blocked (the kinds :func:`blocked_address_reason` names)."""


class Resolver(Protocol):
    """Turns a host name into the addresses a connection could reach."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address of ``host``; raises OSError when the name does not resolve."""
        ...


class SystemResolver:
    """The operating system's resolver (``getaddrinfo``), run off the event loop."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every distinct address of ``host``, in the resolver's order."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses: list[IPAddress] = []
        for *_rest, sockaddr in infos:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in addresses:
                addresses.append(address)
        return addresses


def blocked_address_reason(address: IPAddress) -> str | None:
    """Why ``address`` may not be reached (``"loopback"``, ``"private"``, ...), or None.

    An IPv6 address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, 6to4
    ``2002:aabb:ccdd::``) is judged by the IPv4 address it leads to; site-local ``fec0::/10``
    (deprecated, still routed inside some networks) is refused.
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is not None:
            return blocked_address_reason(embedded)
        if address.is_site_local:
            return "site-local"
    checks = (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("non-global", not address.is_global),
    )
    return next((label for label, blocked in checks if blocked), None)


def ip_literal(host: str) -> IPAddress | None:
    """``host`` as an address when it is one (``127.0.0.1``, ``::1``), else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def checked_addresses(
    host: str, port: int, resolver: Resolver, *, allow_private: bool
) -> list[IPAddress]:
    """The addresses of ``host`` (an address itself, or a name resolved by ``resolver``), in
    connection order, every one allowed by the policy unless ``allow_private``.

    Raises :class:`BlockedAddressError` naming the first address refused and its kind, and
    OSError when the name does not resolve (or resolves to no address)."""
    literal = ip_literal(host)
    addresses = [literal] if literal is not None else await resolver.resolve(host, port)
    if not addresses:
        raise OSError(f"host {host!r} resolves to no address")
    if allow_private:
        return addresses
    for address in addresses:
        reason = blocked_address_reason(address)
        if reason is not None:
            raise BlockedAddressError(host, address, reason, literal=literal is not None)
    return addresses
