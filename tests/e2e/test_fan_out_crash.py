"""`kill -9` of the serving process while a run maps an ``http`` step over 200 items (20 at
a time) and while another waits in a ``parallel`` step with a ``delay`` branch and a sub-flow
branch (both seen waiting before the kill, the child run in its own delay): after a restart
both complete, every item's request arrived once (but for at most the 20 in flight at the
kill, which may arrive twice), and the one child's request once."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serve, wait_for

pytestmark = pytest.mark.e2e
ITEMS = 200
CONCURRENCY = 20


KEYS: dict[str, set[str]] = {}
"""The Idempotency-Keys the counter saw, by the body's ``i``."""


@pytest.fixture
def counter() -> Iterator[tuple[str, Counter[str]]]:
    """A receiver that counts the requests by their body's ``i`` (a little slow, so requests
    are in flight when the process is killed) and keeps their Idempotency-Keys in KEYS."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    KEYS.clear()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(0.02)
            with lock:
                seen[str(body["i"])] += 1
                KEYS.setdefault(str(body["i"]), set()).add(self.headers["Idempotency-Key"])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/count", seen
    server.shutdown()
    server.server_close()


def test_kill_9_during_a_map_and_a_parallel_then_restart(
    tmp_path: Path, database_url: str, counter: tuple[str, Counter[str]]
) -> None:
    url, seen = counter
    env = {
        "FLOWHOOK_LEASE_SECONDS": "1.5",
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    post = {"method": "POST", "url": url}
    mapped = {
        "name": "charge lines",
        "steps": [
            {"id": "each", "type": "map", "items": "{{ range(200) | list }}",
             "concurrency": CONCURRENCY,
             "steps": [{"id": "charge", "type": "http",
                        "request": {**post, "json": {"i": "{{ item }}"}}}]},
        ],
    }  # fmt: skip
    child = {
        "name": "child",
        "steps": [
            {"id": "later", "type": "delay", "seconds": 3},
            {"id": "ship", "type": "http", "request": {**post, "json": {"i": "child"}}},
        ],
    }
    with serve(tmp_path, database_url, split=True, **env) as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
            child_id = client.post("/api/v1/flows", json=child).json()["flow_id"]
            both = {
                "name": "both",
                "steps": [
                    {"id": "side", "type": "parallel", "branches": {
                        "slow": [{"id": "pause", "type": "delay", "seconds": 3}],
                        "sub": [{"id": "call", "type": "flow", "flow_id": child_id}]}},
                    {"id": "after", "type": "http", "request": {**post, "json": {"i": "after"}}},
                ],
            }  # fmt: skip
            map_flow = client.post("/api/v1/flows", json=mapped).json()["flow_id"]
            both_flow = client.post("/api/v1/flows", json=both).json()["flow_id"]
            both_run = client.post("/api/v1/flows/execute", json={"flow_id": both_flow}).json()

            def in_flight() -> str | None:
                """The child run's id once it waits in its delay and the other branch in
                its own."""
                run = client.get(f"/api/v1/flows/runs/{both_run['run_id']}").json()
                steps = {s["id"]: s for s in run["steps"]}
                if any(steps.get(k, {}).get("status") != "waiting" for k in ("pause", "call")):
                    return None
                found = client.get(f"/api/v1/flows/runs/{steps['call']['output']['run_id']}")
                later = [s for s in found.json()["steps"] if s["id"] == "later"]
                return found.json()["run_id"] if later and later[0]["status"] == "waiting" else None

            child_run = wait_for(in_flight, timeout=10)
            map_run = client.post("/api/v1/flows/execute", json={"flow_id": map_flow}).json()
            wait_for(lambda: sum(v for k, v in seen.copy().items() if k.isdigit()) >= 60)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
    before = sum(v for k, v in seen.copy().items() if k.isdigit())
    assert before < ITEMS  # the kill came in the middle of the map
    assert "child" not in seen and "after" not in seen  # the parallel was still in its delays

    with (
        serve(tmp_path, database_url, split=True, **env) as again,
        httpx.Client(base_url=again.base, headers=auth, timeout=10) as client,
    ):

        def finished(run_id: str) -> dict[str, Any] | None:
            run: dict[str, Any] = client.get(f"/api/v1/flows/runs/{run_id}").json()
            return run if run["status"] in ("completed", "failed", "cancelled") else None

        done_map = wait_for(lambda: finished(map_run["run_id"]), timeout=60)
        done_both = wait_for(lambda: finished(both_run["run_id"]), timeout=60)
        children = client.get("/api/v1/flows/runs", params={"flow_id": child_id}).json()["data"]
    assert done_map["status"] == "completed", done_map["error"]
    assert done_both["status"] == "completed", done_both["error"]
    items = {str(i): seen[str(i)] for i in range(ITEMS)}
    assert all(n >= 1 for n in items.values()), [k for k, n in items.items() if n == 0]
    twice = [k for k, n in items.items() if n > 1]
    assert len(twice) <= CONCURRENCY, twice  # only requests in flight at the kill repeat
    assert all(n <= 2 for n in items.values())
    # each item kept its own key through the kill: a receiver deduplicating on it charges
    # each line once, and every line
    assert all(len(KEYS[k]) == 1 for k in items), {k: KEYS[k] for k in twice}
    assert len({next(iter(KEYS[k])) for k in items}) == ITEMS
    assert (seen["child"], seen["after"]) == (1, 1)
    # the child that was in flight at the kill is the one that completed: no second child
    assert [(c["run_id"], c["status"]) for c in children] == [(child_run, "completed")]
    charged = [s for s in done_map["steps"] if s.get("parent") == "each"]
    assert sorted(s["index"] for s in charged) == list(range(ITEMS))
    assert all(s["status"] == "completed" for s in charged)
