"""Names where people think in names, and waiting shown as waiting, on the settings screen's
lists (Playwright driving Debian's Chromium against a real `flowhook serve`, at 1280 and
390 px): the runs list names each run's flow and says what a sleeping run waits for and
where a failed one failed; the flows list links the name; deliveries name their endpoint;
the overview counts the runs waiting for a person or a signal, linking to them.
Screenshots: test-artifacts/screenshots/names-*.png (looked at)."""

from __future__ import annotations

import re
import socket
from typing import Any

import httpx
import pytest

from tests.browser import shot
from tests.e2e.test_browser import sign_in
from tests.e2e.test_why_browser import Flows, app, until
from tests.support import Server

pytestmark = pytest.mark.e2e
__all__ = ["app"]  # the fixture, used by name


def test_lists_show_names_and_what_runs_wait_for(app: Server, page: Any) -> None:
    made = Flows(app)
    api, flow, start = made.api, made.flow, made.start

    def record(run_id: str) -> dict[str, Any]:
        return dict(api.get(f"/api/v1/flows/runs/{run_id}").json())

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r = api.post(
        "/api/v1/webhooks/endpoints",
        json={"url": f"http://127.0.0.1:{closed}/hook", "events": ["flow.failed"],
              "description": "Billing alerts"},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    refund = start(flow({"name": "Refund", "steps": [
        {"id": "manager", "type": "approval", "message": "Refund 40 EUR?"}]}))  # fmt: skip
    paid = start(flow({"name": "Ship when paid", "steps": [
        {"id": "gate", "type": "wait", "signal": "order.paid"}]}))  # fmt: skip
    nap = start(flow({"name": "Cool off", "steps": [
        {"id": "nap", "type": "delay", "seconds": 3600}]}))  # fmt: skip
    broken = start(flow({"name": "Charge card", "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.amount > 0 }}", "else": "fail"}]}),
        {"amount": -3})  # fmt: skip
    until(lambda: record(refund)["waiting_for"] and record(paid)["waiting_for"])
    until(lambda: record(nap)["waiting_for"] and record(broken)["status"] == "failed")
    until(lambda: api.get("/api/v1/webhooks/deliveries").json()["data"])

    sign_in(page, app)
    page.goto(f"{app.base}/runs")
    table = page.inner_text("#runs")
    for name in ("Refund", "Ship when paid", "Cool off", "Charge card"):
        assert name in table, table
    assert "wf_" not in table  # every flow is named, not shown by id
    status = {
        run_id: page.inner_text(f"tr:has(a[href='/runs/{run_id}']) td[data-label=Status]")
        for run_id in (refund, paid, nap, broken)
    }
    assert status[refund] == "waiting for approval"
    assert status[paid] == "waiting for signal order.paid"
    assert re.fullmatch(r"sleeping until \d\d:\d\d UTC|sleeping until \w+ \d+ \d\d:\d\d UTC",
                        status[nap]), status[nap]  # fmt: skip
    assert status[broken] == "failed"
    failed_at = page.inner_text(f"tr:has(a[href='/runs/{broken}']) td[data-label='Failed at']")
    assert failed_at.startswith("check: condition 'check' was false"), failed_at
    shot(page, "names-runs")

    page.goto(f"{app.base}/runs/{refund}")
    assert page.inner_text("#run-status") == "waiting for approval"
    assert page.get_attribute("#run-status", "data-status") == "running"

    page.goto(f"{app.base}/overview")
    legend = page.inner_text("#runs-hour .legend")
    assert "Waiting\n3" in legend.replace(" ", "\n") and "Running\n0" in legend.replace(" ", "\n")
    assert page.locator("#runs-hour rect.s-waiting").count() >= 1
    assert page.locator("#runs-hour rect.s-running").count() == 0
    assert page.inner_text("#tile-people .big") == "1"
    assert "1 waiting for a signal" in page.inner_text("#tile-people")
    shot(page, "names-overview")
    page.click("#tile-people .big a")
    page.wait_for_url(re.compile(r"/runs\?waiting=approval$"))
    assert "Runs waiting for a person" in page.inner_text("h1")
    rows = page.locator("#runs tbody tr").all_inner_texts()
    assert len(rows) == 1 and "Refund" in rows[0], rows
    page.goto(f"{app.base}/overview")
    page.click("#signals-waiting")
    page.wait_for_url(re.compile(r"/runs\?waiting=signal$"))
    rows = page.locator("#runs tbody tr").all_inner_texts()
    assert len(rows) == 1 and "Ship when paid" in rows[0], rows

    page.goto(f"{app.base}/flows")
    names = page.locator("a.flow-name").all_inner_texts()
    assert {"Refund", "Ship when paid", "Cool off", "Charge card"} <= set(names), names
    shot(page, "names-flows")

    page.goto(f"{app.base}/deliveries?status=all")
    assert "Billing alerts" in page.inner_text("main")
    shot(page, "names-deliveries")
    page.click("tbody tr a[href^='/deliveries/dlv_']")
    assert f"http://127.0.0.1:{closed}/hook" in page.inner_text(".facts")
    assert "(Billing alerts)" in page.inner_text(".facts")

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{app.base}/runs")
    cell = page.locator(f"tr:has(a[href='/runs/{refund}']) td[data-label=Status]")
    box = cell.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 390, box  # on screen
    shot(page, "names-runs-390")
    page.goto(f"{app.base}/overview")
    shot(page, "names-overview-390")
    for run_id in (refund, paid, nap):
        api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    api.close()


def test_the_triggers_page_shows_hooks_and_schedules_by_flow_name_and_acts_on_them(
    app: Server, page: Any
) -> None:
    made = Flows(app)
    api = made.api
    flow_id = made.flow({"name": "Nightly report", "steps": [
        {"id": "a", "type": "transform", "output": {}}]})  # fmt: skip
    r = api.post("/api/v1/hooks", json={"flow_id": flow_id, "verify": {"type": "hmac"}})
    assert r.status_code == 201, r.text
    hook = r.json()
    r = api.post("/api/v1/schedules", json={"flow_id": flow_id, "cron": "0 3 * * *"})
    assert r.status_code == 201, r.text
    schedule = r.json()
    unsigned = httpx.post(hook["url"], json={"order": 1})  # hmac: refused, and kept as such
    assert unsigned.status_code == 401, unsigned.text

    sign_in(page, app)
    page.click("nav a[href='/settings/triggers']")
    page.wait_for_url(re.compile(r"/settings/triggers$"))
    hooks = page.inner_text("#hooks")
    assert "a run of Nightly report" in hooks and hook["url"] in hooks and "hmac" in hooks
    assert hook["verify"]["secret"] not in page.content()  # shown when made or rotated only
    schedules = page.inner_text("#schedules")
    assert "a run of Nightly report" in schedules and "0 3 * * *" in schedules
    assert len(page.locator(f"tr[data-schedule='{schedule['id']}'] td.next div").all()) == 3
    arrival = page.inner_text(f"tr[data-hook='{hook['id']}'] td.arrivals")
    assert "refused" in arrival and "signature" in arrival, arrival
    assert "wf_" not in hooks + schedules
    shot(page, "triggers")

    page.click(f"tr[data-hook='{hook['id']}'] button:text('Rotate')")
    page.wait_for_selector("#rotated")
    new_url = page.inner_text("#new-url")
    assert new_url != hook["url"] and new_url.startswith(f"{app.base}/api/v1/hooks/hk_")
    assert page.inner_text("#new-secret") not in ("", hook["verify"]["secret"])
    assert httpx.post(hook["url"], json={}).status_code == 404  # the old URL is gone
    shot(page, "triggers-rotated")

    page.goto(f"{app.base}/settings/triggers")
    page.click(f"tr[data-schedule='{schedule['id']}'] button:text('Pause')")
    page.wait_for_url(re.compile(r"done=paused"))
    assert "Paused" in page.inner_text(f"tr[data-schedule='{schedule['id']}']")
    assert api.get(f"/api/v1/schedules/{schedule['id']}").json()["enabled"] is False
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "triggers-390")
    page.click(f"tr[data-schedule='{schedule['id']}'] button:text('Resume')")
    page.wait_for_url(re.compile(r"done=resumed"))
    assert api.get(f"/api/v1/schedules/{schedule['id']}").json()["enabled"] is True
    page.click(f"tr[data-schedule='{schedule['id']}'] button:text('Delete')")
    page.wait_for_url(re.compile(r"done=deleted-schedule"))
    page.click("#hooks button:text('Delete')")
    page.wait_for_url(re.compile(r"done=deleted-hook"))
    assert "No inbound hooks" in page.inner_text("#hooks")
    assert "No schedules" in page.inner_text("#schedules")
    assert httpx.post(new_url, json={}).status_code == 404
    api.close()


def test_the_flow_and_its_runs_are_drawn_as_a_graph(app: Server, page: Any) -> None:
    """The flow page draws the steps (branches side by side, a map's steps in a box, a
    sub-flow by its flow's name, a condition's jump as an arrow); a run's page draws the
    same graph coloured by how each step went."""
    made = Flows(app)
    child = made.flow({"name": "Ship order", "steps": [
        {"id": "label", "type": "transform", "output": {}}]})  # fmt: skip
    flow_id = made.flow({"name": "Order pipeline", "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.n > 0 }}", "else": "refuse"},
        {"id": "enrich", "type": "parallel", "branches": {
            "crm": [{"id": "crm_lookup", "type": "transform", "output": {"tier": "gold"}}],
            "billing": [{"id": "terms", "type": "transform", "output": {"days": 30}},
                        {"id": "limit", "type": "transform", "output": {"eur": 500}}]}},
        {"id": "each", "type": "map", "items": "{{ payload.lines }}", "steps": [
            {"id": "price", "type": "transform", "output": {"x": "{{ item }}"}}]},
        {"id": "ship", "type": "flow", "flow_id": child},
        {"id": "refuse", "type": "condition", "if": "{{ payload.n > 0 }}", "else": "fail"},
    ]})  # fmt: skip
    sign_in(page, app)
    page.goto(f"{app.base}/flows/{flow_id}")
    graph = page.locator("#graph svg.graph")
    for step in ("check", "enrich", "crm_lookup", "terms", "limit", "each", "price", "ship"):
        assert graph.locator(f"[data-step='{step}']").count() == 1, step
    assert "calls Ship order" in (graph.text_content() or "")
    assert graph.locator("path.jump").count() == 1  # check's else: skip to refuse
    crm = graph.locator("[data-step='crm_lookup'] rect").bounding_box()
    terms = graph.locator("[data-step='terms'] rect").bounding_box()
    assert crm and terms and abs(crm["y"] - terms["y"]) < 1 and crm["x"] != terms["x"]
    shot(page, "graph-flow")

    ok = made.start(flow_id, {"n": 1, "lines": [1, 2]})
    failed = made.start(flow_id, {"n": 0, "lines": []})
    until(lambda: made.api.get(f"/api/v1/flows/runs/{ok}").json()["status"] == "completed")
    until(lambda: made.api.get(f"/api/v1/flows/runs/{failed}").json()["status"] == "failed")
    page.goto(f"{app.base}/runs/{failed}")
    graph = page.locator("#graph svg.graph")  # open on a failed run
    assert "failed" in (graph.locator("[data-step='refuse']").get_attribute("class") or "")
    assert "completed" in (graph.locator("[data-step='check']").get_attribute("class") or "")
    shot(page, "graph-run-failed")
    page.goto(f"{app.base}/runs/{ok}")
    page.click("#graph summary")
    graph = page.locator("#graph svg.graph")
    for step in ("check", "crm_lookup", "price", "ship"):
        assert "completed" in (graph.locator(f"[data-step='{step}']").get_attribute("class") or "")
    shot(page, "graph-run-completed")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{app.base}/flows/{flow_id}")
    shot(page, "graph-flow-390")
    made.api.close()


def test_the_keys_page_makes_a_labelled_key_shown_once_and_revokes_it(
    app: Server, page: Any
) -> None:
    """Keys by label, mode, prefix and last use; a new key in the session's mode, shown once,
    named by its label in "approved by"; revoking it refuses it at once."""
    sign_in(page, app)
    page.click("nav a[href='/settings/keys']")
    page.wait_for_url(re.compile(r"/settings/keys$"))
    listed = page.inner_text("#keys")
    assert "sandbox" in listed and "live" not in listed and "this session" in listed
    assert "None" not in listed.split() and app.value("sandbox key") not in page.content()
    page.fill("#label", "Release bot")
    page.click("#create-key button[type=submit]")
    page.wait_for_selector("#created-key")
    key = page.inner_text("#new-key")
    assert key.startswith("sk_test_") and '"Release bot"' in page.inner_text("#created-key")
    row = page.locator("tr:has-text('Release bot')")
    assert "sandbox" in row.inner_text() and key[:12] in row.inner_text()
    assert "never" in row.inner_text()
    shot(page, "keys")
    page.goto(f"{app.base}/settings/keys")
    assert key not in page.content()  # shown once

    bot = httpx.Client(base_url=app.base, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    made = Flows(app)
    run_id = made.start(made.flow({"name": "Refund", "steps": [
        {"id": "manager", "type": "approval", "message": "Refund?"}]}))  # fmt: skip
    until(lambda: made.api.get(f"/api/v1/flows/runs/{run_id}").json()["waiting_for"])
    r = bot.post(f"/api/v1/flows/runs/{run_id}/steps/manager/approve")
    assert r.status_code == 200, r.text
    assert r.json()["decided_by"].startswith('key "Release bot" (key_')
    until(lambda: made.api.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "completed")
    page.goto(f"{app.base}/runs/{run_id}")
    assert 'key "Release bot"' in page.inner_text("main")

    page.goto(f"{app.base}/settings/keys")
    page.fill("#label", "x" * 100 + "\t")  # trimmed: 100 characters pass
    page.click("#create-key button[type=submit]")
    page.wait_for_selector("#created-key")
    page.goto(f"{app.base}/settings/keys")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "keys-390")
    page.click("tr:has-text('Release bot') button:text('Revoke')")
    page.wait_for_url(re.compile(r"revoked=key_"))
    assert "Revoked" in page.inner_text("tr:has-text('Release bot')")
    assert bot.get("/api/v1/flows").status_code == 401
    assert "live" not in page.inner_text("#keys")  # a sandbox session sees no live key
    bot.close()
    made.api.close()


def test_the_start_form_is_built_from_the_input_schema(app: Server, page: Any) -> None:
    """A flow with an ``input_schema`` gets a form: an input per field with its title,
    description and whether it is required; a refused payload shows each problem beside its
    field and starts nothing; a good one starts the run with typed values."""
    made = Flows(app)
    flow_id = made.flow({
        "name": "Refund order",
        "input_schema": {
            "type": "object",
            "required": ["order_id", "amount"],
            "properties": {
                "order_id": {"type": "string", "title": "Order", "pattern": "^ord_[0-9]+$",
                             "description": "As on the invoice: ord_ and digits."},
                "amount": {"type": "number", "exclusiveMinimum": 0},
                "reason": {"enum": ["damaged", "late", "other"]},
                "rush": {"type": "boolean", "title": "Rush it"},
                "lines": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload }}"}}],
    })  # fmt: skip
    sign_in(page, app)
    page.goto(f"{app.base}/flows/{flow_id}")
    form = page.locator("#start-form")
    assert "Order *" in form.inner_text() and "As on the invoice" in form.inner_text()
    assert "amount *" in form.inner_text() and "reason (optional)" in form.inner_text()
    page.fill("[data-field=order_id] input", "123")
    page.fill("[data-field=amount] input", "-5")
    page.fill("[data-field=lines] textarea", "[1, 2")
    shot(page, "start-form")
    page.click("#start-form button[type=submit]")
    page.wait_for_selector("[data-field=lines] .problem")
    assert "not valid JSON" in page.inner_text("[data-field=lines] .problem")
    page.fill("[data-field=lines] textarea", '[1, "two"]')
    page.click("#start-form button[type=submit]")
    page.wait_for_selector("[data-field=order_id] .problem")
    assert "^ord_[0-9]+$" in page.inner_text("[data-field=order_id] .problem")
    assert "minimum" in page.inner_text("[data-field=amount] .problem")
    assert "integer" in page.inner_text("[data-field=lines] .problem")
    assert page.input_value("[data-field=order_id] input") == "123"  # what was typed stays
    shot(page, "start-form-problems")
    assert made.api.get("/api/v1/flows/runs").json()["data"] == []  # nothing started

    page.fill("[data-field=order_id] input", "ord_77")
    page.fill("[data-field=amount] input", "12.50")
    page.select_option("[data-field=reason] select", "late")
    page.check("[data-field=rush] input")
    page.fill("[data-field=lines] textarea", "[1, 2]")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "start-form-390")
    page.click("#start-form button[type=submit]")
    page.wait_for_url(re.compile(r"/runs/run_"))
    run_id = page.url.rsplit("/", 1)[1]
    run = made.api.get(f"/api/v1/flows/runs/{run_id}").json()
    assert run["payload"] == {"order_id": "ord_77", "amount": 12.5, "reason": "late",
                              "rush": True, "lines": [1, 2]}  # fmt: skip
    made.api.close()


def test_a_flow_is_written_fixed_and_versioned_from_the_screen(app: Server, page: Any) -> None:
    """New flow in YAML: every problem listed at once and placed beside its line, the text
    kept; fixed, it is created. A new version from the prefilled editor, the same text saved
    again makes no version, and the diff shows what changed. The flow's page lists its
    recent runs with its success rate."""
    made = Flows(app)
    sign_in(page, app)
    page.goto(f"{app.base}/flows")
    page.click("#new-flow")
    page.wait_for_url(re.compile(r"/flows/new$"))
    page.goto(f"{app.base}/flows/new?format=yaml")
    assert page.input_value("#format") == "yaml"
    broken = (
        "name: Invoice run\n"
        "steps:\n"
        "  - id: fetch\n"
        "    type: http\n"
        "    request:\n"
        "      method: GET\n"
        "      url: https://billing.example.com/invoices\n"
        "      headers: {Bad Header: '1'}\n"
        "  - id: fetch\n"
        "    type: transform\n"
        "    output: {total: '{{ steps.nope.output }}'}\n"
    )
    page.fill("#text", broken)
    page.click("#flow-editor button[type=submit]")
    page.wait_for_selector("#problems")
    listed = page.inner_text("#problems .problem-list")
    assert listed.index("line 8") < listed.index("line 9") < listed.index("line 11")
    assert "line 8 steps[0].request.headers" in listed and "Bad Header" in listed, listed
    assert "line 9 steps[1].id" in listed and "already used" in listed, listed
    assert "line 11 steps[1].output" in listed and "no step 'nope'" in listed, listed
    assert page.locator("ol.code-lines li.beside").count() == 3  # each beside its line
    assert "Bad Header" in page.inner_text("#line-8 + li.beside")
    assert page.input_value("#text") == broken  # kept as typed
    shot(page, "editor-problems")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "editor-problems-390")
    page.set_viewport_size({"width": 1280, "height": 900})

    fixed = broken.replace("      headers: {Bad Header: '1'}\n", "").replace(
        "  - id: fetch\n    type: transform\n    output: {total: '{{ steps.nope.output }}'}\n",
        "  - id: total\n    type: transform\n    output: {total: '{{ steps.fetch.output }}'}\n",
    )
    page.fill("#text", fixed)
    page.click("#flow-editor button[type=submit]")
    page.wait_for_url(re.compile(r"/flows/wf_\w+\?saved=1$"))
    flow_id = page.url.split("/flows/")[1].split("?")[0]
    assert "Saved as version 1" in page.inner_text("main")
    saved = made.api.get(f"/api/v1/flows/{flow_id}").json()["definition"]
    assert [s["id"] for s in saved["steps"]] == ["fetch", "total"]

    page.click("#edit-flow")
    page.wait_for_url(re.compile(r"/edit$"))
    text = page.input_value("#text")
    assert '"name": "Invoice run"' in text  # the current version, as JSON
    page.click("#flow-editor button[type=submit]")
    page.wait_for_url(re.compile(r"unchanged=1$"))
    assert "Nothing changed" in page.inner_text("main")
    page.goto(f"{app.base}/flows/{flow_id}/edit")
    page.fill("#text", text.replace("Invoice run", "Invoice run (EU)"))
    page.click("#flow-editor button[type=submit]")
    page.wait_for_url(re.compile(r"saved=2$"))
    assert page.inner_text("h1").startswith("Invoice run (EU)")

    page.goto(f"{app.base}/flows/{flow_id}/edit")  # opened at v2; someone saves v3 meanwhile
    current = made.api.get(f"/api/v1/flows/{flow_id}").json()["definition"]
    r = made.api.put(f"/api/v1/flows/{flow_id}", json={**current, "description": "by the API"})
    assert r.status_code == 200 and r.json()["version"] == 3, r.text
    page.click("#flow-editor button[type=submit]")
    page.wait_for_selector("#problems")
    assert "at version 3 now, not 2" in page.inner_text("#problems")
    assert made.api.get(f"/api/v1/flows/{flow_id}").json()["version"] == 3  # nothing saved
    page.goto(f"{app.base}/flows/{flow_id}")
    assert page.get_attribute("#compare", "href") == f"/flows/{flow_id}/diff"
    page.goto(f"{app.base}/flows/{flow_id}/diff?from=1&to=2")
    page.wait_for_selector("table.diff")
    assert page.locator("table.diff tr.del").inner_text().strip().endswith('"name": "Invoice run",')
    assert "Invoice run (EU)" in page.locator("table.diff tr.add").inner_text()
    shot(page, "flow-diff")
    page.set_viewport_size({"width": 390, "height": 844})
    shot(page, "flow-diff-390")
    page.set_viewport_size({"width": 1280, "height": 900})

    plain = made.flow({"name": "Tally", "steps": [
        {"id": "c", "type": "condition", "if": "{{ payload.ok }}", "else": "fail"}]})  # fmt: skip
    runs = [made.start(plain, {"ok": ok}) for ok in (True, True, True, False)]
    until(lambda: all(made.api.get(f"/api/v1/flows/runs/{r}").json()["status"]
                      in ("completed", "failed") for r in runs))  # fmt: skip
    page.goto(f"{app.base}/flows/{plain}")
    health = page.inner_text("#recent-runs .health")
    assert health.startswith("75% completed of the last 4 finished runs"), health
    assert "1 failed" in health
    assert page.locator("#recent-runs table.runs tbody tr").count() == 4
    assert "wf_" not in page.inner_text("#recent-runs table.runs")
    shot(page, "flow-recent-runs")
    made.api.close()


PHONE_PAGES = (
    "/overview", "/runs", "/runs/{run}", "/flows", "/flows/{flow}", "/flows/{flow}/edit",
    "/deliveries?status=all",
    "/flows/{flow}/diff", "/settings/webhooks", "/settings/webhooks/{endpoint}", "/deliveries",
    "/deliveries/{delivery}", "/settings/triggers", "/settings/secrets", "/settings/keys",
    "/workers",
)  # fmt: skip


def test_every_page_fits_a_phone(app: Server, page: Any) -> None:
    """At 390 px no page is wider than the screen: tables become cards or keep the columns
    that fit, and wide content (code, a graph, a diff) scrolls inside its own box."""
    made = Flows(app)
    flow = made.flow({"name": "Nightly invoice export for the accounting team", "steps": [
        {"id": "export_every_open_invoice", "type": "transform", "output": {"n": 1}}]})  # fmt: skip
    r = made.api.put(f"/api/v1/flows/{flow}", json={"name": "Nightly invoice export", "steps": [
        {"id": "export_every_open_invoice", "type": "transform", "output": {"n": 2}}]})  # fmt: skip
    assert r.status_code == 200, r.text
    r = made.api.post("/api/v1/webhooks/endpoints", json={
        "url": "https://accounting.example.com/webhooks/flowhook/invoices/exported",
        "events": ["flow.completed"], "description": "Accounting"})  # fmt: skip
    assert r.status_code == 201, r.text
    endpoint = r.json()["id"]
    run = made.start(flow)
    until(lambda: made.api.get("/api/v1/webhooks/deliveries").json()["data"])
    delivery = made.api.get("/api/v1/webhooks/deliveries").json()["data"][0]["id"]
    assert made.api.post("/api/v1/hooks", json={"flow_id": flow}).status_code == 201
    assert made.api.post("/api/v1/schedules", json={"flow_id": flow, "cron": "0 3 * * *"}
                         ).status_code == 201  # fmt: skip
    sign_in(page, app)
    page.set_viewport_size({"width": 390, "height": 844})
    too_wide = {}
    for path in PHONE_PAGES:
        url = path.format(run=run, flow=flow, endpoint=endpoint, delivery=delivery)
        page.goto(app.base + url)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 390:
            too_wide[url] = width
            shot(page, "phone-too-wide-" + url.strip("/").replace("/", "-")[:60])
    assert not too_wide, too_wide
    page.goto(f"{app.base}/deliveries?status=all")
    shot(page, "deliveries-390")
    made.api.close()
