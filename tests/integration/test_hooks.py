"""Inbound hooks: a POST to the public URL starts a run and raises both events; refusals are
recorded with their reason and start nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook

from tests.conftest import Api

FLOW: dict[str, Any] = {
    "name": "in",
    "steps": [{"id": "echo", "type": "transform", "output": {"got": "{{ payload }}"}}],
}


async def hook(api: Api, **body: Any) -> dict[str, Any]:
    flow_id = await api.create_flow(FLOW)
    r = await api.post("/api/v1/hooks", {"flow_id": flow_id, **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


def path(h: dict[str, Any]) -> str:
    return "/api/v1/hooks/" + h["id"]


async def events(api: Api, name: str) -> list[dict[str, Any]]:
    return list((await api.get("/api/v1/events", params={"event": name})).json()["data"])


async def test_a_post_starts_a_run_and_raises_both_events(api: Api) -> None:
    h = await hook(api)
    assert h["id"].startswith("hk_") and h["url"].endswith(path(h))
    r = await api.client.post(path(h), json={"order": 7})  # no API key
    assert r.status_code == 202
    run = await api.wait(r.json()["run_id"])
    assert (run["trigger"], run["status"], run["payload"]) == ("webhook", "completed", {"order": 7})
    [delivered] = await events(api, "webhook.delivered")
    [received] = await events(api, "webhook.received")
    assert delivered["body"]["payload"]["accepted"] is True
    assert received["body"]["payload"] == {"hook_id": h["id"], "run_id": run["run_id"]}
    # A form becomes an object, anything else {"body": text}.
    r = await api.client.post(
        path(h),
        content=b"a=1&b=2&b=3",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 202, r.text
    assert (await api.wait(r.json()["run_id"]))["payload"] == {"a": "1", "b": ["2", "3"]}
    r = await api.client.post(path(h), content=b"hello", headers={"Content-Type": "text/plain"})
    assert (await api.wait(r.json()["run_id"]))["payload"] == {"body": "hello"}


async def test_hmac_verification_refuses_a_bad_signature_and_records_why(api: Api) -> None:
    h = await hook(api, verify={"type": "hmac", "header": "X-Hub-Signature-256", "encoding": "hex"})
    secret = h["verify"]["secret"]
    body = b'{"ok": true}'
    good = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    r = await api.client.post(
        path(h),
        content=body,
        headers={"Content-Type": "application/json", "X-Hub-Signature-256": "sha256=" + "0" * 64},
    )
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
    assert (await api.get("/api/v1/flows/runs")).json()["data"] == []
    [refused] = await events(api, "webhook.delivered")
    assert (
        refused["body"]["payload"]["accepted"] is False
        and refused["body"]["payload"]["reason"] == "bad signature"
    )
    assert await events(api, "webhook.received") == []
    r = await api.client.post(
        path(h),
        content=body,
        headers={"Content-Type": "application/json", "X-Hub-Signature-256": good},
    )
    assert r.status_code == 202


async def test_base64_hmac_and_standard_webhooks(api: Api) -> None:
    h = await hook(api, verify={"type": "hmac", "encoding": "base64", "secret": "s3cret"})
    body = b"{}"
    sig = base64.b64encode(hmac.new(b"s3cret", body, hashlib.sha256).digest()).decode()
    r = await api.client.post(
        path(h), content=body, headers={"Content-Type": "application/json", "X-Signature": sig}
    )
    assert r.status_code == 202
    s = await hook(api, verify={"type": "standard"})
    secret = s["verify"]["secret"]
    stamp = int(time.time())
    headers = Webhook(secret).sign("msg_1", datetime.fromtimestamp(stamp, tz=UTC), '{"a":1}')
    ok = await api.client.post(
        path(s), content=b'{"a":1}',
        headers={"Content-Type": "application/json", "webhook-id": "msg_1", "webhook-timestamp": str(stamp), "webhook-signature": headers},
    )  # fmt: skip
    assert ok.status_code == 202, ok.text
    stale = await api.client.post(
        path(s), content=b'{"a":1}',
        headers={"Content-Type": "application/json", "webhook-id": "msg_1", "webhook-timestamp": "1000", "webhook-signature": headers},
    )  # fmt: skip
    assert stale.status_code == 401


async def test_dedup_size_and_rate_limits(api: Api) -> None:
    h = await hook(api, dedup_header="X-Delivery", rate_limit=3)
    first = await api.client.post(path(h), json={}, headers={"X-Delivery": "d1"})
    again = await api.client.post(path(h), json={}, headers={"X-Delivery": "d1"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == {"run_id": first.json()["run_id"], "status": "queued", "duplicate": True}
    await api.client.post(path(h), json={}, headers={"X-Delivery": "d2"})
    limited = await api.client.post(path(h), json={}, headers={"X-Delivery": "d3"})
    assert (limited.status_code, limited.json()["code"]) == (429, "rate_limited")
    assert int(limited.headers["retry-after"]) >= 1
    big = await hook(api)
    r = await api.client.post(
        path(big), content=b"x" * (2 * 1024 * 1024), headers={"Content-Type": "text/plain"}
    )
    assert (r.status_code, r.json()["code"]) == (413, "payload_too_large")
    bad = await api.client.post(
        path(big), content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert bad.status_code == 400
    assert (await api.client.post("/api/v1/hooks/hk_" + "0" * 26, json={})).status_code == 404


async def test_manage_hooks(api: Api) -> None:
    h = await hook(api, verify={"type": "hmac"})
    listed = (await api.get("/api/v1/hooks")).json()["data"]
    assert [x["id"] for x in listed] == [h["id"]] and "secret" not in listed[0]["verify"]
    assert (await api.get(f"/api/v1/hooks/{h['id']}", who="live")).status_code == 404
    rotated = (await api.post(f"/api/v1/hooks/{h['id']}/rotate")).json()
    assert rotated["id"] != h["id"] and rotated["verify"]["secret"] != h["verify"]["secret"]
    assert (await api.client.post(path(h), json={})).status_code == 404
    assert (
        await api.client.delete(f"/api/v1/hooks/{rotated['id']}", headers=api.auth())
    ).status_code == 204
    r = await api.post("/api/v1/hooks", {"flow_id": "wf_" + "0" * 26})
    assert r.status_code == 404
    r = await api.post("/api/v1/hooks", {"flow_id": h["flow_id"], "verify": {"type": "magic"}})
    assert r.status_code == 400 and "verify.type" in r.json()["error"]


async def test_recent_arrivals_per_hook_newest_first_from_a_bounded_read(api: Api) -> None:
    """The Triggers page's arrivals: each hook's latest (three at most), accepted with its
    run or refused with why; another hook's stay apart; only the latest ``scan`` events
    are looked through."""
    signed = await hook(api, verify={"type": "hmac"})
    open_ = await hook(api)
    for n in range(4):
        r = await api.client.post(path(open_), json={"n": n})
        assert r.status_code == 202
        await api.wait(r.json()["run_id"])  # its events all written
    assert (await api.client.post(path(signed), json={})).status_code == 401
    services = api.app.state.services
    who = await services.keys.authenticate(api.auth()["Authorization"])
    found = await services.hooks.recent_arrivals(who)
    assert [a.accepted for a in found[signed["id"]]] == [False]
    assert found[signed["id"]][0].reason == "missing signature"
    mine = found[open_["id"]]
    assert len(mine) == 3 and all(a.accepted and a.run_id for a in mine)
    assert [a.at for a in mine] == sorted((a.at for a in mine), reverse=True)
    runs = {r["run_id"]: r["payload"]["n"] for r in
            (await api.get("/api/v1/flows/runs")).json()["data"]}  # fmt: skip
    assert [runs[a.run_id] for a in mine if a.run_id] == [3, 2, 1]
    # The refusal wrote one event, the last; with a scan of one, the others are not read.
    assert set(await services.hooks.recent_arrivals(who, scan=1)) == {signed["id"]}
