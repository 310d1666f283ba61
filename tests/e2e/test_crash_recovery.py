"""`kill -9` of the serving process during a delay and during a step, then a restart: the run
completes, no step that had finished runs again, and the attempt the kill cut short shows as
interrupted."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serve, wait_for

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def counts(folder: Path, run_id: str) -> dict[str, int]:
    return {
        p.name.removeprefix(f"{run_id}-"): len(p.read_text().splitlines())
        for p in folder.glob(f"{run_id}-*")
    }


@pytest.mark.parametrize("crash_during", ["delay", "step"])
def test_kill_9_then_restart_completes_the_run(
    tmp_path: Path, database_url: str, crash_during: str
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        "FLOWHOOK_PLUGINS": "tests.plugins",
        "FLOWHOOK_LEASE_SECONDS": "1.5",
        "FLOWHOOK_TEST_COUNT_DIR": str(marks),
        "PYTHONPATH": str(ROOT),
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    middle: dict[str, Any] = (
        {"id": "pause", "type": "delay", "seconds": 2}
        if crash_during == "delay"
        else {"id": "pause", "type": "python", "function": "nap", "input": 2}
    )
    definition = {
        "name": "crash",
        "steps": [
            {"id": "first", "type": "python", "function": "count"},
            {"id": "pure", "type": "transform", "output": {"v": 1}},
            middle,
            {"id": "last", "type": "python", "function": "count"},
        ],
    }
    with serve(tmp_path, database_url, split=True, **env) as server:
        key = server.value("sandbox key")
        auth = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
            flow_id = client.post("/api/v1/flows", json=definition).json()["flow_id"]
            run_id = client.post("/api/v1/flows/execute", json={"flow_id": flow_id}).json()[
                "run_id"
            ]

            def in_pause() -> bool:
                run = client.get(f"/api/v1/flows/runs/{run_id}").json()
                return counts(marks, run_id).get("first") == 1 and (
                    crash_during == "step" or any(s["id"] == "pause" for s in run["steps"])
                )

            wait_for(in_pause)
            time.sleep(0.3)  # well inside the 2 s pause
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()

    with (
        serve(tmp_path, database_url, split=True, **env) as again,
        httpx.Client(base_url=again.base, headers=auth, timeout=10) as client,
    ):

        def finished() -> dict[str, Any] | None:
            run: dict[str, Any] = client.get(f"/api/v1/flows/runs/{run_id}").json()
            return run if run["status"] in ("completed", "failed", "cancelled") else None

        run = wait_for(finished, timeout=30)
    assert run["status"] == "completed", run
    assert [s["status"] for s in run["steps"]] == ["completed"] * 4
    assert counts(marks, run_id) == {"first": 1, "last": 1}
    # the python step in flight at the kill ran again as attempt 2, the first interrupted
    expected = (2, [1]) if crash_during == "step" else (1, [])
    assert [(s["attempts"], s["interrupted_attempts"]) for s in run["steps"]] == [
        (1, []),
        (1, []),
        expected,
        (1, []),
    ]


def test_kill_9_while_runs_wait_for_signals_and_approvals(
    tmp_path: Path, database_url: str
) -> None:
    """Runs wait for signals and approvals; the engine's process is killed; signals and
    decisions sent while it is down (through a second, API-only process) resume each run
    exactly once after the restart, and the run no signal matched still waits."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        "FLOWHOOK_PLUGINS": "tests.plugins",
        "FLOWHOOK_LEASE_SECONDS": "1.5",
        "FLOWHOOK_TEST_COUNT_DIR": str(marks),
        "PYTHONPATH": str(ROOT),
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    definition = {
        "name": "paid",
        "steps": [
            {"id": "first", "type": "python", "function": "count"},
            {
                "id": "paid",
                "type": "wait",
                "signal": "order.paid",
                "match": {"order_id": "{{ payload.order_id }}"},
            },
            {"id": "after", "type": "python", "function": "count"},
        ],
    }
    with serve(tmp_path, database_url, split=True, **env) as server:
        auth = {"Authorization": f"Bearer {server.value('sandbox key')}"}
        with httpx.Client(base_url=server.base, headers=auth, timeout=10) as client:
            flow_id = client.post("/api/v1/flows", json=definition).json()["flow_id"]
            ids = [
                client.post(
                    "/api/v1/flows/execute",
                    json={"flow_id": flow_id, "payload": {"order_id": f"o{i}"}},
                ).json()["run_id"]
                for i in range(6)
            ]

            approval = {
                "name": "ask",
                "steps": [
                    {"id": "first", "type": "python", "function": "count"},
                    {"id": "ok", "type": "approval", "message": "go?"},
                    {"id": "after", "type": "python", "function": "count"},
                ],
            }
            ask_id = client.post("/api/v1/flows", json=approval).json()["flow_id"]
            asks = [
                client.post("/api/v1/flows/execute", json={"flow_id": ask_id}).json()["run_id"]
                for _ in range(2)
            ]

            def all_waiting() -> bool:
                runs = [client.get(f"/api/v1/flows/runs/{r}").json() for r in ids + asks]
                return all(
                    len(r["steps"]) == 2 and r["steps"][1]["status"] == "waiting" for r in runs
                )

            wait_for(all_waiting)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()

    def send(client: httpx.Client, order: str, **extra: Any) -> dict[str, Any]:
        body = {"name": "order.paid", "data": {"order_id": order}, **extra}
        answer: dict[str, Any] = client.post("/api/v1/signals", json=body).json()
        return answer

    with (
        serve(tmp_path, database_url, "api", **env) as api_only,
        httpx.Client(base_url=api_only.base, headers=auth, timeout=10) as client,
    ):
        sent = [send(client, f"o{i}", id=f"evt-{i}") for i in range(4)]
        assert [s["matched"] for s in sent] == [1, 1, 1, 1]
        assert send(client, "o0", id="evt-0")["matched"] == 0  # the same signal again
        r = client.post(f"/api/v1/flows/runs/{ids[4]}/signal", json={"name": "order.paid"})
        assert r.json()["matched"] == 1
        r = client.post(f"/api/v1/flows/runs/{asks[0]}/steps/ok/approve", json={})
        assert r.status_code == 200 and r.json()["approved"] is True
        r = client.post(f"/api/v1/flows/runs/{asks[1]}/steps/ok/reject", json={"comment": "no"})
        assert r.status_code == 200
        again = client.post(f"/api/v1/flows/runs/{asks[0]}/steps/ok/reject", json={})
        assert again.status_code == 409
        time.sleep(0.5)  # nothing runs them: no engine
        assert all(
            client.get(f"/api/v1/flows/runs/{r}").json()["steps"][1]["status"] == "waiting"
            for r in ids
        )

    with (
        serve(tmp_path, database_url, split=True, **env) as again,
        httpx.Client(base_url=again.base, headers=auth, timeout=10) as client,
    ):

        def five_done() -> list[dict[str, Any]] | None:
            runs = [client.get(f"/api/v1/flows/runs/{r}").json() for r in ids]
            return runs if sum(r["status"] == "completed" for r in runs) == 5 else None

        runs = wait_for(five_done, timeout=30)

        def both_decided() -> list[dict[str, Any]] | None:
            found = [client.get(f"/api/v1/flows/runs/{a}").json() for a in asks]
            return found if all(r["status"] in ("completed", "failed") for r in found) else None

        decided = wait_for(both_decided, timeout=30)
        time.sleep(0.5)
        assert client.get(f"/api/v1/flows/runs/{ids[5]}").json()["status"] == "running"
    for run_id, run in zip(ids[:5], runs[:5], strict=True):
        assert run["status"] == "completed", run
        assert counts(marks, run_id) == {"first": 1, "after": 1}
    assert [r["steps"][1]["output"]["id"] for r in runs[:4]] == [s["id"] for s in sent]
    assert counts(marks, ids[5]) == {"first": 1}
    assert [r["status"] for r in decided] == ["completed", "failed"]
    assert decided[1]["error"]["type"] == "rejected"
    assert counts(marks, asks[0]) == {"first": 1, "after": 1}
    assert counts(marks, asks[1]) == {"first": 1}
