"""Pausing a flow (both backends): it still accepts executes, its queued runs (accepted
before and after the pause) wait with ``waiting_for.reason`` ``paused``, a run already
asleep in a step goes on; resume lets them go oldest first, paced; other flows and other
workspaces' flows are untouched; unknown ids answer 404."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.conftest import Api


async def record(api: Api, run_id: str) -> dict[str, Any]:
    r = await api.get(f"/api/v1/flows/runs/{run_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def paused(api: Api, run_id: str) -> dict[str, Any]:
    async with asyncio.timeout(15):
        while True:
            run = await record(api, run_id)
            if (run["waiting_for"] or {}).get("reason") == "paused":
                return run
            await asyncio.sleep(0.02)


async def asleep_in_gate(api: Api, run_id: str) -> None:
    async with asyncio.timeout(15):
        while ((await record(api, run_id))["waiting_for"] or {}).get("reason") != "signal":
            await asyncio.sleep(0.02)


GATED = {"name": "gated", "steps": [
    {"id": "gate", "type": "wait", "signal": "go", "match": {"id": "{{ payload.id }}"}},
    {"id": "done", "type": "transform", "output": {"id": "{{ payload.id }}"}}]}  # fmt: skip


async def test_a_paused_flow_holds_its_queued_runs_until_resumed(api: Api) -> None:
    flow_id = await api.create_flow(GATED)
    other_flow = await api.create_flow({**GATED, "name": "other"})
    asleep = await api.execute(flow_id, {"id": "a"})
    await asleep_in_gate(api, asleep)  # started before the pause
    r = await api.post(f"/api/v1/flows/{flow_id}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is True and r.json()["paused_at"].endswith("Z")
    held = [await api.execute(flow_id, {"id": f"h{i}"}) for i in range(3)]  # still accepted
    for run_id in held:
        run = await paused(api, run_id)
        assert run["status"] == "queued" and run["waiting_for"]["since"] == run["queued_at"]
    elsewhere = await api.execute(other_flow, {"id": "x"})  # another flow goes on
    await asleep_in_gate(api, elsewhere)
    r = await api.post("/api/v1/signals", {"name": "go", "data": {"id": "a"}})
    assert r.status_code in (200, 201, 202), r.text
    assert (await api.wait(asleep))["status"] == "completed"  # what had started goes on
    assert [(await record(api, h))["status"] for h in held] == ["queued"] * 3
    flow = (await api.get(f"/api/v1/flows/{flow_id}")).json()
    assert flow["paused"] is True

    before = datetime.now(UTC)
    r = await api.post(f"/api/v1/flows/{flow_id}/resume", {"rate_per_second": 20})
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is False and r.json()["paused_at"] is None
    started = []
    for run_id in held:
        async with asyncio.timeout(15):
            while (run := await record(api, run_id))["started_at"] is None:
                await asyncio.sleep(0.02)
        started.append(datetime.fromisoformat(run["started_at"]))
    assert started == sorted(started)  # oldest first
    for n, at in enumerate(started):  # paced: the n-th not before n / 20 s after the resume
        assert at >= before + timedelta(seconds=n / 20 - 0.002), (n, at, before)
    for i, h in enumerate(held):
        await asleep_in_gate(api, h)
        r = await api.post("/api/v1/signals", {"name": "go", "data": {"id": f"h{i}"}})
        assert r.status_code in (200, 201, 202), r.text
        assert (await api.wait(h))["status"] == "completed"


async def test_pause_and_resume_answer_404_for_flows_not_the_callers(api: Api) -> None:
    flow_id = await api.create_flow(GATED)
    for path in (f"/api/v1/flows/{flow_id}/pause", f"/api/v1/flows/{flow_id}/resume"):
        r = await api.post(path, who="live")
        assert r.status_code == 404, r.text
    for path in ("/api/v1/flows/wf_nope/pause", "/api/v1/flows/nope/resume"):
        r = await api.post(path)
        assert r.status_code == 404, r.text
    r = await api.post(f"/api/v1/flows/{flow_id}/resume", {"rate_per_second": 0})
    assert r.status_code == 400 and "rate_per_second" in r.text, r.text
    r = await api.post(f"/api/v1/flows/{flow_id}/resume", {"rate_per_second": True})
    assert r.status_code == 400, r.text
