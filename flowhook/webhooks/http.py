"""The webhook sender's HTTP/1.1 client: one POST at a time per connection, kept alive.

A delivery needs little of a general HTTP client: a POST of a body already built, the
status, two headers (``Location``, ``Retry-After``) and the first bytes of the answer.
aiohttp's client spent ~170 µs of CPU a request on its session, URL, header and timeout
machinery, a third of the engine process when it sends a few thousand deliveries a second
(bench/README.md, "A lean client for deliveries"). This one writes the request in one piece
and reads the answer with httptools (llhttp, the parser under uvicorn): ~40 µs a request.
``http`` steps still use aiohttp, which they need for methods, redirects and bodies.

**The target guard** (:mod:`flowhook.targets`) holds at connect time: the host is resolved
here, every address is vetted, and the socket is opened to a vetted address, never to the
name again, so DNS rebinding gets nowhere. A literal address is vetted the same way.
``allow_private`` turns the address checks off (local development). Of several addresses
the next is tried when one fails, or alongside it after ``STAGGER`` (happy eyeballs).

**Connections** are kept per origin (scheme, host, port) after an answer that allows it
(HTTP/1.1 without ``Connection: close``, read to its end), for at most ``IDLE_SECONDS``.
A kept connection that the server closed while it sat idle fails before the first byte
of an answer: the request then goes once more, on a new connection. The receiver did not
answer it, so at most it sees the attempt twice, with the same ``webhook-id``; deliveries
are at least once anyway. Redirects are not followed, bodies are not decompressed (no
``Accept-Encoding`` is sent), and an answer longer than the excerpt closes its connection.

**What an answer is**: its status stands once its headers are in. The body is read until it
ends or fills the excerpt; a body still coming ``BODY_GRACE`` after its first bytes is taken
as it is and its connection closed (a receiver streaming its answer is not a timeout). Headers longer
than ``MAX_HEAD_BYTES`` or more than ``MAX_HEADERS`` lines, a protocol switch (101), bytes
that are not HTTP, or bytes no request asked for fail the attempt or drop the connection:
a receiver cannot make the sender buffer without bound. Header values we send may not hold
a line break.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import httptools
from yarl import URL

from flowhook.targets import only_reachable, vet_address

__all__ = [
    "EXCERPT_BYTES",
    "IDLE_SECONDS",
    "Response",
    "ResolveError",
    "ResponseError",
    "WebhookClient",
]

EXCERPT_BYTES = 16 * 1024
"""How much of an answer's body is read (and logged with the attempt)."""

IDLE_SECONDS = 15.0
"""How long a connection may sit unused and still be used again (aiohttp's default too)."""

MAX_HEAD_BYTES = 64 * 1024
"""An answer's status line and headers may be this long; longer fails the attempt."""

MAX_HEADERS = 100
"""An answer may have this many header lines."""

BODY_GRACE = 0.1
"""Seconds an answer's body may take to end after its first bytes came; past that the
attempt is answered with what came (a receiver streaming its answer is not a timeout)."""

STAGGER = 0.25
"""Seconds before the next address of a host is tried alongside one not connected yet."""

_TARGETS_KEPT = 1024
"""URLs whose parsed form is kept (a dispatcher sends to a few endpoints again and again)."""


class InvalidRequest(ValueError):
    """The URL cannot be sent to (the target guard refuses most such URLs first), or a
    header holds a line break."""


class ResolveError(OSError):
    """DNS gave no address for the host."""


class ResponseError(OSError):
    """The connection ended before an answer, or the answer was not HTTP."""


class _Stale(Exception):
    """A kept connection ended before the first byte of an answer."""


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]
    """Names in lower case; of a repeated header, the last."""
    body: bytes
    """At most the client's ``excerpt`` bytes of the body."""
    address: str | None
    """The peer's IP address."""


@dataclass(frozen=True, slots=True)
class _Target:
    origin: tuple[str, str, int]
    host: str
    """As connected to: IDNA-mapped, no brackets around an IPv6 address."""
    port: int
    tls: bool
    head: bytes
    """The request line and ``Host`` header."""


def _target(url: str) -> _Target:
    try:
        parsed = URL(url)
        scheme, host, port = parsed.scheme, parsed.raw_host, parsed.port
    except (ValueError, UnicodeError) as exc:
        raise InvalidRequest(f"not a valid URL: {url}: {exc}") from None
    if scheme not in ("http", "https") or not host or port is None:
        raise InvalidRequest(f"not a valid URL: {url}: not http or https with a host")
    path = parsed.raw_path_qs or "/"  # yarl percent-encodes it and drops CR and LF
    authority = f"[{host}]" if ":" in host else host
    if port != (443 if scheme == "https" else 80):
        authority = f"{authority}:{port}"
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n".encode("ascii")
    except UnicodeEncodeError:  # yarl encodes both; never sent as raw bytes if not
        raise InvalidRequest(f"not a valid URL: {url}: not ASCII once encoded") from None
    return _Target((scheme, host, port), host, port, scheme == "https", head)


class _Connection(asyncio.Protocol):
    """One connection and the answer it is waiting for (httptools calls the ``on_*``)."""

    def __init__(self, excerpt: int) -> None:
        self.transport: asyncio.Transport | None = None
        self.address: str | None = None
        self.closed = False
        self.expiry: asyncio.TimerHandle | None = None
        """While the connection is kept: the client's timer that closes it and lets it go
        when it has sat idle too long (it also lets go of one the server closed)."""
        self._excerpt = excerpt
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Response] | None = None
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._heard = False
        """Whether any byte of the answer came."""
        self._head_bytes = 0
        """Bytes of the answer while its headers were not complete."""
        self._header_lines = 0
        self._headers_done = False
        self._grace: asyncio.TimerHandle | None = None
        """Answers with the part of the body that came, if the rest is slow to come."""

    # -- asyncio -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else None

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes no request asked for: not a connection to keep
            self.close()
            return
        self._heard = True
        if not self._headers_done:  # at most MAX_HEAD_BYTES before the headers' end
            room = MAX_HEAD_BYTES - self._head_bytes
            self._head_bytes += len(data)
            if len(data) > room:
                if not self._feed(data[:room]):
                    return
                if not self._headers_done:
                    self._fail(ResponseError(f"the answer's headers exceed {MAX_HEAD_BYTES} bytes"))
                    return
                data = data[room:]
        if not self._feed(data) or self._waiter is None:
            return
        if self._header_lines > MAX_HEADERS:
            self._fail(ResponseError(f"the answer has more than {MAX_HEADERS} header lines"))
        elif self._body and self._grace is None:  # the body's end is still to come
            self._grace = asyncio.get_running_loop().call_later(BODY_GRACE, self._as_it_is)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_grace()
        if self._waiter is None:
            return
        if self._headers_done:  # the status stands; the body is what came
            self._answer(keep=False)
        elif self._heard:
            self._fail(ResponseError("the connection closed in the middle of the answer"))
        else:
            self._fail(_Stale())

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; False when the answer failed."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ResponseError("the answer switches protocols (101); webhooks need HTTP"))
            return False
        except httptools.HttpParserError as exc:
            self._fail(ResponseError(f"the answer is not valid HTTP: {exc}"))
            return False
        return True

    def _as_it_is(self) -> None:
        """The rest of the body is slow: answer with its first bytes (the status stands)."""
        self._grace = None
        if self._waiter is not None:
            self._answer(keep=False)

    # -- httptools ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None:  # an answer nobody asked for: the connection is spoilt
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._waiter is not None:
            self._header_lines += 1
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if self._waiter is None:
            return
        room = self._excerpt - len(self._body)
        if room > 0:
            self._body += body[:room]
        if len(body) >= room:  # more than the excerpt: stop reading, never reuse
            self._answer(keep=False)

    def on_message_complete(self) -> None:
        if self._waiter is None:
            return
        if self._parser.get_status_code() < 200:  # an interim answer (100 Continue): the next
            self._headers = {}
            self._headers_done = False
            self._head_bytes = self._header_lines = 0
            return
        self._answer(keep=self._parser.should_keep_alive())

    # -- the client's side -------------------------------------------------------------

    async def request(self, data: bytes) -> Response:
        if self.closed or self.transport is None or self.transport.is_closing():
            raise _Stale()
        self._waiter = asyncio.get_running_loop().create_future()
        self._headers = {}
        self._body = bytearray()
        self._heard = False
        self._head_bytes = self._header_lines = 0
        self._headers_done = False
        self.transport.write(data)
        return await self._waiter

    def close(self) -> None:
        self.closed = True
        self._cancel_grace()
        if self.transport is not None:
            self.transport.close()

    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _answer(self, *, keep: bool) -> None:
        waiter, self._waiter = self._waiter, None
        self._cancel_grace()
        if not keep:
            self.close()
        status = self._parser.get_status_code()
        response = Response(status, self._headers, bytes(self._body), self.address)
        self._headers = {}
        self._body = bytearray()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class WebhookClient:
    """POSTs to webhook endpoints over kept-alive connections; see the module's docstring.

    Raises :class:`InvalidRequest` for a URL it cannot send to or a header with a line
    break, :class:`~flowhook.targets.TargetRefused` for an address the guard refuses,
    :class:`ResolveError` when DNS finds nothing, :class:`ssl.SSLError` for TLS,
    :class:`ResponseError` for a connection that ended without an answer or answered
    something other than HTTP, and any other :class:`OSError` of the connection. Time
    limits are the caller's (``asyncio.timeout``); a request cut short closes its
    connection."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        excerpt: int = EXCERPT_BYTES,
        idle_seconds: float = IDLE_SECONDS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.allow_private = allow_private
        self.excerpt = excerpt
        self.idle_seconds = idle_seconds
        self._ssl = ssl_context
        self._targets: dict[str, _Target] = {}
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._closed = False

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Response:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= _TARGETS_KEPT:
                self._targets.clear()
            target = self._targets[url] = _target(url)
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
            raise InvalidRequest("a header name or value holds a line break")
        data = b"".join(
            (target.head, lines.encode(), b"Content-Length: %d\r\n\r\n" % len(body), body)
        )
        kept = self._take(target.origin)
        if kept is not None:
            try:
                return await self._exchange(kept, target, data)
            except _Stale:
                pass  # closed by the server while it sat idle: once more, on a new connection
        try:
            return await self._exchange(await self._connect(target), target, data)
        except _Stale:
            raise ResponseError("the server closed the connection without answering") from None

    async def close(self) -> None:
        """Close every idle connection; a request still in flight closes its own when it
        ends."""
        self._closed = True
        for kept in self._idle.values():
            for conn in kept:
                if conn.expiry is not None:
                    conn.expiry.cancel()
                conn.close()
        self._idle.clear()

    async def _exchange(self, conn: _Connection, target: _Target, data: bytes) -> Response:
        done = False
        try:
            response = await conn.request(data)
            done = True
        finally:
            if not done:
                conn.close()
        if self._closed:
            conn.close()
        elif not conn.closed:
            loop = asyncio.get_running_loop()
            conn.expiry = loop.call_later(self.idle_seconds, self._expire, target.origin, conn)
            self._idle.setdefault(target.origin, []).append(conn)
        return response

    def _take(self, origin: tuple[str, str, int]) -> _Connection | None:
        kept = self._idle.get(origin)
        while kept:
            conn = kept.pop()  # the most recently used: the likeliest to be open still
            if conn.expiry is not None:
                conn.expiry.cancel()
                conn.expiry = None
            if not conn.closed:
                return conn
        return None

    def _expire(self, origin: tuple[str, str, int], conn: _Connection) -> None:
        """Let go of a connection kept for ``idle_seconds`` (or closed by the server
        meanwhile): close it and take it out of the pool."""
        conn.expiry = None
        conn.close()
        kept = self._idle.get(origin, [])
        if conn in kept:
            kept.remove(conn)
        if not kept:
            self._idle.pop(origin, None)

    async def _connect(self, target: _Target) -> _Connection:
        """A connection to the first of the vetted addresses that answers. The next address
        is tried when one fails, or alongside it when it has not connected within
        ``STAGGER`` seconds (happy eyeballs, RFC 8305; families alternate)."""
        loop = asyncio.get_running_loop()
        context = self._ssl_context() if target.tls else None
        hostname = target.host.rstrip(".") if context is not None else None

        async def attempt(family: int, address: str) -> _Connection:
            _, conn = await loop.create_connection(
                lambda: _Connection(self.excerpt),
                address,
                target.port,
                family=family,
                ssl=context,
                server_hostname=hostname,
            )
            return conn

        addresses = _interleaved(await self._addresses(target))
        if len(addresses) == 1:
            return await attempt(*addresses[0])
        started: list[asyncio.Task[_Connection]] = []
        winner: asyncio.Task[_Connection] | None = None
        failure: BaseException | None = None
        try:
            pending: set[asyncio.Task[_Connection]] = set()
            while addresses or pending:
                if addresses:
                    started.append(asyncio.ensure_future(attempt(*addresses.pop(0))))
                    pending.add(started[-1])
                done, pending = await asyncio.wait(
                    pending,
                    timeout=STAGGER if addresses else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        winner = task
                        return task.result()
                    if isinstance(exc, ssl.SSLError):
                        raise exc  # the host's certificate: the same at every address
                    failure = failure or exc
        finally:
            for task in started:  # all but the winner: cancelled, or closed if they connected
                if task is winner:
                    continue
                if task.done():
                    _discard(task)
                else:
                    task.cancel()
                    task.add_done_callback(_discard)
        raise failure or ResponseError("no address to connect to")

    async def _addresses(self, target: _Target) -> list[tuple[int, str]]:
        """The addresses to try, each vetted unless private targets are allowed."""
        try:
            literal = ipaddress.ip_address(target.host)
        except ValueError:
            literal = None
        if literal is not None:
            if not self.allow_private:
                vet_address(str(literal))
            return [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ResolveError(f"cannot resolve {target.host}: {exc.strerror}") from None
        found: list[tuple[int, str]] = []
        for family, _, _, _, sockaddr in infos:
            address = (int(family), str(sockaddr[0]))
            if address not in found:
                found.append(address)
        if not self.allow_private:
            found = only_reachable(target.host, found, lambda item: item[1])
        if not found:
            raise ResolveError(f"cannot resolve {target.host}: no address")
        return found

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:  # made on first use: loading the CA store takes milliseconds
            self._ssl = ssl.create_default_context()
        return self._ssl


def _discard(task: asyncio.Task[_Connection]) -> None:
    """Close the connection of a connect attempt that lost the race (or read its error)."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def _interleaved(addresses: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The addresses with their families alternating, the first family first (RFC 8305)."""
    first = [a for a in addresses if a[0] == addresses[0][0]]
    other = [a for a in addresses if a[0] != addresses[0][0]]
    mixed = [a for pair in zip(first, other, strict=False) for a in pair]
    return mixed + first[len(other) :] + other[len(first) :]
