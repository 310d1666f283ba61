"""The Workers page and a run's task step in a real browser (Playwright driving Debian's
Chromium) against a real `flowhook serve`, at desktop and phone width: what waits with no
worker, a worker holding a task, the queues drawn, and the run page naming the worker.
Screenshots: test-artifacts/screenshots/workers-*.png."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import SHOTS
from tests.support import serve, wait_for

pytestmark = pytest.mark.e2e


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(SHOTS / f"{name}-390.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


def test_the_workers_page_and_a_run_s_task_step(tmp_path: Path, page: Any) -> None:
    with serve(tmp_path, f"sqlite:///{tmp_path / 'w.db'}", FLOWHOOK_LOG_LEVEL="warning") as server:
        base, key = server.base, server.value("sandbox key")
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=auth, timeout=30) as api:
            flow = {"name": "Charge order", "steps": [
                {"id": "charge", "type": "task", "task": "payments.charge", "input": "{{ payload }}"},
                {"id": "label", "type": "task", "task": "labels.print", "input": {}},
            ]}  # fmt: skip
            flow_id = api.post("/api/v1/flows", json=flow).json()["flow_id"]
            runs = [
                api.post(
                    "/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {"n": n}}
                ).json()["run_id"]
                for n in range(3)
            ]

            page.goto(base + "/signin")
            page.fill("#api_key", key)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r"/overview$"))

            # Nothing works yet: the run says so, and the page says how to start a worker.
            def waiting() -> Any:
                why = api.get(f"/api/v1/flows/runs/{runs[0]}").json()["waiting_for"]
                return why if why and why["reason"] == "task" else None

            assert wait_for(waiting)["no_worker"] is True
            page.goto(base + f"/runs/{runs[0]}")
            text = page.inner_text("li.step[data-step=charge]")
            assert "Waiting for the task payments.charge" in text
            assert "no worker running it was seen in the last minute" in text
            assert "flowhook tasks serve" in text
            page.goto(base + "/workers")
            assert page.get_attribute("nav a[aria-current=page]", "href") == "/workers"
            assert "No worker seen in the last minute" in page.inner_text("#workers")
            row = page.locator("#queues tbody tr").first.inner_text()
            assert "payments.charge" in row and "3" in row
            shot(page, "workers-01-waiting")

            # A worker takes one task and holds it.
            r = api.post("/api/v1/tasks/claim", json={
                "worker_id": "billing-7f9c", "tasks": ["payments.charge"], "wait_seconds": 5,
            })  # fmt: skip
            [task] = r.json()["tasks"]
            page.goto(base + "/workers")
            worker = page.inner_text("#workers tbody tr")
            assert "billing-7f9c" in worker and "payments.charge" in worker
            assert "1 task" in worker and "ago" in worker
            queue = page.locator("#queues tbody tr").first.inner_text().split("\t")
            assert queue[:3] == ["payments.charge", "2", "1"], queue
            assert page.locator("#queues svg.queue rect.running").count() == 1
            shot(page, "workers-02-held")
            page.goto(base + f"/runs/{task['run_id']}")
            text = page.inner_text("li.step[data-step=charge]")
            assert "worker billing-7f9c is running attempt 1" in text, text

            # It completes: the run's page names the worker on the step.
            done = api.post(f"/api/v1/tasks/{task['task_id']}/complete",
                            json={"attempt": 1, "output": {"charge_id": "ch_1"}})  # fmt: skip
            assert done.status_code == 200, done.text

            def charged() -> bool:
                run = api.get(f"/api/v1/flows/runs/{task['run_id']}").json()
                return any(s["id"] == "charge" and s["status"] == "completed" for s in run["steps"])

            wait_for(charged)
            page.goto(base + f"/runs/{task['run_id']}")
            text = page.inner_text("li.step[data-step=charge]")
            assert "by worker billing-7f9c" in text and "attempt 1" in text, text
            assert "Waiting for the task labels.print" in page.inner_text(
                "li.step[data-step=label]"
            )
            body = page.inner_text("main")
            assert "None" not in body
            shot(page, "workers-03-run")
