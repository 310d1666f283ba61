"""Outbound target guard (SSRF), shared by webhook deliveries and the ``http`` step.

A URL is vetted when it is saved and again when it is used: http or https only, no
credentials, control characters or white space in it, and no host that is or resolves to a
loopback, private, link-local, carrier-grade NAT, multicast, reserved, unspecified or
metadata address. The host is checked as it will be connected to: yarl (under aiohttp) maps
a Unicode host by IDNA, so ``127。0。0。1`` or ``①②⑦.0.0.1`` would become ``127.0.0.1``; a
host that is an IP address only after that mapping is refused outright. IPv4-mapped,
NAT64, 6to4 and Teredo IPv6 forms are unwrapped first, any other IPv6 address
outside global unicast (2000::/3) is refused (so IPv4-compatible ``::7f00:1`` is too), and IPv4 written the old BSD ways (``127.1``,
``2130706433``, ``0x7f000001``, ``017700000001``) is read as the address it means.

Checks at connect time make the URL check a second line, not the only one. For a hostname,
every address DNS returns is vetted by :func:`only_reachable` and only the vetted ones are
connected to (no DNS rebinding); a literal address is vetted by :func:`vet_address`. The
``http`` step's aiohttp client gets both through :func:`guarded_connector` (its
:class:`GuardedResolver`, and a check of every socket's address just before it connects);
the webhook client (:mod:`flowhook.webhooks.http`) resolves hosts itself and calls the same
two functions, so nothing reaches an address the policy refuses whatever path the URL took
to it. ``FLOWHOOK_ALLOW_PRIVATE_TARGETS=true``
turns the address checks off (local development).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from flowhook.errors import FlowhookError

__all__ = [
    "TargetRefused",
    "check_url",
    "is_blocked_address",
    "vet_address",
    "only_reachable",
    "GuardedResolver",
    "guarded_connector",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
T = TypeVar("T")

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
# Control characters anywhere in a URL, and in its host also white space and the invisible
# characters that URL parsers drop or fold: such a URL is refused rather than guessed at.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_HOST_INVISIBLE = re.compile(
    r"[\s\xa0\xad\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]"
)
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
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


def is_blocked_address(ip: IPAddress) -> bool:
    """Whether ``ip`` (after unwrapping) is anything but a global unicast address."""
    if ip.version == 6 and ip in _NAT64_LOCAL:
        return True  # local-use NAT64 (RFC 8215): where the IPv4 sits depends on the prefix
    real = _unwrap(ip)
    if real.is_multicast or real.is_unspecified or real.is_loopback or real.is_link_local:
        return True
    if any(real.version == net.version and real in net for net in _EXTRA_BLOCKED):
        return True
    if real.version == 6 and real not in _GLOBAL_UNICAST_V6:
        return True  # also IPv4-compatible ::a.b.c.d and IPv4-translated ::ffff:0:a.b.c.d
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
    bad = _CONTROL.search(url)
    if bad:
        raise TargetRefused(
            f"the URL contains the control character U+{ord(bad.group()):04X}; percent-encode it"
        )
    try:
        parts = urlsplit(url)
        raw_host = parts.hostname
        _ = parts.port  # raises on a bad port
    except ValueError as exc:
        raise TargetRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("the URL must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("the URL must not carry a user name or password")
    if not raw_host:
        raise TargetRefused("the URL has no host")
    if _HOST_INVISIBLE.search(raw_host):
        raise TargetRefused("the URL's host contains white space or an invisible character")
    host = _connect_host(url, raw_host)
    local = host == "localhost" or host.endswith(".localhost")
    ip = _literal_address(host)
    private = local or (ip is not None and is_blocked_address(ip))
    if require_https and parts.scheme != "https" and not (allow_private and private):
        # FLOWHOOK_ALLOW_PRIVATE_TARGETS lets a live endpoint on this machine or network use
        # plain http (local development); a public one is https whatever the setting
        raise TargetRefused(
            "live-mode targets must use https://"
            + (" (plain http:// only to a private or local address)" if allow_private else "")
        )
    if allow_private:
        return url
    if local:
        raise TargetRefused(f"{host} is a local address; {_PRIVATE_HINT}")
    if ip is not None and is_blocked_address(ip):
        raise TargetRefused(f"{ip} is not a public address; {_PRIVATE_HINT}")
    return url


_PRIVATE_HINT = (
    "private targets are not allowed (FLOWHOOK_ALLOW_PRIVATE_TARGETS=true allows them, for "
    "local development)"
)


def _connect_host(url: str, raw_host: str) -> str:
    """The host as aiohttp will connect to it (yarl's IDNA mapping), lower-case, no final dot.

    A host written with non-ASCII characters that maps to an IP address (full-width digits,
    ideographic full stops, circled numbers) is refused whatever the address: no one writes
    a real target that way, and it is the classic way around a guard that reads the raw text.
    """
    try:
        mapped = URL(url).raw_host
    except (ValueError, UnicodeError) as exc:
        raise TargetRefused(f"not a valid URL host: {exc}") from None
    if not mapped:
        raise TargetRefused("the URL has no host")
    host = mapped.rstrip(".").lower()
    if not raw_host.isascii() and _literal_address(host) is not None:
        raise TargetRefused(
            f"the host {raw_host!r} becomes the IP address {host} only after Unicode mapping; "
            "write the address in ASCII digits"
        )
    return host


def vet_address(address: str) -> None:
    """Refuse (:class:`TargetRefused`) an address about to be connected to unless it may be
    reached. ``address`` is an IP address as a resolver or socket gives it; an IPv6 zone
    (``fe80::1%eth0``) is ignored."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise TargetRefused(f"refused to connect to {address!r}: not an IP address") from None
    if is_blocked_address(ip):
        raise TargetRefused(f"{ip} is not a public address; private targets are not allowed")


def only_reachable(host: str, found: Iterable[T], address: Callable[[T], str]) -> list[T]:
    """The items of ``found`` (what resolving ``host`` gave) whose ``address`` may be reached,
    in their order; :class:`TargetRefused` if there are some but none may be. Every client that
    resolves a host itself vets the answer here, so DNS cannot rebind it to a private address."""
    found = list(found)
    allowed = [item for item in found if not _blocked_text(address(item))]
    if found and not allowed:
        raise TargetRefused(f"{host} resolves only to addresses that are not public")
    return allowed


def _blocked_text(address: str) -> bool:
    try:
        return is_blocked_address(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return True  # not an IP address: nothing a resolver should give, so never connected to


def _check_peer(addr_info: tuple[object, ...]) -> socket.socket:
    family, type_, proto, _, sockaddr = addr_info
    vet_address(str(sockaddr[0]))  # type: ignore[index]
    return socket.socket(family=family, type=type_, proto=proto)  # type: ignore[arg-type]


def guarded_connector(*, allow_private: bool = False, **options: Any) -> aiohttp.TCPConnector:
    """A connector whose every connection is vetted: DNS answers by :class:`GuardedResolver`,
    and the address of each socket just before it connects (aiohttp skips the resolver for
    a literal host). ``options`` go to :class:`aiohttp.TCPConnector` (limits)."""
    return aiohttp.TCPConnector(
        resolver=GuardedResolver(allow_private=allow_private),
        socket_factory=None if allow_private else _check_peer,
        **options,
    )


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
        return only_reachable(host, results, lambda result: result["host"])

    async def close(self) -> None:
        await self._inner.close()
