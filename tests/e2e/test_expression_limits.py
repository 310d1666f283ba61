"""Expressions against a real `flowhook serve`: slow ones run off the API's event loop, so
another tenant's requests keep answering, and one past the time bound fails its step."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import FLOWHOOK, secret_key_env, serve

# Runs without coverage (see the no_tracer marker in pyproject.toml).
pytestmark = [pytest.mark.e2e, pytest.mark.no_tracer, pytest.mark.soak]  # measures latency

SPIN = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
"""Runs far past the 1 s bound."""
LEGAL = "{% for i in range(300) %}{% for j in range(1000) %}{% endfor %}{% endfor %}done"
"""Slow-ish (a few hundred thousand iterations) but well within the bound."""


def make_key(database_url: str, workspace: str) -> dict[str, str]:
    out = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", workspace, "--json", "--database-url", database_url],
        capture_output=True, text=True, check=True,
        env={**os.environ, **secret_key_env(database_url)},
    )  # fmt: skip
    return {"Authorization": f"Bearer {json.loads(out.stdout)['key']}"}


def create_flow(client: httpx.Client, auth: dict[str, str], output: Any) -> str:
    body = {"name": "f", "steps": [{"id": "t", "type": "transform", "output": output}]}
    r = client.post("/api/v1/flows", json=body, headers=auth)
    assert r.status_code == 201, r.text
    return str(r.json()["flow_id"])


def execute(client: httpx.Client, auth: dict[str, str], flow_id: str) -> str:
    r = client.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {}}, headers=auth)
    assert r.status_code == 202, r.text
    return str(r.json()["run_id"])


def test_slow_expressions_leave_other_tenants_answered_and_stop_at_the_bound(
    tmp_path: Path, database_url: str
) -> None:
    acme = make_key(database_url, "acme")
    globex = make_key(database_url, "globex")
    with (
        serve(tmp_path, database_url) as server,
        httpx.Client(base_url=server.base, timeout=30) as client,
    ):
        create_flow(client, globex, {"n": 1})
        spin = create_flow(client, acme, {"n": SPIN})
        legal = create_flow(client, acme, {"n": LEGAL})
        started = time.monotonic()
        slow_runs = [execute(client, acme, spin) for _ in range(3)]
        legal_run = execute(client, acme, legal)
        latencies: list[float] = []
        finished: dict[str, dict[str, Any]] = {}
        while len(finished) < 4 and time.monotonic() - started < 60:
            t0 = time.monotonic()
            r = client.get("/api/v1/flows", headers=globex)
            latencies.append(time.monotonic() - t0)
            assert r.status_code == 200 and len(r.json()["data"]) == 1
            if len(latencies) % 4:  # the other tenant is sampled often, the runs read less
                time.sleep(0.02)
                continue
            for run_id in [*slow_runs, legal_run]:
                if run_id not in finished:
                    body = client.get(f"/api/v1/flows/runs/{run_id}", headers=acme).json()
                    if body["status"] in ("completed", "failed"):
                        finished[run_id] = body
            time.sleep(0.02)
        elapsed = time.monotonic() - started

    assert len(finished) == 4
    for run_id in slow_runs:
        run = finished[run_id]
        assert run["status"] == "failed"
        [step] = run["steps"]
        assert step["error"]["type"] == "expression"
        assert "took longer than 1 s" in step["error"]["message"]
    assert finished[legal_run]["status"] == "completed"
    assert finished[legal_run]["steps"][0]["output"] == {"n": "done"}
    # Three evaluations of ~1 s each, one after another in the expression thread.
    assert 3.0 <= elapsed < 12.0
    # Meanwhile the other tenant's list kept answering, far faster than one evaluation.
    assert len(latencies) > 5
    assert max(latencies) < 0.5, sorted(latencies)[-5:]
