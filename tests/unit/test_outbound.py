"""One classification of failed outbound requests, for webhook attempts and http steps."""

from __future__ import annotations

import socket
import ssl

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from flowhook.outbound import classify
from flowhook.targets import TargetRefused

KEY = ConnectionKey("example.com", 443, True, True, None, None, None)
REFUSED = TargetRefused("10.0.0.1 is not a public address; private targets are not allowed")


def _guarded() -> aiohttp.ClientConnectorError:
    exc = aiohttp.ClientConnectorError(KEY, OSError(1, "refused by the guard"))
    exc.__cause__ = REFUSED
    return exc


CASES = [
    (REFUSED, "destination_blocked", REFUSED.message, False),
    (_guarded(), "destination_blocked", REFUSED.message, False),
    (aiohttp.ClientConnectorDNSError(KEY, socket.gaierror(-2, "Name unknown")), "dns", None, True),
    (aiohttp.ClientConnectorCertificateError(KEY, ssl.SSLCertVerificationError("bad")), "tls", None, True),
    (aiohttp.ClientConnectorSSLError(KEY, ssl.SSLError("handshake")), "tls", None, True),
    (aiohttp.ClientConnectorError(KEY, ConnectionRefusedError(111, "refused")), "connection", None, True),
    (aiohttp.InvalidURL("http://exa mple.com"), "invalid_request", "not a valid URL: http://exa mple.com", False),
    (aiohttp.ServerDisconnectedError(), "connection", "ServerDisconnectedError: Server disconnected", True),
    (ConnectionResetError(104, "reset"), "connection", "ConnectionResetError: [Errno 104] reset", True),
]  # fmt: skip


@pytest.mark.parametrize(("exc", "kind", "detail", "located"), CASES)
@pytest.mark.parametrize("where", ["", "https://example.com/x: "])
def test_each_failure_has_one_class_and_detail(
    exc: TargetRefused | aiohttp.ClientError | OSError,
    kind: str,
    detail: str | None,
    located: bool,
    where: str,
) -> None:
    expected = detail if detail is not None else str(exc)
    assert classify(exc, where=where) == (kind, f"{where}{expected}" if located else expected)
