"""Flow control across processes on PostgreSQL: `flowhook api` beside three `flowhook worker`
processes.

- Per-key concurrency (limit 2 over 10 keys, 300 runs) never has more than two runs of a key
  executing at any moment, across the three workers (each run's step records its wall-clock
  span; the spans of one key never overlap more than twice); and a throttle of 5 starts a
  second holds in total across them.
- An endpoint's `rate_limit` (10 a second) holds in total across the three workers'
  dispatchers: no second of arrivals at the receiver holds more than ten.
- kill -9 of the worker holding a key's slot: the slot comes back when the run's lease ends
  (another worker takes the run and finishes it), and the runs held behind it go on.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import defaultdict
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from tests.e2e.test_scale_out import ROOT, api_key, wait_for
from tests.integration.test_flow_control import peak_overlap
from tests.support import serve, worker

pytestmark = [pytest.mark.e2e, pytest.mark.soak]


def _env(**extra: str) -> dict[str, str]:
    return {
        "FLOWHOOK_PLUGINS": "tests.plugins",
        "PYTHONPATH": str(ROOT),
        "FLOWHOOK_LOG_LEVEL": "warning",
        **extra,
    }


def _span_flow(name: str, nap: float, **control: Any) -> dict[str, Any]:
    return {
        "name": name,
        "steps": [{"id": "s", "type": "python", "function": "span", "input": nap}],
        **control,
    }


def _all_completed(c: httpx.Client, ids: list[str]) -> list[dict[str, Any]] | None:
    runs = [c.get(f"/api/v1/flows/runs/{r}").json() for r in ids]
    if any(r["status"] in ("failed", "cancelled") for r in runs):
        raise AssertionError([r for r in runs if r["status"] in ("failed", "cancelled")])
    return runs if all(r["status"] == "completed" for r in runs) else None


def test_per_key_concurrency_and_a_throttle_hold_across_three_workers(
    tmp_path: Path, pg_url: str
) -> None:
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    env = _env()
    key = api_key(pg_url)
    with (
        serve(tmp_path, pg_url, "api", **env) as api,
        worker(tmp_path, pg_url, **env),
        worker(tmp_path, pg_url, **env),
        worker(tmp_path, pg_url, **env),
        httpx.Client(
            base_url=api.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as c,
    ):
        keyed = c.post("/api/v1/flows", json=_span_flow(
            "per key", 0.02, concurrency={"limit": 2, "key": "{{ payload.k }}"}
        )).json()["flow_id"]  # fmt: skip
        paced = c.post("/api/v1/flows", json=_span_flow(
            "paced", 0.0, throttle={"limit": 5, "period_seconds": 1}
        )).json()["flow_id"]  # fmt: skip
        ids = [
            c.post("/api/v1/flows/execute",
                   json={"flow_id": keyed, "payload": {"k": f"cus_{i % 10}"}}).json()["run_id"]
            for i in range(300)
        ]  # fmt: skip
        paced_ids = [
            c.post("/api/v1/flows/execute", json={"flow_id": paced}).json()["run_id"]
            for _ in range(15)
        ]
        runs = wait_for(lambda: _all_completed(c, ids), timeout=120)
        paced_runs = wait_for(lambda: _all_completed(c, paced_ids), timeout=60)
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run in runs:
        out = run["steps"][0]["output"]
        by_key[out["k"]].append((out["begun"], out["ended"]))
    assert len(by_key) == 10
    assert max(peak_overlap(spans) for spans in by_key.values()) <= 2
    starts = sorted(datetime.fromisoformat(r["started_at"]).timestamp() for r in paced_runs)
    for i in range(5, len(starts)):  # five starts a second at most, whichever worker
        assert starts[i] - starts[i - 5] >= 1.0 - 0.05, starts
    assert starts[-1] - starts[0] >= 2.0 - 0.002


def test_per_key_concurrency_and_a_throttle_hold_between_two_serve_processes_on_sqlite(
    tmp_path: Path,
) -> None:
    """Two `flowhook serve` on one SQLite file, executes sent to both: the limits hold in
    total (SQLite's single writer serialises their admissions)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    env = _env()
    with serve(tmp_path, url, **env) as first:
        key = first.value("sandbox key")
        with (
            serve(tmp_path, url, **env) as second,
            httpx.Client(base_url=first.base, headers={"Authorization": f"Bearer {key}"},
                         timeout=30) as a,
            httpx.Client(base_url=second.base, headers={"Authorization": f"Bearer {key}"},
                         timeout=30) as b,
        ):  # fmt: skip
            keyed = a.post("/api/v1/flows", json=_span_flow(
                "per key", 0.02, concurrency={"limit": 2, "key": "{{ payload.k }}"}
            )).json()["flow_id"]  # fmt: skip
            paced = a.post("/api/v1/flows", json=_span_flow(
                "paced", 0.0, throttle={"limit": 5, "period_seconds": 1}
            )).json()["flow_id"]  # fmt: skip
            ids = [
                (a if i % 2 else b).post("/api/v1/flows/execute", json={
                    "flow_id": keyed, "payload": {"k": f"cus_{i % 5}"}}).json()["run_id"]
                for i in range(100)
            ]  # fmt: skip
            paced_ids = [
                (a if i % 2 else b).post("/api/v1/flows/execute", json={"flow_id": paced})
                .json()["run_id"]
                for i in range(12)
            ]  # fmt: skip
            runs = wait_for(lambda: _all_completed(a, ids), timeout=120)
            paced_runs = wait_for(lambda: _all_completed(a, paced_ids), timeout=60)
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    pids = set()
    for run in runs:
        out = run["steps"][0]["output"]
        by_key[out["k"]].append((out["begun"], out["ended"]))
        pids.add(out.get("pid"))
    assert len(by_key) == 5 and len(pids) == 2  # both processes ran runs
    assert max(peak_overlap(spans) for spans in by_key.values()) <= 2
    starts = sorted(datetime.fromisoformat(r["started_at"]).timestamp() for r in paced_runs)
    for i in range(5, len(starts)):
        assert starts[i] - starts[i - 5] >= 1.0 - 0.05, starts


def test_kill_9_of_a_worker_holding_slots_gives_them_back_when_its_leases_end(
    tmp_path: Path, pg_url: str
) -> None:
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    env = _env(FLOWHOOK_LEASE_SECONDS="1.5")
    key = api_key(pg_url)
    with (
        serve(tmp_path, pg_url, "api", **env) as api,
        httpx.Client(
            base_url=api.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as c,
    ):
        flow_id = c.post("/api/v1/flows", json=_span_flow(
            "one at a time", 2.0, concurrency={"limit": 1, "key": "{{ payload.k }}"}
        )).json()["flow_id"]  # fmt: skip
        with worker(tmp_path, pg_url, **env) as doomed:
            ids = [
                c.post("/api/v1/flows/execute",
                       json={"flow_id": flow_id, "payload": {"k": k}}).json()["run_id"]
                for k in ("a", "a", "b", "b")
            ]  # fmt: skip

            def first_two_running() -> bool | None:
                states = [c.get(f"/api/v1/flows/runs/{r}").json() for r in ids]
                going = [s for s in states if s["status"] == "running"]
                held = [s for s in states if s["status"] == "queued" and s["waiting_for"]
                        and s["waiting_for"]["reason"] == "concurrency"]  # fmt: skip
                return True if len(going) == 2 and len(held) == 2 else None

            wait_for(first_two_running, timeout=30)
            doomed.send_signal(signal.SIGKILL)  # mid-step, holding the slots of a and b
            doomed.wait()
        killed_at = time.time()
        with worker(tmp_path, pg_url, **env):
            runs = wait_for(lambda: _all_completed(c, ids), timeout=60)
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for run in runs:
        out = run["steps"][0]["output"]
        by_key[out["k"]].append((out["begun"], out["ended"]))
    for spans in by_key.values():
        # the killed attempt left no output; the retried first run and the held second one
        # ran one after the other, both after the kill
        assert peak_overlap(spans) == 1
        assert all(begun >= killed_at - 0.1 for begun, _ in spans)


class Arrivals(BaseHTTPRequestHandler):
    at: ClassVar[list[float]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with Arrivals.lock:
            Arrivals.at.append(time.monotonic())
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_an_endpoint_rate_limit_holds_in_total_across_three_workers(
    tmp_path: Path, pg_url: str
) -> None:
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    env = _env(FLOWHOOK_ALLOW_PRIVATE_TARGETS="true")
    key = api_key(pg_url)
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Arrivals)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    Arrivals.at.clear()
    try:
        with (
            serve(tmp_path, pg_url, "api", **env) as api,
            worker(tmp_path, pg_url, **env),
            worker(tmp_path, pg_url, **env),
            worker(tmp_path, pg_url, **env),
            httpx.Client(
                base_url=api.base, headers={"Authorization": f"Bearer {key}"}, timeout=30
            ) as c,
        ):
            url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
            r = c.post(
                "/api/v1/webhooks/endpoints",
                json={"url": url, "events": ["flow.completed"], "rate_limit": 10},
            )
            assert r.status_code == 201, r.text  # fmt: skip
            flow_id = c.post("/api/v1/flows", json=_span_flow("quick", 0.0)).json()["flow_id"]
            for _ in range(40):
                c.post("/api/v1/flows/execute", json={"flow_id": flow_id})
            wait_for(lambda: True if len(Arrivals.at) >= 40 else None, timeout=60)
    finally:
        receiver.shutdown()
        receiver.server_close()
    times = sorted(Arrivals.at)
    assert len(times) == 40
    # The endpoint's slots are 0.1 s apart and no delivery goes before its slot; one may go
    # late (its process busy: three workers and the API share two cores here), which brings
    # it closer to the next by that much. So eleven arrivals span at least 1 s less the
    # latest a busy process sent one, and forty span at least 3.9 s less that.
    late = 0.2
    for i in range(10, len(times)):
        assert times[i] - times[i - 10] >= 1.0 - late, times
    assert times[-1] - times[0] >= 3.9 - late, times
