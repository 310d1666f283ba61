"""Pause and resume across processes on PostgreSQL: `flowhook api` takes the pause and the
resume, a separate `flowhook worker` (engine and dispatcher) honours them.

- A paused flow's runs are accepted by the API process and held by the worker process
  (``waiting_for.reason`` ``paused``); resume lets them go.
- A paused endpoint's deliveries, queued by the worker's engine, wait there with no attempt
  used; resume sends them, and another endpoint's went on meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.e2e.test_scale_out import api_key
from tests.support import serve, wait_for, worker

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
FLOW = {"name": "quick", "steps": [{"id": "a", "type": "transform", "output": {"ok": True}}]}


class Hook(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str]]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with Hook.lock:
            Hook.seen.append((self.path, body["run_id"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_pause_taken_by_the_api_process_holds_in_the_worker_process(
    tmp_path: Path, pg_url: str
) -> None:
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    Hook.seen = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{receiver.server_address[1]}"
    env = {"FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true", "FLOWHOOK_LOG_LEVEL": "warning"}
    key = api_key(pg_url)
    try:
        with (
            contextlib.ExitStack() as stack,
            serve(tmp_path, pg_url, "api", **env) as api,
            worker(tmp_path, pg_url, **env),
        ):
            c = stack.enter_context(
                httpx.Client(
                    base_url=api.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
                )
            )
            endpoints = {}
            for path in ("/held", "/open"):
                r = c.post(
                    "/api/v1/webhooks/endpoints",
                    json={"url": hook + path, "events": ["flow.completed"]},
                )
                assert r.status_code == 201, r.text
                endpoints[path] = r.json()["id"]
            r = c.post(f"/api/v1/webhooks/endpoints/{endpoints['/held']}/pause")
            assert r.status_code == 200 and r.json()["paused"] is True, r.text
            flow_id = c.post("/api/v1/flows", json=FLOW).json()["flow_id"]
            r = c.post(f"/api/v1/flows/{flow_id}/pause")
            assert r.status_code == 200 and r.json()["paused"] is True, r.text

            def run(n: int) -> str:
                r = c.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {"n": n}})
                assert r.status_code == 202, r.text
                return str(r.json()["run_id"])

            def record(run_id: str) -> dict[str, Any]:
                return dict(c.get(f"/api/v1/flows/runs/{run_id}").json())

            runs = [run(n) for n in range(3)]
            for run_id in runs:  # the worker process reads the pause and holds the run
                wait_for(
                    lambda r=run_id: (record(r)["waiting_for"] or {}).get("reason") == "paused"
                )
                assert record(run_id)["status"] == "queued"

            r = c.post(f"/api/v1/flows/{flow_id}/resume")
            assert r.status_code == 200 and r.json()["paused"] is False, r.text
            for run_id in runs:
                wait_for(lambda r=run_id: record(r)["status"] == "completed")
            # the open endpoint hears of every run; the paused one holds its deliveries
            wait_for(lambda: sorted(r for p, r in Hook.seen if p == "/open") == sorted(runs))

            def held() -> list[dict[str, Any]]:
                q = {"endpoint_id": endpoints["/held"]}
                data = c.get("/api/v1/webhooks/deliveries", params=q).json()["data"]
                return [d for d in data if d["waiting_for"]]

            wait_for(lambda: len(held()) == 3)
            assert all(d["attempts"] == 0 and d["status"] == "pending" for d in held())
            assert [p for p, _ in Hook.seen].count("/held") == 0

            r = c.post(f"/api/v1/webhooks/endpoints/{endpoints['/held']}/resume")
            assert r.status_code == 200 and r.json()["paused"] is False, r.text
            wait_for(lambda: sorted(r for p, r in Hook.seen if p == "/held") == sorted(runs))
            data = c.get(
                "/api/v1/webhooks/deliveries", params={"endpoint_id": endpoints["/held"]}
            ).json()["data"]
            assert [(d["status"], d["attempts"]) for d in data] == [("succeeded", 1)] * 3
    finally:
        receiver.shutdown()
        receiver.server_close()
