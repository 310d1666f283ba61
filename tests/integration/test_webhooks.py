"""Outbound webhooks against a real receiver on 127.0.0.1, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
from typing import Any

import orjson
from standardwebhooks.webhooks import Webhook

from flowhook.service.overview import OverviewService
from tests.conftest import Api, Receiver

FLOW: dict[str, Any] = {
    "name": "w",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": 1}},
        {"id": "b", "type": "transform", "output": {"y": 2}},
    ],
    "output": {"order_id": "{{ payload.order_id }}"},
}
ALL_RUN_EVENTS = [
    "flow.started",
    "flow.step_completed",
    "flow.completed",
    "flow.failed",
    "flow.step_failed",
]


async def endpoint(api: Api, url: str, events: list[str], who: str = "test") -> dict[str, Any]:
    r = await api.post("/api/v1/webhooks/endpoints", {"url": url, "events": events}, who=who)
    assert r.status_code == 201, r.text
    return dict(r.json())


async def until(check: Any, timeout: float = 10.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.02)


async def deliveries(api: Api, **params: Any) -> list[dict[str, Any]]:
    return list((await api.get("/api/v1/webhooks/deliveries", params=params)).json()["data"])


def verify(secret: str, request: dict[str, Any]) -> None:
    body = request["body"]
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(request["headers"]["X-Service-Signature"], expected)
    assert Webhook(secret).verify(body, request["headers"]) == orjson.loads(body)


async def test_endpoint_api_validates_and_hides_the_secret(api: Api, receiver: Receiver) -> None:
    ep = await endpoint(api, receiver.url + "/hook", ["flow.completed", "flow.failed"])
    assert ep["id"].startswith("ep_") and ep["secret"].startswith("whsec_")
    assert ep["events"] == ["flow.completed", "flow.failed"] and ep["enabled"] is True
    got = (await api.get(f"/api/v1/webhooks/endpoints/{ep['id']}")).json()
    assert "secret" not in got
    secret = (await api.get(f"/api/v1/webhooks/endpoints/{ep['id']}/secret")).json()
    assert secret["secret"] == ep["secret"]
    r = await api.post(
        "/api/v1/webhooks/endpoints", {"url": receiver.url, "events": ["flow.exploded"]}
    )
    assert r.status_code == 400 and "flow.completed" in r.json()["error"]
    for url in ("ftp://example.com/x", "http://user:pw@example.com/x", "not a url"):
        r = await api.post("/api/v1/webhooks/endpoints", {"url": url, "events": ["flow.completed"]})
        assert r.status_code == 400, url
        assert "url" in r.json()["error"]
    assert (await api.get(f"/api/v1/webhooks/endpoints/{ep['id']}", who="live")).status_code == 404
    r = await api.client.patch(
        f"/api/v1/webhooks/endpoints/{ep['id']}",
        json={"events": ["flow.started"], "enabled": False},
        headers=api.auth(),
    )
    assert (r.json()["events"], r.json()["enabled"]) == (["flow.started"], False)
    assert (
        await api.client.delete(f"/api/v1/webhooks/endpoints/{ep['id']}", headers=api.auth())
    ).status_code == 204
    assert (await api.get(f"/api/v1/webhooks/endpoints/{ep['id']}")).status_code == 404


async def test_a_live_endpoint_on_the_internet_needs_https_even_with_private_targets_allowed(
    api: Api, receiver: Receiver
) -> None:
    """FLOWHOOK_ALLOW_PRIVATE_TARGETS (on in these tests) lets a live endpoint on this
    machine use plain http, and nothing more: a public http:// one is refused (before, the
    setting let a live key register any http:// URL)."""
    assert api.app.state.services.settings.allow_private_targets
    body = {"url": "http://hooks.example.com/in", "events": ["flow.completed"]}
    r = await api.post("/api/v1/webhooks/endpoints", body, who="live")
    assert r.status_code == 400 and "live-mode targets must use https://" in r.text, r.text
    local = {"url": receiver.url, "events": ["flow.completed"]}
    assert (await api.post("/api/v1/webhooks/endpoints", local, who="live")).status_code == 201
    r = await api.post("/api/v1/webhooks/endpoints", body)  # sandbox: http stays allowed
    assert r.status_code == 201, r.text


async def test_each_event_of_a_run_arrives_signed_and_only_chosen_ones(
    api: Api, receiver: Receiver
) -> None:
    everything = await endpoint(api, receiver.url + "/all", ALL_RUN_EVENTS)
    only_done = await endpoint(api, receiver.url + "/done", ["flow.completed"])
    flow_id = await api.create_flow(FLOW)
    run_id = await api.execute(flow_id, {"order_id": "ord_123"})
    await api.wait(run_id)
    await until(lambda: len(receiver.requests) >= 5)
    await asyncio.sleep(0.2)
    to_all = [r for r in receiver.requests if r["path"] == "/all"]
    to_done = [r for r in receiver.requests if r["path"] == "/done"]
    # Deliveries go out concurrently: no order is promised (the envelope has a timestamp).
    assert sorted(r["headers"]["X-Service-Event"] for r in to_all) == [
        "flow.completed", "flow.started", "flow.step_completed", "flow.step_completed",
    ]  # fmt: skip
    assert [r["headers"]["X-Service-Event"] for r in to_done] == ["flow.completed"]
    for r in to_all:
        verify(everything["secret"], r)
        assert r["headers"]["Content-Type"] == "application/json"
        assert r["headers"]["X-Service-Attempt"] == "1"
        assert r["headers"]["webhook-id"] == r["headers"]["X-Service-Event-Id"]
        assert r["headers"]["X-Service-Delivery-Id"].startswith("dlv_")
    verify(only_done["secret"], to_done[0])
    body = orjson.loads(to_done[0]["body"])
    assert body == {
        "event": "flow.completed",
        "flow_id": flow_id,
        "run_id": run_id,
        "timestamp": body["timestamp"],
        "payload": {
            "order_id": "ord_123",
            "status": "completed",
            "steps_executed": 2,
            "duration_ms": body["payload"]["duration_ms"],
        },
    }
    # The same event to two endpoints carries the same event id.
    done_id = to_done[0]["headers"]["X-Service-Event-Id"]
    assert done_id in {r["headers"]["X-Service-Event-Id"] for r in to_all}
    listed = await deliveries(api, status="succeeded", run_id=run_id)
    assert len(listed) == 5


async def test_5xx_every_time_gives_four_attempts_at_the_schedule_then_failed(
    api: Api, receiver: Receiver
) -> None:
    receiver.default = (503, {"down": True})
    await endpoint(api, receiver.url, ["flow.completed"])
    run_id = await api.execute(await api.create_flow(FLOW), {"order_id": "o"})
    failed = await until(lambda: deliveries(api, status="failed"), timeout=15)
    assert len(receiver.requests) == 4
    gaps = [
        b["at"] - a["at"] for a, b in zip(receiver.requests, receiver.requests[1:], strict=False)
    ]
    for gap, planned in zip(gaps, (0.1, 0.2, 0.3), strict=True):
        assert gap >= planned * 0.95, gaps
    assert [r["headers"]["X-Service-Attempt"] for r in receiver.requests] == ["1", "2", "3", "4"]
    assert len({r["headers"]["X-Service-Event-Id"] for r in receiver.requests}) == 1
    assert len({r["body"] for r in receiver.requests}) == 1
    [delivery] = failed
    assert (delivery["attempts"], delivery["last_status_code"], delivery["run_id"]) == (
        4,
        503,
        run_id,
    )
    assert "http_5xx" in delivery["last_error"]
    detail = (await api.get(f"/api/v1/webhooks/deliveries/{delivery['id']}")).json()
    assert [a["status_code"] for a in detail["attempt_log"]] == [503] * 4
    assert [a["error_class"] for a in detail["attempt_log"]] == ["http_5xx"] * 4
    assert detail["attempt_log"][0]["response_excerpt"] == '{"down": true}'
    assert detail["attempt_log"][0]["next_attempt_at"] is not None
    assert detail["attempt_log"][-1]["next_attempt_at"] is None
    assert detail["body"]["event"] == "flow.completed"


async def test_4xx_gives_one_attempt_and_a_redirect_is_not_followed(
    api: Api, receiver: Receiver
) -> None:
    receiver.script = [(410, {"gone": True}), (302, "https://elsewhere.example/hook")]
    first = await endpoint(api, receiver.url + "/a", ["flow.completed"])
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    [gone] = await until(lambda: deliveries(api, status="failed"))
    assert (gone["attempts"], gone["last_status_code"]) == (1, 410)
    await api.client.delete(f"/api/v1/webhooks/endpoints/{first['id']}", headers=api.auth())
    await endpoint(api, receiver.url + "/b", ["flow.completed"])
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    redirected = await until(lambda: _two(deliveries(api, status="failed")))
    moved = next(d for d in redirected if d["last_status_code"] == 302)
    assert moved["attempts"] == 1
    assert "elsewhere.example" in moved["last_error"] and "redirect" in moved["last_error"]
    assert len(receiver.requests) == 2


async def _two(coro: Any) -> Any:
    found = await coro
    return found if len(found) >= 2 else None


async def test_timeouts_and_refused_connections_are_retried(api: Api, receiver: Receiver) -> None:
    closed = "http://127.0.0.1:9/nothing-listens"
    await endpoint(api, closed, ["flow.completed"])
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    [refused] = await until(lambda: deliveries(api, status="failed"), timeout=15)
    assert refused["attempts"] == 4 and "connection" in refused["last_error"]

    receiver.delay = 1.5  # longer than the 1 s timeout
    await endpoint(api, receiver.url + "/slow", ["flow.started"])
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    slow = await until(lambda: _attempts_at_least(api, "flow.started", 2), timeout=15)
    detail = (await api.get(f"/api/v1/webhooks/deliveries/{slow['id']}")).json()
    assert detail["attempt_log"][0]["error_class"] == "timeout"


async def _attempts_at_least(api: Api, event: str, n: int) -> Any:
    for d in await deliveries(api, event=event):
        if d["attempts"] >= n:
            return d
    return None


async def test_replay_sends_identical_bytes_with_the_same_event_id(
    api: Api, receiver: Receiver
) -> None:
    ep = await endpoint(api, receiver.url, ["flow.completed"])
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    [first] = await until(lambda: deliveries(api, status="succeeded"))
    r = await api.post(f"/api/v1/webhooks/deliveries/{first['id']}/replay")
    assert r.status_code == 202 and r.json()["replay_of"] == first["id"]
    await until(lambda: len(receiver.requests) == 2)
    original, again = receiver.requests
    assert original["body"] == again["body"]
    assert original["headers"]["X-Service-Event-Id"] == again["headers"]["X-Service-Event-Id"]
    assert original["headers"]["X-Service-Delivery-Id"] != again["headers"]["X-Service-Delivery-Id"]
    verify(ep["secret"], again)


async def test_rotation_signs_with_both_secrets_during_the_grace_period(
    api: Api, receiver: Receiver
) -> None:
    ep = await endpoint(api, receiver.url, ["flow.completed"])
    rotated = (
        await api.post(
            f"/api/v1/webhooks/endpoints/{ep['id']}/rotate-secret", {"grace_seconds": 3600}
        )
    ).json()
    assert rotated["previous_secret"] == ep["secret"] and rotated["secret"] != ep["secret"]
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    await until(lambda: receiver.requests)
    [request] = receiver.requests
    assert Webhook(ep["secret"]).verify(request["body"], request["headers"])
    assert Webhook(rotated["secret"]).verify(request["body"], request["headers"])
    old = hmac.new(ep["secret"].encode(), request["body"], hashlib.sha256).hexdigest()
    assert request["headers"]["X-Service-Signature"] == old
    promoted = (await api.post(f"/api/v1/webhooks/endpoints/{ep['id']}/promote-secret")).json()
    assert promoted["previous_secret"] is None
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    await until(lambda: len(receiver.requests) == 2)
    verify(rotated["secret"], receiver.requests[1])


async def test_test_event_and_recover(api: Api, receiver: Receiver) -> None:
    ep = await endpoint(api, receiver.url, ["flow.failed"])
    r = await api.post(f"/api/v1/webhooks/endpoints/{ep['id']}/test")
    assert r.status_code == 202 and r.json()["event"] == "webhook.test"
    await until(lambda: receiver.of("webhook.test"))
    verify(ep["secret"], receiver.of("webhook.test")[0])
    receiver.default = (500, {})
    await endpoint(api, receiver.url + "/other", ["flow.completed"])
    since = "2000-01-01T00:00:00Z"
    failing = await api.create_flow({"name": "f", "steps": [{"id": "x", "type": "fail"}]})
    await api.wait(await api.execute(failing))
    [dead] = await until(lambda: deliveries(api, status="failed", endpoint_id=ep["id"]), timeout=15)
    receiver.default = (200, {})
    r = await api.post(f"/api/v1/webhooks/endpoints/{ep['id']}/recover", {"since": since})
    assert r.status_code == 202
    assert [d["replay_of"] for d in r.json()["replayed"]] == [dead["id"]]
    await until(lambda: deliveries(api, status="succeeded", event="flow.failed"))
    again = await api.post(f"/api/v1/webhooks/endpoints/{ep['id']}/recover", {"since": since})
    assert again.json() == {"replayed": [], "skipped": 1, "next_cursor": None}
    r = await api.post(f"/api/v1/webhooks/endpoints/{ep['id']}/recover", {"since": "yesterday"})
    assert r.status_code == 400


async def test_events_api(api: Api) -> None:
    run_id = await api.execute(await api.create_flow(FLOW), {"order_id": "o"})
    await api.wait(run_id)
    events = (await api.get("/api/v1/events", params={"run_id": run_id})).json()["data"]
    assert next(e["event"] for e in events) == "flow.completed"
    one = (await api.get(f"/api/v1/events/{events[0]['id']}")).json()
    assert one["body"]["run_id"] == run_id
    assert (await api.get(f"/api/v1/events/{events[0]['id']}", who="other")).status_code == 404
    only = (await api.get("/api/v1/events", params={"event": "flow.started"})).json()["data"]
    assert [e["event"] for e in only] == ["flow.started"]


async def test_metrics_count_attempts_and_pending_age(api: Api, receiver: Receiver) -> None:
    await endpoint(api, receiver.url, ["flow.completed"])
    await api.wait(await api.execute(await api.create_flow(FLOW), {"order_id": "o"}))
    await until(lambda: deliveries(api, status="succeeded"))
    text = (await api.client.get("/metrics")).text
    assert 'flowhook_webhook_attempts_total{outcome="delivered"}' in text
    assert "flowhook_webhook_delivery_latency_seconds_count" in text
    assert "flowhook_webhook_oldest_pending_seconds 0.0" in text
    assert 'flowhook_runs_finished_total{status="completed"}' in text
    assert "flowhook_queue_depth 0.0" in text
    assert "flowhook_run_start_latency_seconds_count" in text
    assert 'flowhook_step_duration_seconds_count{status="completed",type="transform"}' in text


async def test_failure_and_cancel_events_arrive_signed(api: Api, receiver: Receiver) -> None:
    ep = await endpoint(api, receiver.url, ["flow.step_failed", "flow.failed", "flow.cancelled"])
    failing = await api.create_flow(
        {"name": "f", "steps": [{"id": "boom", "type": "fail", "message": "no"}]}
    )
    await api.wait(await api.execute(failing))
    sleeping = await api.create_flow(
        {"name": "s", "steps": [{"id": "nap", "type": "delay", "seconds": 60}]}
    )
    run_id = await api.execute(sleeping)
    await until(lambda: _has_steps(api, run_id))
    assert (await api.post(f"/api/v1/flows/runs/{run_id}/cancel")).status_code == 200
    await until(lambda: len(receiver.requests) >= 3)
    assert sorted(r["headers"]["X-Service-Event"] for r in receiver.requests) == [
        "flow.cancelled", "flow.failed", "flow.step_failed",
    ]  # fmt: skip
    for r in receiver.requests:
        verify(ep["secret"], r)
    failed = orjson.loads(receiver.of("flow.failed")[0]["body"])
    assert failed["payload"]["error"] == {"type": "fail", "message": "no", "step": "boom"}


async def _has_steps(api: Api, run_id: str) -> bool:
    return bool((await api.get(f"/api/v1/flows/runs/{run_id}")).json()["steps"])


async def test_recover_works_in_bounded_batches_and_continues_by_cursor(
    api: Api, receiver: Receiver, monkeypatch: Any
) -> None:
    from flowhook.service import webhooks as service

    monkeypatch.setattr(service, "RECOVER_BATCH", 2)
    monkeypatch.setattr(service, "RECOVER_LIMIT", 3)
    receiver.default = (400, {})
    ep = await endpoint(api, receiver.url, ["flow.completed"])
    flow_id = await api.create_flow(
        {"name": "f", "steps": [{"id": "x", "type": "transform", "output": {}}]}
    )
    for _ in range(5):
        await api.wait(await api.execute(flow_id))

    async def five_failed() -> list[dict[str, Any]]:
        found = await deliveries(api, status="failed", endpoint_id=ep["id"])
        return found if len(found) == 5 else []

    failed = await until(five_failed, timeout=15)
    receiver.default = (200, {})
    path = f"/api/v1/webhooks/endpoints/{ep['id']}/recover"
    first = (await api.post(path, {"since": "2000-01-01T00:00:00Z"})).json()
    assert len(first["replayed"]) == 3 and first["skipped"] == 0
    assert first["next_cursor"]
    rest = (
        await api.post(path, {"since": "2000-01-01T00:00:00Z", "cursor": first["next_cursor"]})
    ).json()
    assert len(rest["replayed"]) == 2 and rest["next_cursor"] is None
    replayed = {d["replay_of"] for d in first["replayed"] + rest["replayed"]}
    assert replayed == {d["id"] for d in failed}
    bad = await api.post(path, {"since": "2000-01-01T00:00:00Z", "cursor": "nope"})
    assert bad.status_code == 400


async def test_a_failed_delivery_a_replay_delivered_no_longer_counts_as_failed(
    api: Api, receiver: Receiver
) -> None:
    """The endpoint's 24 h health, the overview's rate and the failed lists: once a replay
    delivers a failed delivery's event to that endpoint, it counts as delivered (and the
    failed one names the replay), while another failure still counts."""
    ep = await endpoint(api, receiver.url, ["flow.failed"])
    receiver.default = (500, {})
    failing = await api.create_flow({"name": "f", "steps": [{"id": "x", "type": "fail"}]})
    for _ in range(2):
        await api.wait(await api.execute(failing))

    async def both_failed() -> list[dict[str, Any]] | None:
        found = await deliveries(api, status="failed")
        return found if len(found) == 2 else None

    dead = await until(both_failed, timeout=15)
    receiver.default = (200, {})
    r = await api.post(f"/api/v1/webhooks/deliveries/{dead[0]['id']}/replay")
    assert r.status_code == 202, r.text
    replay_id = r.json()["id"]
    await until(lambda: deliveries(api, status="succeeded"))

    services = api.app.state.services
    who = await services.keys.authenticate(api.auth()["Authorization"])
    endpoints = (await services.webhooks.list_endpoints(who, limit=10, cursor=None)).data
    health = (await services.webhooks.health(who, endpoints))[ep["id"]]
    assert (health["succeeded"], health["failed"], health["redelivered"]) == (1, 1, 1)
    [rate] = (await OverviewService(services.db, services.clock).get(who)).endpoints
    assert (rate.succeeded, rate.failed) == (1, 1)
    failed = (
        await services.webhooks.list_deliveries(who, limit=10, cursor=None, status="failed")
    ).data
    assert await services.webhooks.delivered_later(who, failed) == {dead[0]["id"]: replay_id}
