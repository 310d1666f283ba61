"""The webhook sender's HTTP client (flowhook/webhooks/http.py) against real sockets: raw
servers on 127.0.0.1 that answer exactly the bytes each test needs, aiohttp's server, a
TLS server with a certificate made here, and uvloop (what `flowhook serve` runs on)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from flowhook.targets import TargetRefused
from flowhook.webhooks.http import InvalidRequest, ResolveError, ResponseError, WebhookClient
from flowhook.webhooks.sender import send
from tests.conftest import Receiver

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


Answer = bytes | None | list[bytes | float | None]


class Raw:
    """A server that reads each request whole and answers with ``answer(n)`` (the n-th
    request, from 0): ``b""`` says nothing, ``None`` closes the connection without a word,
    and a list is done step by step (bytes written, a float slept, ``None`` the close)."""

    def __init__(self, answer: Callable[[int], Answer]) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""
        self.close_after_answer = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                answer = self.answer(len(self.requests) - 1)
                steps = answer if isinstance(answer, list) else [answer]
                for step in steps:
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    elif step is not None:
                        writer.write(step)
                        await writer.drain()
                if None in steps or self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:  # the test's loop ends while a connection is open
            return
        writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Callable[[int], Answer]], Raw]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Callable[[int], Answer]) -> Raw:
        server = Raw(answer)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(listening)
        server.url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/hook?x=1"
        return server

    yield start
    for listening in servers:
        listening.close()


async def test_one_connection_carries_many_requests(raw: Callable[..., Raw]) -> None:
    server = await raw(
        lambda n: b"HTTP/1.1 201 Created\r\nRetry-After: 3\r\nContent-Length: 5\r\n\r\nhello"
    )
    client = WebhookClient(allow_private=True)
    for n in range(5):
        response = await client.post(server.url, b'{"n": %d}' % n, {"X-Test": "yes"})
        assert (response.status, response.body, response.address) == (201, b"hello", "127.0.0.1")
        assert response.headers["retry-after"] == "3"
    await client.close()
    assert server.connections == 1
    first = server.requests[0]
    port = server.url.split(":")[2].split("/")[0]
    assert first.startswith(b"POST /hook?x=1 HTTP/1.1\r\nHost: 127.0.0.1:" + port.encode())
    assert b"\r\nX-Test: yes\r\n" in first
    assert b"\r\nContent-Length: 8\r\n" in first
    assert first.endswith(b'\r\n\r\n{"n": 0}')


async def test_answers_that_end_their_connection_are_read_whole(raw: Callable[..., Raw]) -> None:
    answers = [
        b"HTTP/1.0 200 OK\r\n\r\nread until the close",  # HTTP/1.0, no length
        b"HTTP/1.1 202 Accepted\r\nConnection: close\r\nContent-Length: 4\r\n\r\ndone",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    ]
    server = await raw(lambda n: answers[n])
    server.close_after_answer = True
    client = WebhookClient(allow_private=True)
    got = [await client.post(server.url, b"{}", {}) for _ in answers]
    await client.close()
    assert [(r.status, r.body) for r in got] == [
        (200, b"read until the close"),
        (202, b"done"),
        (200, b"abcde"),
        (204, b""),
    ]
    assert server.connections == 4


async def test_connection_close_is_honoured_before_the_server_closes(
    raw: Callable[..., Raw],
) -> None:
    server = await raw(
        lambda n: b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    client = WebhookClient(allow_private=True)  # the server leaves the socket open: ours closes
    for _ in range(2):
        assert (await client.post(server.url, b"{}", {})).status == 200
    await client.close()
    assert server.connections == 2


async def test_a_kept_connection_the_server_closed_is_replaced(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK)
    server.close_after_answer = True  # while keeping the connection alive by the headers
    client = WebhookClient(allow_private=True)
    assert (await client.post(server.url, b"{}", {})).status == 200
    await asyncio.sleep(0.05)  # the close arrives while the connection sits in the pool
    assert (await client.post(server.url, b"{}", {})).status == 200
    await client.close()
    assert (server.connections, len(server.requests)) == (2, 2)


async def test_a_connection_that_dies_in_the_pool_unnoticed_is_retried_once(
    raw: Callable[..., Raw],
) -> None:
    server = await raw(lambda n: OK)
    client = WebhookClient(allow_private=True)
    assert (await client.post(server.url, b"{}", {})).status == 200
    # the server reads the next request on the kept connection, then drops it unanswered
    server.answer = lambda n: None if n == 1 else OK
    assert (await client.post(server.url, b"{}", {})).status == 200
    await client.close()
    assert (server.connections, len(server.requests)) == (2, 3)


async def test_a_new_connection_closed_without_an_answer_is_an_error(
    raw: Callable[..., Raw],
) -> None:
    server = await raw(lambda n: None)
    client = WebhookClient(allow_private=True)
    with pytest.raises(ResponseError, match="closed the connection without answering"):
        await client.post(server.url, b"{}", {})
    assert len(server.requests) == 1  # sent once: a fresh connection is not retried


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"SMTP ready\r\n\r\n", "not valid HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n", "in the middle of the answer"),
    ],
)
async def test_what_is_not_an_answer_is_an_error(
    raw: Callable[..., Raw], answer: bytes, error: str
) -> None:
    server = await raw(lambda n: answer)
    server.close_after_answer = True
    client = WebhookClient(allow_private=True)
    with pytest.raises(ResponseError, match=error):
        await client.post(server.url, b"{}", {})


async def test_a_long_answer_is_cut_to_the_excerpt_and_its_connection_closed(
    raw: Callable[..., Raw],
) -> None:
    body = b"x" * 5000
    server = await raw(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + body)
    client = WebhookClient(allow_private=True, excerpt=1000)
    first = await client.post(server.url, b"{}", {})
    second = await client.post(server.url, b"{}", {})
    assert (first.body, second.body) == (body[:1000], body[:1000])
    assert server.connections == 2
    assert not client._idle.get(next(iter(client._idle), ("", "", 0)))


async def test_idle_connections_are_closed_when_they_expire(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK)
    client = WebhookClient(allow_private=True, idle_seconds=0.3)
    await client.post(server.url, b"{}", {})
    [kept] = client._idle[next(iter(client._idle))]
    assert not kept.closed
    await asyncio.sleep(0.6)  # no request meanwhile: the timer closes it and lets it go
    assert kept.closed
    assert client._idle == {}
    await client.post(server.url, b"{}", {})
    await client.close()
    assert server.connections == 2


async def test_the_answer_decides_whether_its_connection_is_kept(raw: Callable[..., Raw]) -> None:
    answers = [
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",  # 1.0: not kept
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ]
    server = await raw(lambda n: answers[n])  # the server never closes: the client decides
    client = WebhookClient(allow_private=True)
    assert [(await client.post(server.url, b"{}", {})).body for _ in answers] == [b"ok"] * 3
    await client.close()
    assert server.connections == 2


async def test_a_body_in_several_writes_is_read_to_its_end(raw: Callable[..., Raw]) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    # the last chunk a moment later, as a streaming framework writes it
    server = await raw(lambda n: [head + b"3\r\nack\r\n", 0.02, b"0\r\n\r\n"])
    client = WebhookClient(allow_private=True)
    for _ in range(2):
        assert (await client.post(server.url, b"{}", {})).body == b"ack"
    await client.close()
    assert server.connections == 1  # read to its end, so kept


async def test_a_large_body_in_one_read_is_not_taken_for_large_headers(
    raw: Callable[..., Raw],
) -> None:
    body = b"y" * 200_000
    server = await raw(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n" + body)
    client = WebhookClient(allow_private=True)
    response = await client.post(server.url, b"{}", {})
    await client.close()
    assert (response.status, response.body) == (200, body[: client.excerpt])


async def test_an_interim_answer_then_a_close_is_not_sent_again(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK if n == 0 else [b"HTTP/1.1 100 Continue\r\n\r\n", None])
    client = WebhookClient(allow_private=True)
    await client.post(server.url, b"{}", {})
    with pytest.raises(ResponseError, match="in the middle of the answer"):
        await client.post(server.url, b"{}", {})  # on the kept connection: it was heard
    assert len(server.requests) == 2


async def test_a_slow_body_is_answered_with_what_came(raw: Callable[..., Raw]) -> None:
    # the first chunk of the body, then nothing: the status stands (no timeout, no retry)
    server = await raw(
        lambda n: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nack\r\n"
    )
    client = WebhookClient(allow_private=True)
    async with asyncio.timeout(2):
        response = await client.post(server.url, b"{}", {})
    assert (response.status, response.body) == (200, b"ack")
    assert not any(client._idle.values())  # its connection is not kept


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000, "headers exceed 65536 bytes"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n", "more than 100 header lines"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: ws\r\nConnection: upgrade\r\n\r\n", "101"),
    ],
)
async def test_answers_too_big_or_not_http_fail_the_attempt(
    raw: Callable[..., Raw], answer: bytes, error: str
) -> None:
    server = await raw(lambda n: answer)
    client = WebhookClient(allow_private=True)
    with pytest.raises(ResponseError, match=error):
        await client.post(server.url, b"{}", {})


async def test_bytes_after_an_answer_do_not_spoil_the_next(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK + b"HTTP/1.1 5" if n == 0 else OK)
    client = WebhookClient(allow_private=True)
    for _ in range(2):
        assert (await client.post(server.url, b"{}", {})).status == 200
    await client.close()
    assert server.connections == 2


async def test_a_header_with_a_line_break_is_refused(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK)
    client = WebhookClient(allow_private=True)
    for bad in ({"X-Event": "a\r\nX-Injected: 1"}, {"X-Event": "a\nb"}, {"X\rY": "1"}):
        with pytest.raises(InvalidRequest, match="line break"):
            await client.post(server.url, b"{}", bad)
    assert server.requests == []


@pytest.mark.parametrize("hangs", [False, True])
async def test_the_next_address_is_tried_when_one_fails_or_is_slow(
    raw: Callable[..., Raw], monkeypatch: pytest.MonkeyPatch, hangs: bool
) -> None:
    server = await raw(lambda n: OK)
    client = WebhookClient(allow_private=True)
    loop = asyncio.get_running_loop()
    connect = loop.create_connection

    async def addresses(target: object) -> list[tuple[int, str]]:
        return [(socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")]

    async def create_connection(factory: Any, host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "::1" and hangs:  # a route that drops the SYN: no answer, ever
            await asyncio.sleep(3600)
        return await connect(factory, host, *args, **kwargs)  # ::1: refused (IPv4 server)

    monkeypatch.setattr(client, "_addresses", addresses)
    monkeypatch.setattr(loop, "create_connection", create_connection)
    async with asyncio.timeout(3):  # one after the other, the hanging one would take it all
        assert (await client.post(server.url, b"{}", {})).status == 200
    await client.close()
    assert server.connections == 1


def test_addresses_alternate_by_family() -> None:
    from flowhook.webhooks.http import _interleaved

    assert _interleaved([(10, "a"), (10, "b"), (10, "c"), (2, "x")]) == [
        (10, "a"), (2, "x"), (10, "b"), (10, "c"),
    ]  # fmt: skip


async def test_a_request_cut_short_closes_its_connection(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: b"" if n == 1 else OK)  # the second request gets no answer
    client = WebhookClient(allow_private=True)
    await client.post(server.url, b"{}", {})
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await client.post(server.url, b"{}", {})
    assert not any(client._idle.values())
    assert (await client.post(server.url, b"{}", {})).status == 200
    await client.close()
    assert server.connections == 2


async def test_the_guard_refuses_private_addresses_and_names(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK)
    port = server.url.split(":")[2].split("/")[0]
    client = WebhookClient()
    for url in (server.url, f"http://localhost:{port}/", f"http://[::ffff:127.0.0.1]:{port}/"):
        with pytest.raises(TargetRefused, match=r"not (a )?public"):
            await client.post(url, b"{}", {})
    assert server.connections == 0


@pytest.mark.parametrize("url", ["ftp://example.com/", "http:///no-host", "http://[::1/"])
async def test_a_url_it_cannot_send_to_is_refused_before_any_connection(url: str) -> None:
    with pytest.raises(InvalidRequest):
        await WebhookClient().post(url, b"{}", {})


async def test_a_path_cannot_add_a_header(raw: Callable[..., Raw]) -> None:
    server = await raw(lambda n: OK)
    client = WebhookClient(allow_private=True)
    await client.post(server.url + "\r\nX-Injected: 1 /a b", b"{}", {})
    await client.close()
    [request] = server.requests
    assert request.startswith(b"POST /hook?x=1X-Injected:+1+/a+b HTTP/1.1\r\n")
    assert b"\r\nX-Injected" not in request


async def test_a_name_without_an_address_is_a_dns_error() -> None:
    with pytest.raises(ResolveError, match=r"cannot resolve nothing-here\.invalid"):
        await WebhookClient().post("http://nothing-here.invalid/", b"{}", {})


async def test_the_sender_classifies_what_the_client_raises(
    raw: Callable[..., Raw], receiver: Receiver
) -> None:
    client = WebhookClient(allow_private=True)

    async def attempt(url: str, **options: object) -> tuple[str | None, str | None]:
        result = await send(
            client, url, b"{}", {}, timeout=float(options.pop("timeout", 2)), allow_private=True,
            **options,  # type: ignore[arg-type]
        )  # fmt: skip
        return result.error_class, result.error_detail

    receiver.script = [(301, "https://elsewhere.example/"), (429, {}), (503, {}), (404, {})]
    assert await attempt(f"{receiver.url}/a") == (
        "redirect",
        "answered 301 redirecting to 'https://elsewhere.example/'; redirects are not followed: "
        "register the final URL",
    )
    assert await attempt(f"{receiver.url}/a", retry_throttled=True) == ("throttled", "answered 429")
    assert await attempt(f"{receiver.url}/a") == ("http_5xx", "answered 503")
    assert await attempt(f"{receiver.url}/a") == ("http_4xx", "answered 404")
    receiver.delay = 1.0
    assert await attempt(f"{receiver.url}/a", timeout=0.2) == ("timeout", "no answer within 0.2 s")
    assert (await attempt("http://127.0.0.1:9/"))[0] == "connection"
    assert (await attempt("http://nothing-here.invalid/"))[0] == "dns"
    silent = await raw(lambda n: None)
    assert await attempt(silent.url) == (
        "connection",
        "the server closed the connection without answering",
    )
    await client.close()


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flowhook test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_tls_is_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert_file, key_file = _certificate(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert_file, key_file)
    server = Raw(lambda n: OK)
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=server_side)
    url = f"https://127.0.0.1:{listening.sockets[0].getsockname()[1]}/hook"
    try:
        untrusted = WebhookClient(allow_private=True)
        result = await send(untrusted, url, b"{}", {}, timeout=5, allow_private=True)
        assert result.error_class == "tls"
        assert "CERTIFICATE_VERIFY_FAILED" in (result.error_detail or "")
        trusting = WebhookClient(
            allow_private=True, ssl_context=ssl.create_default_context(cafile=str(cert_file))
        )
        for _ in range(2):
            assert (await trusting.post(url, b"{}", {})).status == 200
        # a name written with its final dot is checked against the certificate without it
        # (resolved here by hand: this machine's resolver may not know "localhost.")

        async def local(target: object) -> list[tuple[int, str]]:
            return [(socket.AF_INET, "127.0.0.1")]

        monkeypatch.setattr(trusting, "_addresses", local)
        dotted = url.replace("127.0.0.1", "localhost.")
        assert (await trusting.post(dotted, b"{}", {})).status == 200
        await trusting.close()
        assert server.connections == 2  # the refused handshake never got to it
    finally:
        listening.close()


def test_it_runs_on_uvloop() -> None:
    """`flowhook serve` runs its engine on uvloop, whose transports are not asyncio's."""

    async def main() -> tuple[int, int]:
        server = Raw(lambda n: OK)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/"
        client = WebhookClient(allow_private=True)
        statuses = [(await client.post(url, b"{}", {})).status for _ in range(3)]
        await client.close()
        listening.close()
        assert statuses == [200, 200, 200]
        return server.connections, len(server.requests)

    assert uvloop.run(main()) == (1, 3)
