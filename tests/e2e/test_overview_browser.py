"""The overview page in a real browser (Playwright driving Debian's Chromium) against a real
`flowhook serve`: signing in lands on it, and its charts show the runs, durations and
deliveries made, at desktop and phone width. Screenshots: test-artifacts/screenshots/."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowhook.ids import pack_id
from flowhook.store.types import to_micros
from tests.browser import shot
from tests.support import Server, free_port, serve

pytestmark = pytest.mark.e2e


class Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/orders-hook"
    server.shutdown()
    server.server_close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    env = {
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_WEBHOOK_RETRY_SCHEDULE": "0.1,0.1",
        "FLOWHOOK_LOG_LEVEL": "warning",
        "FLOWHOOK_DISK_BUDGET_MB": "500",
    }
    path = tmp_path / "overview.db"
    with serve(tmp_path, f"sqlite:///{path}", **env) as server:
        yield server, path


def _flow(api: httpx.Client, name: str, steps: list[dict[str, Any]]) -> str:
    r = api.post("/api/v1/flows", json={"name": name, "steps": steps})
    assert r.status_code == 201, r.text
    return str(r.json()["flow_id"])


def _history(path: Path, flows: list[str], now: datetime) -> tuple[int, int]:
    """Runs of the past day written straight into the server's SQLite file (a day cannot be
    waited for): 2 to 13 an hour from 21 h to 50 min ago (well inside the page's windows,
    even if a minute or an hour turns meanwhile), most completed, some failed or cancelled;
    ``flows[0]`` gets two in three. Returns how many were queued in the last hour and day."""
    rows, hour = [], 0
    for h in range(1, 22):
        for i in range(2 + (h * 7) % 12):
            queued = now - timedelta(hours=h, minutes=(i * 13) % 50 - 10)
            status = ("failed", "cancelled")[i % 2] if i % 5 == 4 else "completed"
            took = 40 + (i * 37) % 400 if status == "completed" else 5
            finished = queued + timedelta(milliseconds=took)
            flow = flows[0] if i % 3 else flows[1]
            rows.append((f"run_seed{h:02d}{i:02d}", flow, status, _stored(queued),
                         _stored(finished), took))  # fmt: skip
            hour += now - queued < timedelta(minutes=57)
    with sqlite3.connect(path, timeout=10) as db:
        db.executemany(
            "INSERT INTO runs (run_id, workspace_id, mode, flow_id, flow_version, trigger,"
            " status, payload, queued_at, available_at, due_at, started_at, finished_at,"
            " duration_ms) SELECT ?, workspace_id, mode, flow_id, 1, 'api', ?, '{}', ?, ?, ?, ?,"
            " ?, ? FROM flows WHERE flow_id = ?",
            [  # ids as the store keeps them (packed)
                (pack_id(r), s, q, q, q, q, f, d, pack_id(flow)) for r, flow, s, q, f, d in rows
            ],
        )
    return hour, len(rows)


def _stored(when: datetime) -> int:
    """``when`` as the store keeps it on SQLite: integer microseconds since the epoch."""
    return to_micros(when)


def _settle(api: httpx.Client, run_ids: list[str]) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while True:
        found = {r: api.get(f"/api/v1/flows/runs/{r}").json()["status"] for r in run_ids}
        if all(s in ("completed", "failed", "cancelled") for s in found.values()):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


@pytest.fixture
def api(app: tuple[Server, Path]) -> Iterator[httpx.Client]:
    """The sandbox key's API client."""
    server, _ = app
    auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
    with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
        yield client


def test_overview_draws_runs_durations_and_deliveries(
    app: tuple[Server, Path], api: httpx.Client, receiver: str, page: Any
) -> None:
    server, path = app
    base, key = server.base, server.value("sandbox key")

    # Signing in lands on the overview, which says what to do while nothing has run.
    page.goto(base + "/signin")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/overview$"))
    assert page.get_attribute("nav a[aria-current=page]", "href") == "/overview"
    assert "No runs in the last hour" in page.inner_text("#runs-hour")
    assert "No run completed in the last 24 hours" in page.inner_text("#durations")
    assert page.locator("svg.bars").count() == 0
    shot(page, "overview-01-empty")

    checkout = _flow(api, "checkout", [
        {"id": "price", "type": "transform", "output": {"total": "{{ payload.n * 2 }}"}},
        {"id": "settle", "type": "delay", "seconds": 0.2},
    ])  # fmt: skip
    refunds = _flow(api, "refunds", [{"id": "a", "type": "transform", "output": {"ok": True}}])
    fraud = _flow(api, "fraud-check", [{"id": "no", "type": "fail", "message": "declined"}])
    hooks = [
        (receiver, "Orders service"),
        (f"http://127.0.0.1:{free_port()}/down", "Old CRM"),  # nothing listens: fails
    ]
    for url, description in hooks:
        r = api.post(
            "/api/v1/webhooks/endpoints",
            json={
                "url": url,
                "events": ["flow.completed", "flow.failed"],
                "description": description,
            },
        )
        assert r.status_code == 201, r.text
    started = [
        api.post("/api/v1/flows/execute", json={"flow_id": f, "payload": {"n": i}}).json()["run_id"]
        for i, f in enumerate([checkout] * 5 + [refunds] * 3 + [fraud] * 2)
    ]
    statuses = _settle(api, started)
    assert sorted(statuses.values()).count("failed") == 2
    now = datetime.now(UTC)
    hour, day = _history(path, [checkout, refunds, fraud], now)
    # every delivery has ended: 10 to the receiver, 10 to the endpoint that is down
    deadline = time.monotonic() + 30
    while api.get("/api/v1/webhooks/deliveries", params={"status": "pending"}).json()["data"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)

    page.goto(base + "/overview")
    # Runs per minute, last hour: this test's 10 runs (and the history's last hour), stacked.
    chart = page.locator("#runs-hour")
    assert chart.get_attribute("data-total") == str(10 + hour)
    bars = chart.locator("svg.bars g.col")
    assert 1 <= bars.count() <= 60
    assert chart.locator("rect.s-completed").count() >= 1
    assert chart.locator("rect.s-failed").count() >= 1
    failed = 2 + _failed_last_hour(path, now)
    assert f"Failed {failed}\n" in chart.locator(".legend").inner_text()
    assert "now" in chart.locator("text.time").all_text_contents()
    assert "runs:" in chart.locator("desc").text_content()
    # Runs per hour, last 24 hours: the history's hours have bars of their own.
    day_chart = page.locator("#runs-day")
    assert day_chart.get_attribute("data-total") == str(10 + day)
    assert day_chart.locator("svg.bars g.col").count() >= 20
    # Durations by flow, busiest first, by name; the failing flow completed nothing.
    assert page.locator("#durations .hbar-name a").all_inner_texts() == ["checkout", "refunds"]
    first = page.locator("#durations .hbar-row").first.inner_text()
    completed = _count(path, "flow_id = ? AND status = 'completed'", pack_id(checkout))
    assert re.search(rf"p50 \d+ ms p95 \d+ ms {completed} completed runs$", " ".join(first.split()))
    widths = [r.get_attribute("width") for r in page.locator("#durations rect.p95").all()]
    assert "100.0%" in widths  # the longest p95 fills its track
    # Webhook success by endpoint.
    hooks_text = page.inner_text("#webhooks")
    assert "Orders service" in hooks_text and "100% delivered" in hooks_text
    assert "Old CRM" in hooks_text and "0.0% delivered" in hooks_text
    assert "(0 of 10, 10 failed)" in hooks_text
    # Queues are empty: every run ended, every delivery too.
    assert page.inner_text("#tile-queued .big") == "0"
    assert page.inner_text("#tile-deliveries .big") == "0"
    assert page.inner_text("#tile-failed .big") == str(failed)
    body = page.inner_text("main")
    # as words: a random id may hold the letters ("wf_01m938qnane6…" once failed this)
    assert not re.search(r"\bNone\b", body) and not re.search(r"\bnan\b", body.lower())
    # The database's size and free pages, and what retention keeps (issue 20).
    storage = " ".join(page.inner_text("#storage").split())
    assert re.match(
        r"Database: [\d.]+ (KB|MB|GB)(, no free pages|, of which [\d.]+ (B|KB|MB|GB) free pages)",
        storage,
    )
    assert "finished runs are kept 30 days, delivered events' bodies 7 days" in storage
    # Its use of the disk budget, in words and as a bar (issue 54).
    budget = " ".join(page.inner_text("#disk-budget").split())
    assert re.fullmatch(r"Disk budget: [\d.]+ (KB|MB) of 500 MB \(\d+%\)", budget), budget
    assert page.locator("#disk-budget svg.disk-bar rect.used").count() == 1
    shot(page, "overview-02-desktop")

    # On a phone: nothing wider than the screen, and the chart text keeps its size.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"page is {width}px wide on a 390px screen"
    label = page.locator("#runs-hour text.time").last.bounding_box()
    assert label is not None and label["height"] >= 12
    assert page.locator("#runs-hour svg.bars").bounding_box()["width"] < 390
    shot(page, "overview-03-phone")
    page.click("#runs-day summary")
    assert page.locator("#runs-day .numbers tbody tr").count() >= 20
    shot(page, "overview-04-phone-numbers")


def _count(path: Path, where: str, *params: object) -> int:
    with sqlite3.connect(path, timeout=10) as db:
        (n,) = db.execute(f"SELECT count(*) FROM runs WHERE {where}", params).fetchone()
    return int(n)


def _failed_last_hour(path: Path, now: datetime) -> int:
    since = _stored(now.replace(second=0, microsecond=0) - timedelta(minutes=59))
    seeded = pack_id("run_seed").hex().upper() + "%"  # the history's runs (ids stored packed)
    return _count(
        path, "hex(run_id) LIKE ? AND status = 'failed' AND queued_at >= ?", seeded, since
    )
