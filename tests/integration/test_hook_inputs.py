"""Inbound hooks and odd or hostile input, over HTTP on both backends: signature headers that
are not ASCII, absurd timestamps, JSON the store cannot keep, replayed Standard Webhooks
deliveries, forged requests against the rate limit, and URLs that cannot be guessed."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from httpx import ASGITransport, AsyncClient
from standardwebhooks.webhooks import Webhook

from flowhook.app import create_app
from flowhook.config import Settings
from flowhook.ids import new_id
from flowhook.service import Services
from flowhook.store import hooks as hooks_store
from tests.conftest import Api
from tests.integration.test_hooks import hook, path

JSON = {"Content-Type": "application/json"}


async def reasons(api: Api) -> list[Any]:
    data = (await api.get("/api/v1/events", params={"event": "webhook.delivered"})).json()["data"]
    return sorted(str(e["body"]["payload"]["reason"]) for e in data)


async def runs(api: Api) -> list[dict[str, Any]]:
    return list((await api.get("/api/v1/flows/runs")).json()["data"])


def signed(secret: str, msg_id: str, body: bytes, stamp: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if stamp is None else stamp
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, tz=UTC), body.decode())
    return {
        **JSON,
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature,
    }


async def test_non_ascii_signature_headers_are_refused_and_recorded(api: Api) -> None:
    h = await hook(api, verify={"type": "hmac"})
    s = await hook(api, verify={"type": "standard"})
    body = b'{"a": 1}'
    odd = "é".encode("latin-1") * 64  # raw bytes on the wire, as a client may send them
    r = await api.client.post(path(h), content=body, headers={**JSON, "X-Signature": odd})
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), r.text
    headers = signed(s["verify"]["secret"], "msg_odd", body)
    r = await api.client.post(
        path(s), content=body, headers={**headers, "webhook-signature": b"v1," + odd}
    )
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), r.text
    assert await reasons(api) == ["bad signature", "bad signature"]
    assert await runs(api) == []


async def test_absurd_timestamps_are_refused_and_recorded(api: Api) -> None:
    s = await hook(api, verify={"type": "standard"})
    body = b'{"a": 1}'
    headers = signed(s["verify"]["secret"], "msg_t", body)
    for stamp in ("9" * 5000, "١٢٣", "+1700000000", " 1", "1e9", "-5"):
        r = await api.client.post(
            path(s), content=body, headers={**headers, "webhook-timestamp": stamp.encode()}
        )
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), (stamp, r.text)
        assert "webhook-timestamp" in r.json()["error"]
    assert await reasons(api) == ["bad timestamp"] * 6
    assert await runs(api) == []


async def test_json_the_store_cannot_keep_is_refused_and_recorded(api: Api) -> None:
    h = await hook(api)
    deep = b'{"a":' * 300 + b"1" + b"}" * 300
    r = await api.client.post(path(h), content=deep, headers=JSON)
    assert (r.status_code, r.json()["code"]) == (400, "invalid_request"), r.text
    assert "nested too deeply" in r.json()["error"]
    assert await reasons(api) == ["invalid JSON"]
    assert await runs(api) == []


async def test_a_replayed_standard_webhook_starts_one_run(api: Api) -> None:
    s = await hook(api, verify={"type": "standard"})
    body = b'{"order": 1}'
    headers = signed(s["verify"]["secret"], "msg_replayed", body)
    first = await api.client.post(path(s), content=body, headers=headers)
    again = await api.client.post(path(s), content=body, headers=headers)
    assert (first.status_code, again.status_code) == (202, 200), again.text
    assert again.json() == {"run_id": first.json()["run_id"], "status": "queued", "duplicate": True}
    other = await api.client.post(
        path(s), content=body, headers=signed(s["verify"]["secret"], "msg_other", body)
    )
    assert other.status_code == 202
    assert len(await runs(api)) == 2
    assert await reasons(api) == ["None", "None", "duplicate delivery id"]


async def test_a_replay_with_a_new_unsigned_dedup_header_starts_no_second_run(api: Api) -> None:
    s = await hook(api, verify={"type": "standard"}, dedup_header="X-Delivery")
    body = b'{"order": 9}'
    headers = signed(s["verify"]["secret"], "msg_captured", body)
    first = await api.client.post(path(s), content=body, headers={**headers, "X-Delivery": "a"})
    again = await api.client.post(path(s), content=body, headers={**headers, "X-Delivery": "b"})
    assert (first.status_code, again.status_code) == (202, 200), again.text
    assert len(await runs(api)) == 1


async def test_concurrent_copies_start_one_run(api: Api) -> None:
    s = await hook(api, verify={"type": "standard"})
    body = b'{"order": 2}'
    headers = signed(s["verify"]["secret"], "msg_race", body)
    answers = await asyncio.gather(
        *(api.client.post(path(s), content=body, headers=headers) for _ in range(8))
    )
    assert sorted(r.status_code for r in answers) == [200] * 7 + [202], [r.text for r in answers]
    assert len({r.json()["run_id"] for r in answers}) == 1
    assert len(await runs(api)) == 1


async def test_a_copy_at_another_process_starts_no_second_run(api: Api, settings: Settings) -> None:
    s = await hook(api, verify={"type": "standard"})
    body = b'{"order": 3}'
    headers = signed(s["verify"]["secret"], "msg_elsewhere", body)
    first = await api.client.post(path(s), content=body, headers=headers)
    assert first.status_code == 202
    other: FastAPI = create_app(settings, run_worker=False, run_migrations=False)
    async with (
        other.router.lifespan_context(other),
        AsyncClient(transport=ASGITransport(app=other), base_url="http://other.test") as client,
    ):
        again = await client.post(path(s), content=body, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["run_id"] == first.json()["run_id"]
    assert len(await runs(api)) == 1


async def test_forged_requests_do_not_use_up_the_senders_rate_limit(api: Api) -> None:
    h = await hook(api, verify={"type": "hmac"}, rate_limit=3)
    secret = h["verify"]["secret"].encode()
    forged = [
        await api.client.post(path(h), json={"n": n}, headers={"X-Signature": "0" * 64})
        for n in range(6)
    ]
    assert [r.status_code for r in forged] == [401, 401, 401, 429, 429, 429]
    body = b'{"n": 1}'
    good = hmac.new(secret, body, hashlib.sha256).hexdigest()
    r = await api.client.post(path(h), content=body, headers={**JSON, "X-Signature": good})
    assert r.status_code == 202, r.text


async def test_hook_urls_carry_at_least_128_random_bits_and_old_ones_still_work(api: Api) -> None:
    h = await hook(api)
    assert len(h["id"]) == 39 and h["url"].endswith(h["id"])
    rotated = (await api.post(f"/api/v1/hooks/{h['id']}/rotate")).json()
    assert len(rotated["id"]) == 39
    # A hook made before ids grew: the old 26-character id.
    services: Services = api.app.state.services
    who = await services.keys.authenticate(api.auth()["Authorization"])
    old = await services.hooks.get(who, rotated["id"])
    old.id = new_id("hk")
    async with services.db.transaction() as conn:
        await hooks_store.insert_hook(conn, old)
    r = await api.client.post("/api/v1/hooks/" + old.id, json={"legacy": True})
    assert r.status_code == 202, r.text
    assert (await api.get("/api/v1/hooks/" + old.id)).status_code == 200
    listed = [x["id"] for x in (await api.get("/api/v1/hooks")).json()["data"]]
    assert listed == [old.id, rotated["id"]]
