"""Scale out: `flowhook api` beside `flowhook worker` processes on one database.

- 1 api and 3 workers on PostgreSQL, 1,000 runs of a three-step flow with an endpoint on
  flow.completed; one worker is killed with SIGKILL midway: every run completes, no finished
  step ran twice, every flow.completed reaches the receiver, every 202 has its run.
- SIGTERM drains a worker: the run in flight finishes within the grace period and no run is
  left running; past the grace, the run is handed back and another worker finishes it.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.support import serve, wait_for, worker

pytestmark = [pytest.mark.e2e, pytest.mark.soak]
ROOT = Path(__file__).resolve().parents[2]
FLOW = {
    "name": "three",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": "{{ payload.n }}"}},
        {"id": "b", "type": "transform", "output": {"y": "{{ steps.a.output.x * 2 }}"}},
        {"id": "c", "type": "transform", "output": {"z": "{{ steps.b.output.y + 1 }}"}},
    ],
    "output": {"n": "{{ payload.n }}"},
}


class Hook(BaseHTTPRequestHandler):
    runs: ClassVar[set[str]] = set()
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with Hook.lock:
            Hook.runs.add(body["run_id"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_one_api_three_workers_kill_9_loses_nothing(tmp_path: Path, pg_url: str) -> None:
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    Hook.runs = set()
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_LEASE_SECONDS": "3",
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    key = api_key(pg_url)
    try:
        with (
            serve(tmp_path, pg_url, "api", **env) as api,
            worker(tmp_path, pg_url, **env),
            worker(tmp_path, pg_url, **env) as doomed,
            worker(tmp_path, pg_url, **env),
        ):
            c = httpx.Client(
                base_url=api.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            c.post(
                "/api/v1/webhooks/endpoints",
                json={
                    "url": f"http://127.0.0.1:{receiver.server_address[1]}/h",
                    "events": ["flow.completed"],
                },
            ).raise_for_status()
            flow_id = c.post("/api/v1/flows", json=FLOW).json()["flow_id"]
            accepted: list[str] = []
            for n in range(1000):
                r = c.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {"n": n}})
                assert r.status_code == 202, r.text
                accepted.append(r.json()["run_id"])
                if n == 400:
                    doomed.send_signal(signal.SIGKILL)

            def all_done() -> bool:
                for status in ("queued", "running"):
                    if c.get("/api/v1/flows/runs", params={"status": status, "limit": 1}).json()[
                        "data"
                    ]:
                        return False
                return True

            wait_for(all_done, timeout=120)
            completed: set[str] = set()
            cursor = None
            while True:
                page = c.get(
                    "/api/v1/flows/runs",
                    params={
                        "status": "completed",
                        "limit": 100,
                        **({"cursor": cursor} if cursor else {}),
                    },
                ).json()
                completed |= {r["run_id"] for r in page["data"]}
                cursor = page["next_cursor"]
                if not cursor:
                    break
            assert completed == set(accepted)  # every 202 has its run, and it completed
            sample = accepted[::50]
            for run_id in sample:
                run = c.get(f"/api/v1/flows/runs/{run_id}").json()
                assert [s["attempts"] for s in run["steps"]] == [1, 1, 1]
                names = [
                    e["event"] for e in c.get(f"/api/v1/flows/runs/{run_id}/events").json()["data"]
                ]
                assert (
                    names.count("flow.step_completed") == 3 and names.count("flow.completed") == 1
                )
            wait_for(lambda: Hook.runs >= set(accepted), timeout=120)
            c.close()
    finally:
        receiver.shutdown()
        receiver.server_close()


def test_sigterm_drains_a_worker(tmp_path: Path, database_url: str) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        "FLOWHOOK_PLUGINS": "tests.plugins", "PYTHONPATH": str(ROOT), "FLOWHOOK_LOG_LEVEL": "warning",
        "FLOWHOOK_TEST_COUNT_DIR": str(marks), "FLOWHOOK_LEASE_SECONDS": "30",
    }  # fmt: skip
    with serve(tmp_path, database_url, "api", **env) as api:
        c = httpx.Client(
            base_url=api.base,
            headers={"Authorization": f"Bearer {api_key(database_url)}"},
            timeout=30,
        )
        nap = c.post(
            "/api/v1/flows",
            json={
                "name": "nap",
                "steps": [{"id": "n", "type": "python", "function": "nap", "input": 1.5}],
            },
        ).json()["flow_id"]
        with worker(tmp_path, database_url, FLOWHOOK_SHUTDOWN_GRACE="10", **env) as w:
            run_id = c.post("/api/v1/flows/execute", json={"flow_id": nap}).json()["run_id"]
            wait_for(
                lambda: c.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "running", 20
            )
            w.send_signal(signal.SIGTERM)
            assert w.wait(timeout=20) == 0
        assert (
            c.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "completed"
        )  # drained, not dropped
        # Past the grace period the run is handed back, and another worker finishes it at once.
        long = c.post(
            "/api/v1/flows",
            json={
                "name": "long",
                "steps": [{"id": "n", "type": "python", "function": "nap", "input": 3}],
            },
        ).json()["flow_id"]
        with worker(tmp_path, database_url, FLOWHOOK_SHUTDOWN_GRACE="0.2", **env) as w:
            run_id = c.post("/api/v1/flows/execute", json={"flow_id": long}).json()["run_id"]
            wait_for(
                lambda: c.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "running", 20
            )
            w.send_signal(signal.SIGTERM)
            assert w.wait(timeout=20) == 0
        assert c.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "running"
        with worker(tmp_path, database_url, **env):
            started = time.monotonic()
            wait_for(
                lambda: c.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "completed", 20
            )
            assert time.monotonic() - started < 15  # not the 30 s lease
        c.close()


def api_key(database_url: str) -> str:
    import os
    import subprocess
    import sys

    from tests.support import secret_key_env

    flowhook = str(Path(sys.executable).with_name("flowhook"))
    out = subprocess.run(
        [flowhook, "keys", "create", "--mode", "test", "--json", "--database-url", database_url],
        env={**os.environ, **secret_key_env(database_url)},
        capture_output=True,
        text=True,
        check=True,
    )
    return str(json.loads(out.stdout)["key"])


def done(c: httpx.Client, run_id: str) -> dict[str, Any] | None:
    run: dict[str, Any] = c.get(f"/api/v1/flows/runs/{run_id}").json()
    return run if run["status"] == "completed" else None


def test_a_map_is_spread_over_both_workers_and_the_flow_cap_holds(
    tmp_path: Path, pg_url: str
) -> None:
    """Each run's map items run in both worker processes; three runs of a flow capped at one
    run at a time still run one after another while their items spread."""
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    env = {
        "FLOWHOOK_PLUGINS": "tests.plugins",
        "PYTHONPATH": str(ROOT),
        "FLOWHOOK_LOG_LEVEL": "warning",
        # eight slots a worker: one worker alone cannot hold a run's forty items at once
        "FLOWHOOK_WORKER_CONCURRENCY": "8",
    }
    flow = {
        "name": "spread",
        "concurrency": 1,
        "steps": [
            {"id": "each", "type": "map", "items": "{{ range(40) | list }}", "concurrency": 40,
             "steps": [{"id": "who", "type": "python", "function": "whoami", "input": 0.05}]},
        ],
    }  # fmt: skip
    key = api_key(pg_url)
    with (
        serve(tmp_path, pg_url, "api", **env) as api,
        worker(tmp_path, pg_url, **env),
        worker(tmp_path, pg_url, **env),
        httpx.Client(
            base_url=api.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as c,
    ):
        # Both workers start together but one may be claiming seconds before the other on a
        # busy machine: warm up until each has run an item, so the test measures the spread.
        probe = {"name": "probe", "steps": flow["steps"]}
        probe_id = c.post("/api/v1/flows", json=probe).json()["flow_id"]
        seen: set[int] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            run_id = c.post("/api/v1/flows/execute", json={"flow_id": probe_id}).json()["run_id"]
            run = wait_for(lambda r=run_id: done(c, r), timeout=60)
            seen |= {o["pid"] for o in run["steps"][0]["output"]}
        assert len(seen) == 2, f"the second worker never claimed work: {seen}"

        flow_id = c.post("/api/v1/flows", json=flow).json()["flow_id"]
        ids = [
            c.post("/api/v1/flows/execute", json={"flow_id": flow_id}).json()["run_id"]
            for _ in range(3)
        ]

        def finished() -> list[dict[str, Any]] | None:
            runs = [c.get(f"/api/v1/flows/runs/{r}").json() for r in ids]
            return runs if all(r["status"] == "completed" for r in runs) else None

        runs = wait_for(finished, timeout=60)
    for r in runs:  # each run's items ran in both workers (a map is not bound to one)
        pids = [o["pid"] for o in r["steps"][0]["output"]]
        assert len(set(pids)) == 2, (r["run_id"], Counter(pids))
    spans = sorted((r["started_at"], r["finished_at"]) for r in runs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, spans  # the flow's cap: one run at a time
