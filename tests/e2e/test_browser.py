"""The settings screen and run browser in a real browser (Playwright driving Debian's
Chromium) against a real `flowhook serve` and a real webhook receiver. Screenshots of each
page are saved under test-artifacts/screenshots/."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.browser import shot
from tests.support import Server, serve

pytestmark = pytest.mark.e2e


class Hook(BaseHTTPRequestHandler):
    status: ClassVar[int] = 200
    seen: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        Hook.seen.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(Hook.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"receiver": "says %d"}' % Hook.status)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Hook.status, Hook.seen = 200, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Server]:
    env = {
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2,0.2",
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    with serve(tmp_path, f"sqlite:///{tmp_path / 'ui.db'}", **env) as server:
        yield server


Opener = Callable[[str], httpx.Client]


@pytest.fixture
def client(app: Server) -> Iterator[Opener]:
    """Opens API clients with a key; all are closed when the test ends, failed or not (a
    socket left open is a warning in whatever test the collector runs in next)."""
    opened: list[httpx.Client] = []

    def open_client(key: str) -> httpx.Client:
        opened.append(httpx.Client(base_url=app.base, headers={"Authorization": f"Bearer {key}"}))
        return opened[-1]

    yield open_client
    for c in opened:
        c.close()


def reload_until(page: Any, check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen on {page.url}:\n{page.inner_text('main')}")
        time.sleep(0.3)
        page.reload()


def test_settings_screen_end_to_end(app: Server, client: Opener, receiver: str, page: Any) -> None:
    base = app.base
    key, live_key = app.value("sandbox key"), app.value("live key")
    flow_id = app.value("example flow")

    # Sign in with the sandbox key.
    page.goto(base + "/")
    shot(page, "01-sign-in")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/overview$"))
    assert page.inner_text(".mode") == "SANDBOX" or page.inner_text(".mode").lower() == "sandbox"
    shot(page, "02-overview-empty")

    # Add an endpoint choosing two events.
    page.click("text=Webhooks")
    page.fill("#url", receiver)
    page.check("input[value='flow.completed']")
    page.check("input[value='flow.failed']")
    shot(page, "03-add-endpoint")
    page.click("text=Add endpoint")
    page.wait_for_url(re.compile(r"/settings/webhooks/ep_"))
    assert page.inner_text("#secret").startswith("whsec_")
    shot(page, "04-endpoint")
    page.click("a:has-text('Webhooks')")
    assert "flow.completed" in page.inner_text("table") and "flow.failed" in page.inner_text(
        "table"
    )
    shot(page, "05-webhooks")

    # Start a run from the UI; the JSON editor refuses a bad payload first.
    page.goto(f"{base}/flows/{flow_id}")
    page.fill("#payload", '{"order_id": ')
    page.click("text=Start run")
    assert "not valid JSON" in page.inner_text("#payload-error")
    page.fill("#payload", json.dumps({"order_id": "ord_ui", "amount": 10}))
    shot(page, "06-flow")
    page.click("text=Start run")
    page.wait_for_url(re.compile(r"/runs/run_"))
    page.wait_for_selector("#run-status[data-status=completed]")
    reload_until(page, lambda: page.locator("a.pill.ok:has-text('succeeded')").count() > 0)
    assert "check" in page.inner_text(".timeline") and "summary" in page.inner_text(".timeline")
    shot(page, "07-run-completed")

    # The receiver fails: the failed delivery shows its status and error.
    Hook.status = 500
    page.goto(f"{base}/flows/{flow_id}")
    page.fill("#payload", json.dumps({"order_id": "ord_down", "amount": 1}))
    page.click("text=Start run")
    page.wait_for_selector("#run-status[data-status=completed]")
    page.goto(base + "/deliveries")
    reload_until(page, lambda: "http_5xx" in page.inner_text("main"))
    row = page.locator("tr", has_text="http_5xx").first
    assert "500" in row.inner_text() and "failed" in row.inner_text()
    shot(page, "08-deliveries-failed")
    row.locator("a").first.click()
    assert page.locator("td:has-text('500')").count() >= 1
    shot(page, "09-delivery-detail")

    # The receiver recovers; replay succeeds.
    Hook.status = 200
    page.click("button:has-text('Replay')")
    page.wait_for_url(re.compile(r"/deliveries/dlv_"))
    reload_until(page, lambda: page.inner_text("#delivery-status") == "succeeded")
    shot(page, "10-replayed")

    # Cancel a running run.
    api = client(key)
    slow = api.post(
        "/api/v1/flows",
        json={"name": "Slow", "steps": [{"id": "wait", "type": "delay", "seconds": 120}]},
    )
    page.goto(f"{base}/flows/{slow.json()['flow_id']}")
    page.click("text=Start run")
    page.wait_for_url(re.compile(r"/runs/run_"))
    run_url = page.url
    reload_until(
        page,
        lambda: (
            "waiting" in page.inner_text(".timeline")
            if page.locator(".timeline").count()
            else False
        ),
    )
    page.click("button:has-text('Cancel run')")
    page.goto(run_url)
    reload_until(page, lambda: page.get_attribute("#run-status", "data-status") == "cancelled")
    shot(page, "11-run-cancelled")
    page.goto(base + "/runs")
    shot(page, "12-runs")

    # A form post without its CSRF token is refused.
    forged = page.request.post(
        base + "/settings/webhooks", form={"url": receiver, "events": "flow.failed"}
    )
    assert forged.status == 403
    # A sandbox session cannot open a live run by URL.
    live = client(live_key)
    live_flow = live.post(
        "/api/v1/flows",
        json={"name": "L", "steps": [{"id": "a", "type": "transform", "output": {}}]},
    ).json()
    live_run = live.post("/api/v1/flows/execute", json={"flow_id": live_flow["flow_id"]}).json()[
        "run_id"
    ]
    response = page.goto(f"{base}/runs/{live_run}")
    assert response is not None and response.status == 404
    shot(page, "13-not-found")
    # Signing out ends the session.
    page.goto(base + "/runs")
    page.click("text=Sign out")
    page.wait_for_url(re.compile(r"/signin$"))
    page.goto(base + "/settings/webhooks")
    assert page.url.endswith("/signin")
    api.close()
    live.close()


def test_phone_width_is_readable(app: Server, page: Any) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(app.base + "/signin")
    page.fill("#api_key", app.value("sandbox key"))
    page.click("button[type=submit]")
    page.goto(app.base + "/settings/webhooks")
    shot(page, "14-phone-webhooks")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"page is {width}px wide on a 390px screen"


def sign_in(page: Any, app: Server) -> None:
    page.goto(app.base + "/signin")
    page.fill("#api_key", app.value("sandbox key"))
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/overview$"))


def test_rerun_from_the_run_page(app: Server, client: Opener, receiver: str, page: Any) -> None:
    """A run fails at its call to a service that is down; once it is back, one click reruns it
    from the failed step, and the step before it is reused, not run again."""
    api = client(app.value("sandbox key"))
    flow = {
        "name": "Charge and notify",
        "steps": [
            {"id": "charge", "type": "http", "request": {"method": "POST", "url": receiver}},
            {"id": "notify", "type": "http", "request": {"method": "POST", "url": receiver}},
            {"id": "summary", "type": "transform", "output": {"ok": True}},
        ],
    }
    flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
    Hook.status = 200
    run_id = api.post("/api/v1/flows/execute", json={"flow_id": flow_id}).json()["run_id"]
    while api.get(f"/api/v1/flows/runs/{run_id}").json()["status"] != "completed":
        time.sleep(0.05)
    Hook.status, Hook.seen = 503, []
    failed = api.post("/api/v1/flows/execute", json={"flow_id": flow_id}).json()["run_id"]
    sign_in(page, app)
    page.goto(f"{app.base}/runs/{failed}")
    page.wait_for_selector("#run-status[data-status=failed]")
    assert "Charge and notify" in page.inner_text(".facts")  # the flow's name beside its id
    assert page.locator(".bar rect").count() >= 1  # the steps as a timeline of durations
    failure = page.inner_text("li.step[data-step=charge] .step-error")
    assert failure.startswith("http POST ") and failure.endswith("answered 503"), failure
    response = page.locator("li.step[data-step=charge] details.response")
    assert "(503)" in response.inner_text() and '"says 503"' in response.inner_text()
    shot(page, "15-run-failed")

    Hook.status = 200
    page.click("#rerun-failed")
    page.wait_for_url(re.compile(r"/runs/run_"))
    assert not page.url.split("?")[0].endswith(failed)
    page.wait_for_selector("#run-status[data-status=completed]")
    reused = page.locator("li.step.reused")
    assert reused.count() == 0  # charge failed: the rerun starts there
    assert f"rerun of {failed}" in page.inner_text(".facts").lower()
    shot(page, "16-rerun-completed")

    # "Rerun from here" on the last step of the completed run reuses the two calls
    calls = len(Hook.seen)
    page.locator("li.step[data-step=summary] button:has-text('Rerun from here')").click()
    page.wait_for_url(re.compile(r"/runs/run_"))
    page.wait_for_selector("#run-status[data-status=completed]")
    assert page.locator("li.step.reused").count() == 2
    assert "Rerun of" in page.inner_text(".notice")
    assert len(Hook.seen) == calls  # charge and notify did not run again
    shot(page, "17-rerun-from-here")

    # A run waiting for a signal says what for and until when, then goes on when it comes
    waits = {
        "name": "Await payment",
        "steps": [
            {"id": "paid", "type": "wait", "signal": "order.paid",
             "match": {"order_id": "{{ payload.order_id }}"}, "timeout_seconds": 3600},
        ],
    }  # fmt: skip
    wait_flow = api.post("/api/v1/flows", json=waits).json()["flow_id"]
    body = {"flow_id": wait_flow, "payload": {"order_id": "ord_7"}}
    waiting = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    page.goto(f"{app.base}/runs/{waiting}")
    reload_until(page, lambda: page.locator(".waitfor").count() > 0)
    text = page.inner_text(".waitfor")
    assert "order.paid" in text and '"ord_7"' in text and "until" in text, text
    shot(page, "18-run-waiting-for-signal")
    sent = api.post("/api/v1/signals", json={"name": "order.paid", "data": {"order_id": "ord_7"}})
    assert sent.json()["matched"] == 1
    page.wait_for_selector("#run-status[data-status=completed]")  # the page refreshes itself
    api.close()


def test_approve_from_the_run_page_and_by_link(app: Server, client: Opener, page: Any) -> None:
    """Approve from the run page; then open an approval link (the GET decides nothing) and
    confirm with the button."""
    api = client(app.value("sandbox key"))
    flow = {
        "name": "Refund",
        "steps": [
            {"id": "manager", "type": "approval", "message": "Refund {{ payload.amount }} EUR?",
             "timeout_seconds": 3600},
            {"id": "pay", "type": "transform", "output": {"paid": True}},
        ],
    }  # fmt: skip
    flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]

    def requested(run_id: str) -> dict[str, Any]:
        for _ in range(200):
            for e in api.get(f"/api/v1/flows/runs/{run_id}/events").json()["data"]:
                if e["event"] == "flow.approval_requested":
                    return dict(e["body"]["payload"])
            time.sleep(0.05)
        raise AssertionError("no approval was requested")

    body = {"flow_id": flow_id, "payload": {"amount": 120}}
    by_page = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    requested(by_page)
    sign_in(page, app)
    page.goto(f"{app.base}/runs/{by_page}")
    assert "Refund 120 EUR?" in page.inner_text(".waitfor")
    page.fill("textarea[name=comment]", "checked the invoice")
    shot(page, "19-run-approval")
    page.click("form.decide button[value=approve]")
    page.wait_for_selector("#run-status[data-status=completed]")
    assert "Approved by the settings screen" in page.inner_text(".timeline")
    assert "checked the invoice" in page.inner_text(".timeline")
    shot(page, "20-run-approved")

    by_link = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    links = requested(by_link)
    page.goto(links["approve_url"].replace("http://127.0.0.1:8080", app.base))
    assert "Approve?" in page.inner_text("h1") and "Refund 120 EUR?" in page.inner_text("main")
    shot(page, "21-approval-link")
    time.sleep(0.3)
    assert api.get(f"/api/v1/flows/runs/{by_link}").json()["status"] == "running"
    page.click("#decide")
    assert page.inner_text("h1") == "Approved"
    shot(page, "22-approval-link-decided")
    for _ in range(200):
        if api.get(f"/api/v1/flows/runs/{by_link}").json()["status"] == "completed":
            break
        time.sleep(0.05)
    run = api.get(f"/api/v1/flows/runs/{by_link}").json()
    assert run["status"] == "completed" and run["steps"][0]["output"]["decided_by"] == "link"
    page.goto(links["reject_url"].replace("http://127.0.0.1:8080", app.base))
    assert "Already decided" in page.inner_text("main")  # single use: both links are spent
    api.close()


def test_a_parent_and_its_child_run_link_each_other(app: Server, client: Opener, page: Any) -> None:
    """A run whose ``flow`` step started a child shows the child (status, link); the child's
    page links back to its parent."""
    api = client(app.value("sandbox key"))
    child = {
        "name": "Ship order",
        "steps": [{"id": "label", "type": "transform", "output": {"label": "L-{{ payload.n }}"}}],
        "output": {"label": "{{ steps.label.output.label }}"},
    }
    child_id = api.post("/api/v1/flows", json=child).json()["flow_id"]
    parent = {
        "name": "Order",
        "steps": [
            {"id": "ship", "type": "flow", "flow_id": child_id, "payload": {"n": 7}},
            {"id": "done", "type": "transform", "output": {"ok": True}},
        ],
    }
    parent_id = api.post("/api/v1/flows", json=parent).json()["flow_id"]
    run_id = api.post("/api/v1/flows/execute", json={"flow_id": parent_id}).json()["run_id"]
    for _ in range(200):
        if api.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "completed":
            break
        time.sleep(0.05)
    sign_in(page, app)
    page.goto(f"{app.base}/runs/{run_id}")
    line = page.inner_text("li[data-step=ship] .child")
    assert "Child run of Ship order run_" in line and "completed" in line
    shot(page, "23-run-with-child")
    page.click("li[data-step=ship] a.child-run")
    page.wait_for_selector("#parent-run")
    assert "Ship order" in page.inner_text(".facts")
    assert "started by a run of Order run_" in page.inner_text(".facts")
    assert run_id in page.inner_text("#parent-run")
    shot(page, "24-child-run")
    api.close()


def test_the_run_page_draws_parallel_and_map_as_a_tree(
    app: Server, client: Opener, page: Any
) -> None:
    """A parallel's branches side by side, a map's items counted by status and listed: one
    completed, one failed, two stopped where they waited, one never started."""
    api = client(app.value("sandbox key"))
    flow = {
        "name": "Enrich and charge",
        "steps": [
            {"id": "enrich", "type": "parallel", "branches": {
                "crm": [{"id": "crm_look", "type": "transform", "output": {"tier": "gold"}}],
                "billing": [{"id": "bill_look", "type": "transform", "output": {"owed": 3}},
                            {"id": "bill_sum", "type": "transform", "output": {"owed": 6}}]}},
            # item 0 goes straight to charge; the others wait for their line's signal, and
            # a negative line then fails. Three run at once: item 3 starts when item 0
            # completes, item 4 never (no other item completes).
            {"id": "each", "type": "map", "items": "{{ payload.lines }}", "concurrency": 3,
             "steps": [{"id": "gate", "type": "condition", "if": "{{ index == 0 }}",
                        "then": "charge"},
                       {"id": "hold", "type": "wait", "signal": "line",
                        "match": {"run": "{{ run.id }}", "n": "{{ item }}"}},
                       {"id": "check", "type": "condition", "if": "{{ item > 0 }}",
                        "else": "fail"},
                       {"id": "charge", "type": "transform",
                        "output": {"cents": "{{ item * 100 }}"}}]},
        ],
    }  # fmt: skip
    flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
    body = {"flow_id": flow_id, "payload": {"lines": [1, 2, -3, 4, 5]}}
    run_id = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    for _ in range(200):  # items 1, 2 and 3 wait
        steps = api.get(f"/api/v1/flows/runs/{run_id}").json()["steps"]
        waiting = [s["index"] for s in steps if (s["id"], s["status"]) == ("hold", "waiting")]
        if sorted(waiting) == [1, 2, 3]:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"items 1 to 3 never waited: {steps}")
    r = api.post("/api/v1/signals", json={"name": "line", "data": {"run": run_id, "n": -3}})
    assert r.json()["matched"] == 1, r.text
    for _ in range(200):
        if api.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "failed":
            break
        time.sleep(0.05)
    sign_in(page, app)
    page.goto(f"{app.base}/runs/{run_id}")
    branches = page.locator("li[data-step=enrich] .branch")
    assert branches.count() == 2
    assert sorted(branches.nth(i).get_attribute("data-status") for i in range(2)) == [
        "completed", "completed"
    ]  # fmt: skip
    assert "branch crm" in page.inner_text("li[data-step=enrich] .branches")
    counts = page.inner_text("li[data-step=each] .counts")
    for part in ("5 items", "1 completed", "1 failed", "2 cancelled", "1 not started"):
        assert part in counts, counts
    page.click("li[data-step=each] details.items > summary")
    items = page.locator("li[data-step=each] .item")
    assert [items.nth(i).get_attribute("data-status") for i in range(items.count())] == [
        "completed", "cancelled", "failed", "cancelled", "not started"
    ]  # fmt: skip
    # the waits of the cancelled items read cancelled, not waiting (their records still wait)
    holds = page.locator("li[data-step=each] .item li[data-step=hold] > .row .pill")
    assert [holds.nth(i).inner_text() for i in range(holds.count())] == [
        "skipped", "cancelled", "completed", "cancelled"
    ]  # fmt: skip
    shot(page, "25-run-tree")
    api.close()


def test_a_nested_approval_is_decided_from_the_run_page(
    app: Server, client: Opener, page: Any
) -> None:
    """An approval in a parallel's branch has its Approve and Reject buttons on the run's
    page; approving it lets the branch and the run go on."""
    api = client(app.value("sandbox key"))
    flow = {
        "name": "Refund with checks",
        "steps": [
            {"id": "checks", "type": "parallel", "branches": {
                "fraud": [{"id": "score", "type": "transform", "output": {"score": 3}}],
                "people": [{"id": "manager", "type": "approval",
                            "message": "Refund {{ payload.amount }} EUR?"},
                           {"id": "noted", "type": "transform", "output": {"ok": True}}]}},
        ],
    }  # fmt: skip
    flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
    body = {"flow_id": flow_id, "payload": {"amount": 80}}
    run_id = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    for _ in range(200):
        steps = api.get(f"/api/v1/flows/runs/{run_id}").json()["steps"]
        if any((s["id"], s["status"]) == ("manager", "waiting") for s in steps):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the approval never waited: {steps}")
    sign_in(page, app)
    page.goto(f"{app.base}/runs/{run_id}")
    assert "Refund 80 EUR?" in page.inner_text("li[data-step=manager] .waitfor")
    assert "Waiting for its branches to end." in page.inner_text("li[data-step=checks] .waitfor")
    shot(page, "25b-nested-approval")
    page.click("li[data-step=manager] form.decide button[value=approve]")
    page.wait_for_selector("#run-status[data-status=completed]")
    assert "Approved by the settings screen" in page.inner_text("li[data-step=manager]")
    api.close()


def test_a_run_held_back_by_flow_control_says_why(app: Server, client: Opener, page: Any) -> None:
    """A run waiting for a slot of its key shows the reason and the key on its page."""
    api = client(app.value("sandbox key"))
    flow = {
        "name": "Sync customer",
        "concurrency": {"limit": 1, "key": "{{ payload.customer }}"},
        "priority": 5,
        "steps": [
            {"id": "hold", "type": "wait", "signal": "sync.done",
             "match": {"n": "{{ payload.n }}"}},
        ],
    }  # fmt: skip
    flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
    body = {"flow_id": flow_id, "payload": {"customer": "cus_42", "n": 1}}
    first = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    body["payload"] = {"customer": "cus_42", "n": 2}
    second = api.post("/api/v1/flows/execute", json=body).json()["run_id"]
    for _ in range(200):
        if api.get(f"/api/v1/flows/runs/{second}").json()["waiting_for"]:
            break
        time.sleep(0.05)
    sign_in(page, app)
    page.goto(f"{app.base}/runs/{second}")
    why = page.inner_text("#waiting-for")
    assert "concurrency limit for cus_42" in why and "starts when a run of that key ends" in why
    assert "Held back by flow control." in page.inner_text("main")
    assert "Priority" in page.inner_text(".facts")
    shot(page, "26-run-held-by-concurrency")
    for run_id in (first, second):
        api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    api.close()


def test_an_endpoint_s_pace_order_and_flows_are_set_in_its_form(
    app: Server, client: Opener, page: Any
) -> None:
    """The add form sets rate limit, FIFO and the flows by name; the endpoint page shows
    them and lifts them again."""
    api = client(app.value("sandbox key"))
    ledger = {"name": "Ledger entry", "steps": [{"id": "a", "type": "transform", "output": {}}]}
    flow_id = api.post("/api/v1/flows", json=ledger).json()["flow_id"]
    sign_in(page, app)
    page.goto(f"{app.base}/settings/webhooks")
    page.fill("#url", "http://127.0.0.1:9/ledger")
    page.check("input[value='flow.completed']")
    page.fill("#rate_limit", "5")
    page.check("input[name='fifo']")
    page.select_option("#flow_ids", flow_id)
    assert "Ledger entry" in page.inner_text("#flow_ids")
    shot(page, "27-add-paced-endpoint")
    page.click("text=Add endpoint")
    page.wait_for_url(re.compile(r"/settings/webhooks/ep_"))
    endpoint_id = page.url.rsplit("/", 1)[-1].split("?")[0]
    record = api.get(f"/api/v1/webhooks/endpoints/{endpoint_id}").json()
    assert (record["rate_limit"], record["ordering"]) == (5, "fifo")
    assert record["filter"] == {"flow_ids": [flow_id]}
    assert page.input_value("#rate_limit") == "5"
    assert page.is_checked("input[name='fifo']")
    shot(page, "28-paced-endpoint")
    page.goto(f"{app.base}/settings/webhooks")
    summary = page.inner_text(".controls-summary")
    assert summary == "at most 5 a second · one at a time, in order · only Ledger entry", summary
    page.goto(f"{app.base}/settings/webhooks/{endpoint_id}?created=1")
    page.fill("#rate_limit", "")
    page.uncheck("input[name='fifo']")
    page.click("text=Save")
    page.wait_for_load_state()
    shot(page, "29-paced-endpoint-saved")
    assert "Saved." in page.inner_text("main"), page.inner_text("main")
    assert "whsec_" not in page.inner_text("main")  # a save shows the secret no more
    record = api.get(f"/api/v1/webhooks/endpoints/{endpoint_id}").json()
    assert (record["rate_limit"], record["ordering"]) == (None, None)
    assert record["filter"] == {"flow_ids": [flow_id]}  # still chosen in the list
    api.close()


def test_the_run_page_follows_the_run_s_stream(app: Server, client: Opener, page: Any) -> None:
    """A running run's page changes as its steps finish, without a reload: it follows the
    run's event stream (no 2 s polling)."""
    api = client(app.value("sandbox key"))
    flow = {
        "name": "Two signals",
        "steps": [
            {"id": "first", "type": "wait", "signal": "go.first"},
            {"id": "second", "type": "wait", "signal": "go.second"},
            {"id": "done", "type": "transform", "output": {"ok": True}},
        ],
    }
    flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
    run_id = api.post("/api/v1/flows/execute", json={"flow_id": flow_id}).json()["run_id"]
    for _ in range(200):
        steps = api.get(f"/api/v1/flows/runs/{run_id}").json()["steps"]
        if steps and steps[0]["status"] == "waiting":
            break
        time.sleep(0.05)
    sign_in(page, app)
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if r.resource_type == "eventsource" else 0)
    page.goto(f"{app.base}/runs/{run_id}")
    page.wait_for_selector("li[data-step=first].waiting")
    page.evaluate("window.notReloaded = true")
    shot(page, "25-run-live-waiting")
    # One stream, from after the last event the page was drawn with (no redraw for those).
    [stream] = streams
    events = api.get(f"/api/v1/flows/runs/{run_id}/events").json()["data"]
    assert stream == f"{app.base}/runs/{run_id}/stream?after={events[-1]['id']}"

    def send(name: str) -> None:
        r = api.post("/api/v1/signals", json={"name": name, "data": {}})
        assert r.status_code == 202, r.text

    # A step that starts to wait has no event: the page draws again on first's event, and
    # when that draw is made before the engine reached second (here: always, the draw is
    # the stale one below), the page itself looks again until a step is under way.
    partial = f"{app.base}/runs/{run_id}?partial=1"
    stale = page.evaluate(f"fetch({json.dumps(partial)}).then(r => r.text())")
    stale = stale.replace('id="run-status"', 'id="run-status" data-between-steps', 1)
    looks: list[str] = []

    def first_draw_is_stale(route: Any) -> None:
        looks.append(route.request.url)
        if len(looks) == 1:
            route.fulfill(status=200, content_type="text/html", body=stale)
        else:
            route.continue_()

    page.route(partial, first_draw_is_stale)
    send("go.first")
    page.wait_for_selector("li[data-step=first].completed")
    page.wait_for_selector("li[data-step=second].waiting")
    assert len(looks) >= 2
    page.unroute(partial)
    shot(page, "26-run-live-first-done")
    send("go.second")
    page.wait_for_selector("#run-status[data-status=completed]")
    page.wait_for_selector("li[data-step=done].completed")
    assert page.evaluate("window.notReloaded") is True  # the same page, changed in place
    assert page.get_attribute("#run", "data-live") == "stream"  # not the polling fallback
    shot(page, "27-run-live-completed")
    api.close()
