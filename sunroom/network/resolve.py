"""Name resolution for the egress proxy, and the check every resolved address must pass.

A name is resolved once per connection, on the host; every address of the answer is checked,
and the proxy connects to one of those checked addresses (never resolving again), so a name
that answers a public address first and a private one later gains nothing (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping

__all__ = ["HostResolver", "Resolver", "address_refusal"]

Resolver = Callable[[str], Awaitable[list[str]]]
"""``async (host) -> [ip, ...]``: the addresses a (normalized) host name resolves to."""

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class HostResolver:
    """The default resolver: ``hosts`` first (like /etc/hosts), then the loop's getaddrinfo."""

    def __init__(self, hosts: Mapping[str, str]) -> None:
        self._hosts = dict(hosts)

    async def __call__(self, host: str) -> list[str]:
        """The addresses of ``host`` (IPv4 and IPv6, in getaddrinfo's order, no duplicates)."""
        fixed = self._hosts.get(host)
        if fixed is not None:
            return [fixed]
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, None, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM
        )
        return list(dict.fromkeys(str(info[4][0]) for info in infos))


def address_refusal(address: str, allowed: tuple[Network, ...]) -> str | None:
    """Why ``address`` may not be connected to, or None if it may.

    Multicast and unspecified addresses are always refused; any other address that is not
    globally routable (private, loopback, link-local, shared, documentation, reserved, ...) is
    refused unless it lies inside one of ``allowed``. An IPv4-mapped IPv6 address is judged
    as the IPv4 address it carries.
    """
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip.scope_id:
            return f"{address} has a scope id"
    if ip.is_multicast or ip.is_unspecified:
        return f"{ip} is a multicast or unspecified address"
    if any(ip in net for net in allowed):
        return None
    if ip.is_reserved and not ip.is_loopback:  # Python counts ::1 as reserved (::/8)
        return f"{ip} is a reserved address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None
