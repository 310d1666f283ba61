"""Why a run or a delivery waits, on the settings screen (Playwright driving Debian's
Chromium against a real `flowhook serve`): the run page's "Waiting" line for every reason
DESIGN lists, with its links; an endpoint paused and resumed by its buttons, its held
deliveries saying why. Screenshots: test-artifacts/screenshots/why-*.png (looked at)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import shot
from tests.e2e.test_browser import Hook, receiver, sign_in
from tests.e2e.test_scale_out import api_key
from tests.support import Server, serve

pytestmark = pytest.mark.e2e
__all__ = ["receiver"]  # the fixture, used by name

ENV = {
    "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
    "FLOWHOOK_LOG_LEVEL": "warning",
}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Server]:
    with serve(tmp_path, f"sqlite:///{tmp_path / 'why.db'}", **ENV) as server:
        yield server


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(check: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError("not seen in time")
        time.sleep(0.05)
    return found


class Flows:
    """Makes flows and starts runs over the API of a test's server (with its sandbox key)."""

    def __init__(self, app: Server) -> None:
        key = app.value("sandbox key")
        self.api = httpx.Client(
            base_url=app.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def flow(self, definition: dict[str, Any]) -> str:
        r = self.api.post("/api/v1/flows", json=definition)
        assert r.status_code == 201, r.text
        return str(r.json()["flow_id"])

    def start(self, flow_id: str, payload: dict[str, Any] | None = None) -> str:
        body = {"flow_id": flow_id, "payload": payload or {}}
        r = self.api.post("/api/v1/flows/execute", json=body)
        assert r.status_code == 202, r.text
        return str(r.json()["run_id"])


def test_the_run_page_says_why_a_run_waits_for_every_reason(app: Server, page: Any) -> None:
    made = Flows(app)
    api, flow, start = made.api, made.flow, made.start

    def reason_of(run_id: str) -> str | None:
        why = api.get(f"/api/v1/flows/runs/{run_id}").json()["waiting_for"]
        return None if why is None else str(why["reason"])

    gate = {"id": "gate", "type": "wait", "signal": "go", "match": {"n": "{{ payload.n }}"}}
    child_flow = flow({"name": "Ship order", "steps": [gate]})
    port = closed_port()
    runs = {
        "delay": start(flow({"name": "Cool off", "steps": [
            {"id": "nap", "type": "delay", "seconds": 3600}]})),
        "signal": start(flow({"name": "Ship when paid", "steps": [gate]}), {"n": 1}),
        "approval": start(flow({"name": "Refund", "steps": [
            {"id": "manager", "type": "approval", "message": "Refund 40 EUR?"}]})),
        "child": start(flow({"name": "Order pipeline", "steps": [
            {"id": "ship", "type": "flow", "flow_id": child_flow,
             "payload": {"n": 2}}]})),
        "parts": start(flow({"name": "Enrich", "steps": [
            {"id": "enrich", "type": "parallel", "branches": {
                "crm": [{**gate, "id": "crm"}], "billing": [{**gate, "id": "billing"}]}}]}),
            {"n": 3}),
        "retry": start(flow({"name": "Call partner", "steps": [
            {"id": "call", "type": "http",
             "request": {"method": "POST", "url": f"http://127.0.0.1:{port}/x"},
             "retry": {"max_attempts": 3, "backoff_seconds": 3600}}]})),
        "task": start(flow({"name": "Charge", "steps": [
            {"id": "charge", "type": "task", "task": "payments.charge"}]})),
    }  # fmt: skip
    paused_flow = flow({"name": "Nightly export", "steps": [gate]})
    assert api.post(f"/api/v1/flows/{paused_flow}/pause").status_code == 200
    runs["paused"] = start(paused_flow, {"n": 4})
    throttled = flow({"name": "Push to partner", "throttle": {"limit": 1, "period_seconds": 3600},
                      "steps": [gate]})  # fmt: skip
    start(throttled, {"n": 5})
    runs["throttle"] = start(throttled, {"n": 6})
    held = flow({"name": "Sync customer", "concurrency": {"limit": 1}, "steps": [gate]})
    holder = start(held, {"n": 7})
    until(lambda: reason_of(holder) == "signal")
    runs["concurrency"] = start(held, {"n": 8})
    for reason, run_id in runs.items():
        until(lambda r=run_id, want=reason: reason_of(r) == want)

    sign_in(page, app)
    expected = {
        "delay": ["Sleeping in step nap until"],
        "signal": ["For the signal go with n = 1 in step gate"],
        "approval": ["For a person to approve in step manager"],
        "child": ["For the child run run_", "to end in step ship"],
        "parts": ["For the parts of step enrich to end: 2 running"],
        "retry": ["A failed attempt in step call is tried again: attempt 2 at"],
        "task": ["For the task payments.charge in step charge", "flowhook tasks serve"],
        "paused": ["The flow is paused: the run starts when the flow is resumed"],
        "throttle": ["By the flow's throttle: it starts at"],
        "concurrency": ["By the flow's concurrency limit: it starts when a run ends",
                        f"holding the slots: {holder}"],
    }  # fmt: skip
    for reason, run_id in runs.items():
        page.goto(f"{app.base}/runs/{run_id}")
        why = page.locator("#waiting-for")
        assert why.get_attribute("data-reason") == reason
        text = why.inner_text()
        for words in expected[reason]:
            assert words in text, (reason, text)
        assert "None" not in text
        shot(page, f"why-{reason}")
    # the links go where the words say
    page.goto(f"{app.base}/runs/{runs['child']}")
    page.click("#waiting-for a")
    page.wait_for_url(re.compile(r"/runs/run_"))
    assert "Ship order" in page.inner_text(".facts")
    page.goto(f"{app.base}/runs/{runs['concurrency']}")
    page.click(f"#waiting-for a[href='/runs/{holder}']")
    page.wait_for_url(re.compile(rf"/runs/{holder}$"))
    page.goto(f"{app.base}/runs/{runs['paused']}")
    page.click("#waiting-for a")
    page.wait_for_url(re.compile(rf"/flows/{paused_flow}"))
    assert "Paused" in page.inner_text("#pause")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{app.base}/runs/{runs['task']}")
    shot(page, "why-task-390")
    for run_id in api.get("/api/v1/flows/runs?limit=100").json()["data"]:
        api.post(f"/api/v1/flows/runs/{run_id['run_id']}/cancel")
    api.close()


def test_a_run_no_engine_worker_has_taken_says_so(tmp_path: Path, page: Any) -> None:
    """`flowhook api` alone: a run stays queued for a worker, and its page says that."""
    url = f"sqlite:///{tmp_path / 'api.db'}"
    with serve(tmp_path, url, "api", **ENV) as app:
        key = api_key(url)
        with httpx.Client(base_url=app.base, headers={"Authorization": f"Bearer {key}"}) as api:
            flow = {"name": "Quick", "steps": [{"id": "a", "type": "transform", "output": {}}]}
            flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
            r = api.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {}})
            run_id = r.json()["run_id"]
            assert (
                api.get(f"/api/v1/flows/runs/{run_id}").json()["waiting_for"]["reason"] == "worker"
            )
        page.goto(app.base + "/signin")
        page.fill("#api_key", key)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"/overview$"))
        page.goto(f"{app.base}/runs/{run_id}")
        assert page.locator("#waiting-for").get_attribute("data-reason") == "worker"
        assert "For an engine worker to take it (queued since" in page.inner_text("#waiting-for")
        assert "Waiting for a worker…" in page.inner_text("main")
        shot(page, "why-worker")


def test_an_endpoint_is_paused_and_resumed_from_its_page(
    app: Server, receiver: str, page: Any
) -> None:
    key = app.value("sandbox key")
    with httpx.Client(base_url=app.base, headers={"Authorization": f"Bearer {key}"}) as api:
        r = api.post(
            "/api/v1/webhooks/endpoints", json={"url": receiver, "events": ["flow.completed"]}
        )
        endpoint_id = r.json()["id"]
        sign_in(page, app)
        page.goto(f"{app.base}/settings/webhooks/{endpoint_id}")
        assert "Sending." in page.inner_text("#pause")
        page.click("#pause button")
        page.wait_for_load_state()
        assert "Paused: deliveries wait." in page.inner_text("main")
        assert page.inner_text("#endpoint-state") == "Paused"
        assert api.get(f"/api/v1/webhooks/endpoints/{endpoint_id}").json()["paused"] is True

        flow = {"name": "Order placed", "steps": [{"id": "a", "type": "transform", "output": {}}]}
        flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
        for n in range(2):
            api.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {"n": n}})

        def held() -> list[dict[str, Any]]:
            q = {"endpoint_id": endpoint_id}
            data = api.get("/api/v1/webhooks/deliveries", params=q).json()["data"]
            return [d for d in data if d["waiting_for"]]

        [first, _] = until(lambda: len(found := held()) == 2 and found)
        page.reload()
        assert "Paused since" in page.inner_text("#pause") and "2 pending" in page.inner_text(
            "#pause"
        )
        shot(page, "why-endpoint-paused")
        page.goto(f"{app.base}/settings/webhooks")
        assert "Paused" in page.inner_text("main")
        page.goto(f"{app.base}/deliveries?status=pending")
        assert "Held: endpoint paused" in page.inner_text("main")
        shot(page, "why-deliveries-held")
        page.goto(f"{app.base}/deliveries/{first['id']}")
        assert "Held: the endpoint is paused" in page.inner_text("#held")
        shot(page, "why-delivery-held")
        assert Hook.seen == []

        page.goto(f"{app.base}/settings/webhooks/{endpoint_id}")
        page.click("#pause button")
        page.wait_for_load_state()
        assert "Resumed: held deliveries go." in page.inner_text("main")
        until(lambda: len(Hook.seen) == 2)
        assert api.get(f"/api/v1/webhooks/endpoints/{endpoint_id}").json()["paused"] is False


def test_the_api_docs_load_from_the_package_with_no_request_elsewhere(
    app: Server, page: Any
) -> None:
    """/api/v1/docs renders the OpenAPI document with Swagger UI served by Flowhook itself
    (behind a firewall the page works): every request the page makes stays on this server,
    and its Content-Security-Policy blocks nothing it does. The pages have a favicon."""
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.goto(f"{app.base}/api/v1/docs")
    page.wait_for_selector(".opblock-tag", timeout=20_000)
    assert "execute" in page.inner_text("#swagger-ui").lower()
    assert asked and all(url.startswith(app.base) for url in asked), asked
    shot(page, "api-docs")
    r = httpx.get(f"{app.base}/static/favicon.svg")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    page.goto(f"{app.base}/signin")
    assert page.get_attribute("link[rel=icon]", "href") == "/static/favicon.svg"
