"""`kill -9` of the serving process in the middle of a webhook attempt loses no delivery: after
a restart the same event (same id, same bytes) is delivered once the attempt's lease ends,
and the attempt the kill cut short shows as interrupted in the attempt log."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.support import serve, wait_for

pytestmark = pytest.mark.e2e


class Hook(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.seen.append({"headers": dict(self.headers), "body": body})
        if len(Hook.seen) == 1:
            time.sleep(8)  # the first attempt hangs; the sender dies meanwhile
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_kill_9_mid_attempt_then_restart_delivers(tmp_path: Path, database_url: str) -> None:
    Hook.seen = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    env = {
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_WEBHOOK_TIMEOUT": "2",
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    try:
        with serve(tmp_path, database_url, split=True, **env) as server:
            auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
            flow_id = server.value("example flow")
            with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
                r = client.post(
                    "/api/v1/webhooks/endpoints", json={"url": url, "events": ["flow.completed"]}
                )
                assert r.status_code == 201, r.text
                run_id = client.post(
                    "/api/v1/flows/execute",
                    json={"flow_id": flow_id, "payload": {"order_id": "o1", "amount": 5}},
                ).json()["run_id"]
                wait_for(lambda: Hook.seen)
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait()
        with (
            serve(tmp_path, database_url, split=True, **env) as again,
            httpx.Client(base_url=again.base, headers=auth, timeout=10) as client,
        ):
            wait_for(lambda: len(Hook.seen) >= 2)

            def succeeded() -> list[dict[str, Any]]:
                data = client.get("/api/v1/webhooks/deliveries", params={"run_id": run_id}).json()[
                    "data"
                ]
                return [d for d in data if d["status"] == "succeeded"]

            [delivery] = wait_for(succeeded)
            detail = client.get(f"/api/v1/webhooks/deliveries/{delivery['id']}").json()
    finally:
        receiver.shutdown()
        receiver.server_close()
    first, second = Hook.seen[:2]
    assert first["headers"]["X-Service-Event-Id"] == second["headers"]["X-Service-Event-Id"]
    assert first["body"] == second["body"]
    assert json.loads(second["body"])["run_id"] == run_id
    assert (first["headers"]["X-Service-Attempt"], second["headers"]["X-Service-Attempt"]) == (
        "1",
        "2",
    )
    assert delivery["attempts"] == 2
    first_line, second_line = detail["attempt_log"]
    assert (first_line["error_class"], first_line["finished_at"]) == ("interrupted", None)
    assert (second_line["status_code"], second_line["error_class"]) == (200, None)
