"""PostgreSQL restarted under load: while it is down the API answers 503 with the error JSON;
afterwards every run that got a 202 completes, with no process restarted. (Named to run last:
it stops the shared PostgreSQL for a few seconds.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serve

pytestmark = pytest.mark.e2e


def pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action, *(["-m", "fast"] if action == "stop" else [])],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1"], check=False).returncode == 0


@pytest.mark.skipif(
    not (Path("/etc/postgresql").exists() and shutil.which("pg_ctlcluster") and os.geteuid() == 0),
    reason="needs the local PostgreSQL cluster and root",
)
def test_restart_postgres_under_load(tmp_path: Path, pg_url: str) -> None:
    from tests.conftest import _truncate_all

    _truncate_all(pg_url)
    with serve(
        tmp_path, pg_url, FLOWHOOK_LOG_LEVEL="warning", FLOWHOOK_POLL_INTERVAL="1"
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
            pg_ctl("stop")
            time.sleep(2.0)
        finally:
            pg_ctl("start")
            for _ in range(60):
                if pg_ready():
                    break
                time.sleep(0.5)
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
