"""PostgreSQL restarted under load: while it is down the API answers 503 with the error JSON;
afterwards every run that got a 202 completes, with no process restarted.

The test stops its own PostgreSQL cluster (bench/harness.py ``PrivatePostgres``: initdb into a
temporary directory, a free port of 127.0.0.1), never the shared one, so it may run in any
order. Without PostgreSQL's binaries it is skipped locally and fails under CI (``CI=true``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness import PrivatePostgres, private_postgres_missing
from tests.conftest import IN_CI
from tests.support import serve

pytestmark = [pytest.mark.e2e, pytest.mark.soak]


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    if reason := private_postgres_missing():
        if IN_CI:
            pytest.fail(reason + "; CI must run the PostgreSQL restart test")
        pytest.skip(reason)
    with PrivatePostgres() as pg:
        yield pg


def test_restart_postgres_under_load(tmp_path: Path, private_pg: PrivatePostgres) -> None:
    with serve(
        tmp_path, private_pg.url(), FLOWHOOK_LOG_LEVEL="warning", FLOWHOOK_POLL_INTERVAL="1"
    ) as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        flow_id = server.value("example flow")
        accepted: list[str] = []
        answers: list[tuple[int, Any]] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=server.base, headers=auth, timeout=10) as c:
                while not stop.is_set():
                    try:
                        r = c.post(
                            "/api/v1/flows/execute",
                            json={"flow_id": flow_id, "payload": {"order_id": "o", "amount": 1}},
                        )
                    except httpx.TransportError as exc:
                        answers.append((0, str(exc)))
                        continue
                    answers.append((r.status_code, r.json()))
                    if r.status_code == 202:
                        accepted.append(r.json()["run_id"])
                    time.sleep(0.01)

        thread = threading.Thread(target=load)
        thread.start()
        try:
            time.sleep(1.0)
            private_pg.halt()
            time.sleep(2.0)
        finally:
            private_pg.resume()  # waits until it accepts connections (pg_ctl -w)
        time.sleep(2.0)
        stop.set()
        thread.join()

        statuses = {code for code, _ in answers}
        assert 503 in statuses, statuses
        assert statuses <= {202, 503}, [a for a in answers if a[0] not in (202, 503)][:3]
        unavailable = [body for code, body in answers if code == 503]
        assert all(b["code"] == "store_unavailable" and b["error"] for b in unavailable)
        assert answers[-1][0] == 202  # recovered by itself

        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as c:
            deadline = time.monotonic() + 60
            pending = set(accepted)
            while pending and time.monotonic() < deadline:
                for run_id in list(pending):
                    if c.get(f"/api/v1/flows/runs/{run_id}").json()["status"] == "completed":
                        pending.discard(run_id)
                time.sleep(0.5)
            assert not pending, f"{len(pending)} of {len(accepted)} accepted runs did not complete"
