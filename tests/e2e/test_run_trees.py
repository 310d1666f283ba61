"""Runaway sub-flow trees (audit 2, finding 2), over real HTTP on both backends: a flow that
calls itself (``wait: false``) from a 4-item map grew without end; now the runs one top-level
run's ``flow`` steps may start are bounded by ``FLOWHOOK_MAX_RUN_TREE``, and
``POST …/cancel`` with ``{"tree": true}`` cancels every unfinished run under a top-level run,
though that run itself has finished."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Server, serve

pytestmark = pytest.mark.e2e

BUDGET = 30


@pytest.fixture
def server(tmp_path: Path, database_url: str) -> Iterator[Server]:
    env = {"FLOWHOOK_MAX_RUN_TREE": str(BUDGET), "FLOWHOOK_LOG_LEVEL": "error"}
    with serve(tmp_path, database_url, **env) as server:
        yield server


def _client(server: Server) -> httpx.Client:
    auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
    return httpx.Client(base_url=server.base, timeout=10, headers=auth)


def _runs(client: httpx.Client, **params: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        query = {"limit": "100", **params, **({"cursor": cursor} if cursor else {})}
        r = client.get("/api/v1/flows/runs", params=query)
        assert r.status_code == 200, r.text
        found += r.json()["data"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return found


def _until(what: Callable[[], bool], message: str, within: float = 60) -> None:
    """Wait for ``what`` (an event the server's work brings about), bounded."""
    deadline = time.monotonic() + within
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def _flow(client: httpx.Client, definition: dict[str, Any], flow_id: str | None = None) -> str:
    if flow_id is None:
        r = client.post("/api/v1/flows", json=definition)
        assert r.status_code == 201, r.text
        return str(r.json()["flow_id"])
    r = client.put(f"/api/v1/flows/{flow_id}", json=definition)
    assert r.status_code in (200, 201), r.text
    return flow_id


def _unfinished(client: httpx.Client) -> int:
    return len(_runs(client, status="queued")) + len(_runs(client, status="running"))


def test_a_self_calling_tree_stops_at_its_budget(server: Server) -> None:
    with _client(server) as client:
        flow_id = _flow(
            client, {"name": "fork bomb", "steps": [{"id": "x", "type": "transform", "output": {}}]}
        )
        bomb = {
            "name": "fork bomb",
            "steps": [
                {
                    "id": "each",
                    "type": "map",
                    "items": "{{ [1, 2, 3, 4] }}",
                    "steps": [{"id": "again", "type": "flow", "flow_id": flow_id, "wait": False}],
                }
            ],
        }
        _flow(client, bomb, flow_id)
        r = client.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {}})
        assert r.status_code == 202, r.text
        root = r.json()["run_id"]
        _until(lambda: _unfinished(client) == 0, "the tree is still growing")
        runs = _runs(client)
        children = [r for r in runs if r["run_id"] != root]
        # exactly the budget: each child took one unit in the transaction that wrote it
        assert len(children) == BUDGET, len(children)
        failed = [r for r in runs if r["status"] == "failed"]
        assert failed, "no run met the budget"
        record = client.get(f"/api/v1/flows/runs/{failed[0]['run_id']}").json()
        assert record["error"]["type"] == "item_failed", record["error"]
        item_errors = [s["error"] for s in record["steps"] if s.get("error")]
        assert any(e["type"] == "run_tree_exhausted" for e in item_errors), item_errors
        assert "FLOWHOOK_MAX_RUN_TREE" in str(item_errors)


def test_cancelling_a_finished_root_s_tree(server: Server) -> None:
    with _client(server) as client:
        held = _flow(
            client, {"name": "held", "steps": [{"id": "w", "type": "wait", "signal": "never"}]}
        )
        mid = _flow(
            client,
            {"name": "mid", "steps": [
                {"id": "down", "type": "flow", "flow_id": held, "wait": False},
                {"id": "w", "type": "wait", "signal": "never"},
            ]},
        )  # fmt: skip
        root_flow = _flow(
            client,
            {"name": "root", "steps": [{
                "id": "each", "type": "map", "items": "{{ [1, 2, 3] }}",
                "steps": [{"id": "up", "type": "flow", "flow_id": mid, "wait": False}],
            }]},
        )  # fmt: skip
        r = client.post("/api/v1/flows/execute", json={"flow_id": root_flow, "payload": {}})
        root = r.json()["run_id"]
        # the root completes at once; three mid runs and three held runs go on waiting
        _until(
            lambda: (
                len(_runs(client, status="running")) == 6
                and client.get(f"/api/v1/flows/runs/{root}").json()["status"] == "completed"
            ),
            "the tree did not settle",
        )
        plain = client.post(f"/api/v1/flows/runs/{root}/cancel")
        assert plain.status_code == 409  # a finished run, cancelled alone: as before

        nested = _runs(client, status="running")[0]["run_id"]
        r = client.post(f"/api/v1/flows/runs/{nested}/cancel", json={"tree": True})
        assert r.status_code == 409 and root in r.json()["error"], r.text
        assert r.json()["code"] == "not_top_level"

        r = client.post(f"/api/v1/flows/runs/{root}/cancel", json={"tree": True})
        assert r.status_code in (200, 202), r.text
        body = r.json()
        assert body["run_id"] == root and body["status"] == "completed"
        # waiting runs hold no worker: all six end here, in one go
        assert body["tree"] == {"cancelled": 6, "cancelling": 0} and r.status_code == 200
        assert _unfinished(client) == 0
        cancelled = _runs(client, status="cancelled")
        assert len(cancelled) == 6
        for run in cancelled:  # each ended as a cancel of its own would end it
            assert run["finished_at"] is not None and run["duration_ms"] >= 0, run
            events = client.get(f"/api/v1/flows/runs/{run['run_id']}/events").json()["data"]
            last = events[-1]
            assert last["event"] == "flow.cancelled", events
            assert last["body"]["payload"]["duration_ms"] == run["duration_ms"], (last, run)

        again = client.post(f"/api/v1/flows/runs/{root}/cancel", json={"tree": True})
        assert again.status_code == 200 and again.json()["tree"] == {
            "cancelled": 0,
            "cancelling": 0,
        }
        bad = client.post(f"/api/v1/flows/runs/{root}/cancel", json={"tree": "yes"})
        assert bad.status_code == 400, bad.text


def test_a_workspace_past_its_active_runs_is_answered_429(
    tmp_path: Path, database_url: str
) -> None:
    env = {"FLOWHOOK_MAX_ACTIVE_RUNS_PER_WORKSPACE": "5", "FLOWHOOK_LOG_LEVEL": "error"}
    with serve(tmp_path, database_url, **env) as server, _client(server) as client:
        held = {"name": "held", "steps": [{"id": "w", "type": "wait", "signal": "never"}]}
        flow_id = _flow(client, held)

        def execute(c: httpx.Client) -> httpx.Response:
            return c.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {}})

        started = [execute(client) for _ in range(5)]
        assert [r.status_code for r in started] == [202] * 5
        refused = execute(client)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert "FLOWHOOK_MAX_ACTIVE_RUNS_PER_WORKSPACE" in refused.json()["error"]
        assert refused.json()["code"] == "rate_limited"
        assert len(_runs(client)) == 5  # nothing was written for it

        # the live mode of the same workspace has a count of its own
        live = {"Authorization": f"Bearer {server.value('live key')}"}
        with httpx.Client(base_url=server.base, timeout=10, headers=live) as other:
            live_flow = _flow(other, held)
            r = other.post("/api/v1/flows/execute", json={"flow_id": live_flow, "payload": {}})
            assert r.status_code == 202, r.text

        # a run that ends makes room, once the count is read again (about a second)
        r = client.post(f"/api/v1/flows/runs/{started[0].json()['run_id']}/cancel")
        assert r.status_code == 200, r.text
        _until(lambda: execute(client).status_code == 202, "no room after a run ended", 30)
