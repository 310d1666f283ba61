"""SPEC §4.1 and §4.2 over HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import orjson

from tests.conftest import Api

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

ORDER_FLOW: dict[str, Any] = {
    "name": "Process order",
    "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.amount > 0 }}", "else": "fail"},
        {"id": "price", "type": "transform", "output": {"total": "{{ payload.amount * 2 }}"}},
        {"id": "label", "type": "transform", "output": {"text": "#{{ payload.order_id }}"}},
    ],
    "output": {"order_id": "{{ payload.order_id }}"},
}


async def test_execute_answers_202_queued_then_the_run_completes(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    r = await api.post(
        "/api/v1/flows/execute",
        {"flow_id": flow_id, "trigger": "api", "payload": {"order_id": "ord_123", "amount": 21}},
    )
    assert r.status_code == 202
    body = r.json()
    assert set(body) == {"run_id", "flow_id", "status", "queued_at"}
    assert body["run_id"].startswith("run_")
    assert body["flow_id"] == flow_id
    assert body["status"] == "queued"
    assert ISO_Z.match(body["queued_at"])

    run = await api.wait(body["run_id"])
    assert run["status"] == "completed"
    assert run["output"] == {"order_id": "ord_123"}
    assert run["steps_executed"] == 3
    assert [s["id"] for s in run["steps"]] == ["check", "price", "label"]
    assert run["steps"][1]["output"] == {"total": 42}
    assert run["steps"][2]["output"] == {"text": "#ord_123"}
    assert all(s["status"] == "completed" and s["attempts"] == 1 for s in run["steps"])
    assert run["error"] is None
    assert run["trigger"] == "api"
    assert run["flow_version"] == 1
    for field in ("queued_at", "started_at", "finished_at"):
        assert ISO_Z.match(run[field]), field
    assert isinstance(run["duration_ms"], int)


async def test_completed_run_raises_the_spec_events_with_the_spec_payload(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    run_id = await api.execute(flow_id, {"order_id": "ord_9", "amount": 1})
    await api.wait(run_id)
    r = await api.get(f"/api/v1/flows/runs/{run_id}/events")
    events = r.json()["data"]
    names = [e["event"] for e in events]
    assert names == ["flow.started"] + ["flow.step_completed"] * 3 + ["flow.completed"]
    completed = events[-1]["body"]
    assert set(completed) == {"event", "flow_id", "run_id", "timestamp", "payload"}
    assert completed["run_id"] == run_id and completed["flow_id"] == flow_id
    assert ISO_Z.match(completed["timestamp"])
    # paginated like every list, oldest first: pages of two, then the rest
    pages, cursor = [], None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        r = await api.get(f"/api/v1/flows/runs/{run_id}/events", params=params)
        assert r.status_code == 200, r.text
        pages.append([e["id"] for e in r.json()["data"]])
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert pages == [[e["id"] for e in events[i : i + 2]] for i in range(0, 5, 2)]
    r = await api.get(f"/api/v1/flows/runs/{run_id}/events", params={"limit": "101"})
    assert r.status_code == 400
    r = await api.get(f"/api/v1/flows/runs/{run_id}/events", params={"cursor": run_id})
    assert r.status_code == 400 and r.json()["error"] == "cursor is not one this list gave out"
    payload = completed["payload"]
    assert payload["order_id"] == "ord_9"
    assert payload["status"] == "completed"
    assert payload["steps_executed"] == 3
    assert isinstance(payload["duration_ms"], int)


async def test_failed_condition_fails_the_run_naming_the_step(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    run = await api.wait(await api.execute(flow_id, {"order_id": "x", "amount": 0}))
    assert run["status"] == "failed"
    assert run["error"]["step"] == "check"
    assert run["error"]["type"] == "condition"
    assert run["error"]["message"] == "condition 'check' was false: payload.amount was 0"
    events = (await api.get(f"/api/v1/flows/runs/{run['run_id']}/events")).json()["data"]
    assert [e["event"] for e in events][-1] == "flow.failed"
    assert events[-1]["body"]["payload"]["error"]["step"] == "check"


async def test_trigger_other_than_api_is_refused_naming_the_allowed_values(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "trigger": "cron"})
    assert r.status_code == 400
    assert "'api'" in r.json()["error"]
    assert r.json()["code"] == "invalid_request"


async def test_payload_must_be_an_object(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    for bad in ([1, 2], "text", 3):
        r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "payload": bad})
        assert r.status_code == 400
        assert "payload" in r.json()["error"]


async def test_bad_bodies_answer_400_413_415_with_an_error(api: Api) -> None:
    h = {**api.auth(), "Content-Type": "application/json"}
    r = await api.client.post("/api/v1/flows/execute", content=b"{not json", headers=h)
    assert (r.status_code, r.json()["code"]) == (400, "malformed_json")
    body = b'{"flow_id": "wf_x",\n "payload": {"a": 1,}}'  # the "}" after a trailing comma
    for path in ("/api/v1/flows/execute", "/api/v1/flows"):
        r = await api.client.post(path, content=body, headers=h)
        assert (r.status_code, r.json()["code"]) == (400, "malformed_json")
        assert "at line 2, column 21:" in r.json()["error"], r.json()
    r = await api.client.post("/api/v1/flows/execute", content=b"{}", headers=h)
    assert r.status_code == 400 and "flow_id" in r.json()["error"]
    r = await api.client.post(
        "/api/v1/flows/execute",
        content=b"flow_id=wf_x",
        headers={**api.auth(), "Content-Type": "text/plain"},
    )
    assert (r.status_code, r.json()["code"]) == (415, "unsupported_media_type")
    big = orjson.dumps({"flow_id": "wf_x", "payload": {"blob": "x" * (1024 * 1024)}})
    r = await api.client.post("/api/v1/flows/execute", content=big, headers=h)
    assert (r.status_code, r.json()["code"]) == (413, "payload_too_large")
    r = await api.post("/api/v1/flows/execute", {"flow_id": "wf_x", "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.json()["error"]
    r = await api.post("/api/v1/flows/execute", {"flow_id": "nope"})
    assert r.status_code == 400 and "flow_id" in r.json()["error"]


async def test_streamed_body_over_the_limit_is_413(api: Api) -> None:
    async def chunks() -> Any:
        for _ in range(40):
            yield b"x" * 65536

    r = await api.client.post(
        "/api/v1/flows/execute",
        content=chunks(),
        headers={**api.auth(), "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"


async def test_authentication(api: Api) -> None:
    r = await api.client.get("/api/v1/flows/runs")
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")
    r = await api.client.get("/api/v1/flows/runs", headers={"Authorization": "Bearer sk_test_nope"})
    assert r.status_code == 401
    fake = "sk_test_" + "a" * 32
    r = await api.client.get("/api/v1/flows/runs", headers={"Authorization": f"Bearer {fake}"})
    assert r.status_code == 401
    r = await api.client.get("/api/v1/flows/runs", headers={"Authorization": f"Basic {fake}"})
    assert r.status_code == 401


async def test_a_key_sees_only_its_workspace_and_mode(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    run_id = await api.execute(flow_id, {"order_id": "a", "amount": 1})
    for who in ("live", "other"):
        r = await api.get(f"/api/v1/flows/runs/{run_id}", who=who)
        assert r.status_code == 404, who
        assert r.json()["code"] == "not_found"
        r = await api.get(f"/api/v1/flows/{flow_id}", who=who)
        assert r.status_code == 404
        r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id}, who=who)
        assert r.status_code == 404
        r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel", who=who)
        assert r.status_code == 404
        assert (await api.get("/api/v1/flows/runs", who=who)).json()["data"] == []


async def test_unknown_run_and_flow_and_route_are_404(api: Api) -> None:
    assert (await api.get("/api/v1/flows/runs/run_01m820q4ddefvv66zvf1hagfbr")).status_code == 404
    assert (await api.get("/api/v1/flows/runs/garbage")).status_code == 404
    r = await api.post("/api/v1/flows/execute", {"flow_id": "wf_01m820q4ddefvv66zvf1hagfbr"})
    assert r.status_code == 404
    r = await api.get("/api/v1/nothing/here")
    assert (r.status_code, r.json()["code"]) == (404, "not_found")


async def test_idempotency_key_replays_the_same_run_and_refuses_another_body(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    body = {"flow_id": flow_id, "payload": {"order_id": "o1", "amount": 3}}
    h = {"Idempotency-Key": "order-o1"}
    first = await api.post("/api/v1/flows/execute", body, headers=h)
    second = await api.post("/api/v1/flows/execute", body, headers=h)
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert second.headers.get("idempotent-replayed") == "true"
    other = await api.post(
        "/api/v1/flows/execute", {**body, "payload": {"order_id": "o2"}}, headers=h
    )
    assert (other.status_code, other.json()["code"]) == (409, "idempotency_conflict")
    # The same key in another workspace is another key.
    elsewhere_flow = await api.create_flow(ORDER_FLOW, who="other")
    r = await api.post(
        "/api/v1/flows/execute", {**body, "flow_id": elsewhere_flow}, headers=h, who="other"
    )
    assert r.status_code == 202 and r.json()["run_id"] != first.json()["run_id"]
    runs = (await api.get("/api/v1/flows/runs")).json()["data"]
    assert len(runs) == 1


async def test_run_pins_the_flow_version_it_started_with(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    run_v1 = await api.wait(await api.execute(flow_id, {"order_id": "a", "amount": 1}))
    v2 = {**ORDER_FLOW, "output": {"v": 2}}
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=v2, headers=api.auth())
    assert r.status_code == 200 and r.json()["version"] == 2
    run_v2 = await api.wait(await api.execute(flow_id, {"order_id": "a", "amount": 1}))
    assert (run_v1["flow_version"], run_v1["output"]) == (1, {"order_id": "a"})
    assert (run_v2["flow_version"], run_v2["output"]) == (2, {"v": 2})


async def test_list_runs_filters_and_pages(api: Api) -> None:
    flow_a = await api.create_flow(ORDER_FLOW)
    flow_b = await api.create_flow({**ORDER_FLOW, "name": "B"})
    ids = [await api.execute(flow_a, {"order_id": str(i), "amount": 1}) for i in range(5)]
    failed = await api.execute(flow_b, {"order_id": "z", "amount": 0})
    for run_id in [*ids, failed]:
        await api.wait(run_id)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, "flow_id": flow_a}
        if cursor:
            params["cursor"] = cursor
        page = (await api.get("/api/v1/flows/runs", params=params)).json()
        seen += [r["run_id"] for r in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    failed_page = (await api.get("/api/v1/flows/runs", params={"status": "failed"})).json()
    assert [r["run_id"] for r in failed_page["data"]] == [failed]
    r = await api.get("/api/v1/flows/runs", params={"status": "weird"})
    assert r.status_code == 400 and "status" in r.json()["error"]
    r = await api.get("/api/v1/flows/runs", params={"limit": 1000})
    assert r.status_code == 400 and "limit" in r.json()["error"]
    r = await api.get("/api/v1/flows/runs", params={"cursor": "bogus"})
    assert r.status_code == 400 and "cursor" in r.json()["error"]


async def test_cancel_a_queued_run_and_refuse_to_cancel_a_finished_one(api: Api) -> None:
    flow_id = await api.create_flow(ORDER_FLOW)
    worker = api.app.state.worker
    await worker.stop()  # nothing claims: the run stays queued
    run_id = await api.execute(flow_id, {"order_id": "c", "amount": 1})
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert r.status_code == 200
    assert r.json()["status"] == "cancelled"
    events = (await api.get(f"/api/v1/flows/runs/{run_id}/events")).json()["data"]
    assert [e["event"] for e in events] == ["flow.cancelled"]
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert (r.status_code, r.json()["code"]) == (409, "run_finished")


async def test_health_and_readiness(api: Api) -> None:
    health = (await api.client.get("/healthz")).json()
    # "disk" came with the disk budget (issue 54); what was there before stays as it was
    assert health == {"status": "ok", "disk": health["disk"]}
    assert set(health["disk"]) == {"database_bytes", "budget_bytes", "over_budget"}
    assert (await api.client.get("/readyz")).status_code == 200


async def test_every_response_carries_a_request_id(api: Api) -> None:
    r = await api.client.get("/healthz", headers={"X-Request-Id": "abc123"})
    assert r.headers["x-request-id"] == "abc123"
    assert (await api.client.get("/healthz")).headers["x-request-id"]


async def test_a_status_filter_that_is_empty_or_unknown_is_refused(api: Api) -> None:
    # An empty ``status=`` is not "no filter": the schema's enum does not hold it.
    for path in ("/api/v1/flows/runs", "/api/v1/webhooks/deliveries"):
        for value in ("", "nope"):
            r = await api.get(f"{path}?status={value}")
            assert (r.status_code, r.json()["code"]) == (400, "invalid_request"), (path, r.text)
        assert (await api.get(path)).status_code == 200
