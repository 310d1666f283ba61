"""Outbound target guard (SSRF), shared by webhook deliveries and the ``http`` step.

A URL is vetted when it is saved and again when it is used: http or https only, no
credentials in it, and no host that is or resolves to a loopback, private, link-local,
carrier-grade NAT, multicast, reserved, unspecified or metadata address. IPv4-mapped,
NAT64 and 6to4 IPv6 forms are unwrapped first, and IPv4 written the old BSD ways (``127.1``,
``2130706433``, ``0x7f000001``, ``017700000001``) is read as the address it means. For a
hostname, :class:`GuardedResolver` vets every address DNS returns and hands aiohttp only the
vetted ones, so a connection goes to the address that was checked (no DNS rebinding).
``FLOWHOOK_ALLOW_PRIVATE_TARGETS=true`` turns the address checks off (local development).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from flowhook.errors import FlowhookError

__all__ = ["TargetRefused", "check_url", "is_blocked_address", "GuardedResolver"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_EXTRA_BLOCKED = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT
        "192.0.0.0/24",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "fd00:ec2::/32",  # cloud metadata over IPv6 (inside fc00::/7 too)
    )
]


class TargetRefused(FlowhookError):
    """A URL or address that outbound requests may not reach."""

    code = "destination_blocked"


def _unwrap(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64 or ip in _NAT64_LOCAL:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


def is_blocked_address(ip: IPAddress) -> bool:
    """Whether ``ip`` (after unwrapping) is anything but a global unicast address."""
    real = _unwrap(ip)
    if real.is_multicast or real.is_unspecified or real.is_loopback or real.is_link_local:
        return True
    if any(real.version == net.version and real in net for net in _EXTRA_BLOCKED):
        return True
    return not real.is_global


def _literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host.replace(".", "").replace("x", "").replace("X", "").isalnum() and any(
        c.isdigit() for c in host
    ):
        try:  # the BSD forms browsers accept: 127.1, 2130706433, 0x7f000001, 017700000001
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def check_url(url: str, *, allow_private: bool = False, require_https: bool = False) -> str:
    """Return ``url`` if outbound requests may go there; raise :class:`TargetRefused` saying why."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises on a bad port
    except ValueError as exc:
        raise TargetRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("the URL must start with http:// or https://")
    if require_https and parts.scheme != "https":
        raise TargetRefused("live-mode targets must use https://")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("the URL must not carry a user name or password")
    if not host:
        raise TargetRefused("the URL has no host")
    if allow_private:
        return url
    host = host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        raise TargetRefused(f"{host} is a local address; private targets are not allowed")
    ip = _literal_address(host)
    if ip is not None and is_blocked_address(ip):
        raise TargetRefused(f"{ip} is not a public address; private targets are not allowed")
    return url


class GuardedResolver(AbstractResolver):
    """Resolves with the default resolver and keeps only addresses that may be reached."""

    def __init__(self, *, allow_private: bool = False) -> None:
        self._inner = DefaultResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if self._allow_private:
            return results
        allowed = [r for r in results if not is_blocked_address(ipaddress.ip_address(r["host"]))]
        if not allowed:
            raise TargetRefused(f"{host} resolves only to addresses that are not public")
        return allowed

    async def close(self) -> None:
        await self._inner.close()
