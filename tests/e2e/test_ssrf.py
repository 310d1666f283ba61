"""Audit finding 1 over real HTTP: a `flowhook serve` with the default policy (no private
targets) never lets an endpoint or an ``http`` step reach an internal service, however its
address is spelled, and a malformed request fails its step instead of sticking its run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.support import Server, serve

pytestmark = pytest.mark.e2e

SPELLINGS = [
    "127。0。0。1",
    "１２７.0.0.1",
    "①②⑦.0.0.1",
    "[::7f00:1]",
    "[::ffff:127.0.0.1]",
    "2130706433",
    "127.1",
]


class Internal(BaseHTTPRequestHandler):
    """An internal service with something to hide; records every request that reached it."""

    seen: list[tuple[str, str | None]] = []  # noqa: RUF012 - shared by the handler's instances

    def answer(self) -> None:
        Internal.seen.append((self.command, self.headers.get("X-A")))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"internal secret")

    do_GET = do_POST = answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def internal() -> Iterator[str]:
    Internal.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Internal)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def wait_run(client: httpx.Client, run_id: str) -> dict[str, Any]:
    for _ in range(400):
        body: dict[str, Any] = client.get(f"/api/v1/flows/runs/{run_id}").json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def client_for(server: Server) -> httpx.Client:
    key = server.value("sandbox key")
    return httpx.Client(
        base_url=server.base, timeout=10, headers={"Authorization": f"Bearer {key}"}
    )


def test_internal_services_are_unreachable_however_spelled(
    tmp_path: Any, database_url: str, internal: str
) -> None:
    port = internal.rsplit(":", 1)[1]
    with serve(tmp_path, database_url) as server, client_for(server) as client:
        for host in SPELLINGS:
            url = f"http://{host}:{port}/internal"
            r = client.post(
                "/api/v1/webhooks/endpoints", json={"url": url, "events": ["flow.completed"]}
            )
            assert r.status_code == 400, (host, r.text)
            assert r.json()["code"] == "invalid_request"
            step = {"id": "get", "type": "http", "request": {"url": url}}
            r = client.post("/api/v1/flows", json={"name": "literal", "steps": [step]})
            assert r.status_code == 400, (host, r.text)
            assert "steps[0].request.url" in r.json()["error"]

        r = client.post(
            "/api/v1/webhooks/endpoints",
            json={"url": f"http://127.0.0.1:{port}/x\r\nX: y", "events": ["flow.completed"]},
        )
        assert r.status_code == 400 and "control character" in r.json()["error"]

        templated = {
            "name": "fetch",
            "steps": [{"id": "get", "type": "http", "request": {"url": "{{ payload.url }}"}}],
        }
        r = client.post("/api/v1/flows", json=templated)
        assert r.status_code == 201, r.text
        flow_id = r.json()["flow_id"]
        for host in SPELLINGS:
            r = client.post(
                "/api/v1/flows/execute",
                json={"flow_id": flow_id, "payload": {"url": f"http://{host}:{port}/internal"}},
            )
            assert r.status_code == 202, r.text
            run = wait_run(client, r.json()["run_id"])
            assert run["status"] == "failed", (host, run)
            assert run["error"]["type"] == "destination_blocked", (host, run["error"])
            assert run["steps"][0].get("output") is None
    assert Internal.seen == []


def test_malformed_requests_fail_their_step_not_the_worker(
    tmp_path: Any, database_url: str, internal: str
) -> None:
    with serve(
        tmp_path, database_url, FLOWHOOK_ALLOW_PRIVATE_TARGETS="true"
    ) as server, client_for(server) as client:  # fmt: skip
        bad_method = {
            "id": "get",
            "type": "http",
            "request": {"method": "GE T", "url": internal},
        }
        r = client.post("/api/v1/flows", json={"name": "m", "steps": [bad_method]})
        assert r.status_code == 400
        assert "steps[0].request.method" in r.json()["error"], r.text
        bad_header = {
            "id": "get",
            "type": "http",
            "request": {"url": internal, "headers": {"X-A": "a\r\nX-Injected: 1"}},
        }
        r = client.post("/api/v1/flows", json={"name": "h", "steps": [bad_header]})
        assert r.status_code == 400
        assert "steps[0].request.headers" in r.json()["error"], r.text

        templated = {
            "name": "templated",
            "steps": [
                {
                    "id": "get",
                    "type": "http",
                    "request": {
                        "method": "{{ payload.method }}",
                        "url": internal,
                        "headers": {"X-A": "{{ payload.header }}"},
                    },
                }
            ],
        }
        r = client.post("/api/v1/flows", json=templated)
        assert r.status_code == 201, r.text
        flow_id = r.json()["flow_id"]
        cases = [
            ({"method": "GE T", "header": "ok"}, "not an HTTP method"),
            ({"method": "GET", "header": "a\r\nX-Injected: 1"}, "line break"),
        ]
        for payload, message in cases:
            r = client.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": payload})
            run = wait_run(client, r.json()["run_id"])
            assert run["status"] == "failed", run
            assert run["error"]["type"] == "invalid_request"
            assert message in run["error"]["message"]
        r = client.post(
            "/api/v1/flows/execute",
            json={"flow_id": flow_id, "payload": {"method": "post", "header": "fine"}},
        )
        assert wait_run(client, r.json()["run_id"])["status"] == "completed"
    assert Internal.seen == [("POST", "fine")]
