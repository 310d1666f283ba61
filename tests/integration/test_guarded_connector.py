"""The connect-time check: whatever path a URL took past the URL check, the connector
refuses to open a socket to an address the policy refuses (audit finding 1)."""

from __future__ import annotations

import aiohttp
import pytest

from flowhook.targets import TargetRefused, guarded_connector
from flowhook.webhooks.sender import WebhookClient, send
from tests.conftest import Receiver

HOSTS = ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "127。0。0。1", "[::1]"]


@pytest.mark.parametrize("host", HOSTS)
async def test_connector_refuses_private_peers_that_skip_the_url_check(
    receiver: Receiver, host: str
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    async with aiohttp.ClientSession(connector=guarded_connector()) as session:
        with pytest.raises(TargetRefused, match=r"not (a )?public"):
            async with session.get(f"http://{host}:{port}/internal"):
                pass
    assert receiver.requests == []


async def test_connector_reaches_private_peers_when_allowed(receiver: Receiver) -> None:
    async with (
        aiohttp.ClientSession(connector=guarded_connector(allow_private=True)) as session,
        session.get(f"{receiver.url}/ok") as response,
    ):
        assert response.status == 200
    assert len(receiver.requests) == 1


async def test_refused_connections_hold_no_connection_slot() -> None:
    connector = guarded_connector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(3):  # with a leaked slot the second would wait forever
            with pytest.raises(TargetRefused):
                async with session.get("http://127.0.0.1:9/"):
                    pass


@pytest.mark.parametrize("host", ["127。0。0。1", "①②⑦.0.0.1", "[::7f00:1]"])
async def test_webhook_sender_classifies_unicode_ip_hosts_as_blocked(
    receiver: Receiver, host: str
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    client = WebhookClient()
    result = await send(client, f"http://{host}:{port}/", b"{}", {}, timeout=2, allow_private=False)
    await client.close()
    assert result.error_class == "destination_blocked"
    assert result.excerpt is None
    assert receiver.requests == []
