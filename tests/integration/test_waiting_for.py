"""``waiting_for`` says why a run is not executing a step, for every reason a running run can
sleep for (delay, retry, signal, approval, child, parts; task and flow control have their
own tests), on both backends, as the API answers it and ``flowhook runs show`` prints it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from flowhook.cli_watch import waiting_line
from flowhook.service.waiting import why_queued
from flowhook.store.models import Mode, Run, RunStatus
from tests.conftest import Api, Receiver


async def why(api: Api, run_id: str, reason: str) -> dict[str, Any]:
    """The run's ``waiting_for`` once it gives ``reason`` (the run got there: an event)."""
    async with asyncio.timeout(15):
        while True:
            r = await api.get(f"/api/v1/flows/runs/{run_id}")
            assert r.status_code == 200, r.text
            found = r.json()["waiting_for"]
            if found is not None and found["reason"] == reason:
                return dict(found)
            await asyncio.sleep(0.02)


def one_step(step: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"sleeps in {step['type']}", "steps": [step]}


async def test_each_step_a_run_sleeps_in_says_what_for(api: Api, receiver: Receiver) -> None:
    start = api.execute
    delay = await start(
        await api.create_flow(one_step({"id": "nap", "type": "delay", "seconds": 600}))
    )
    signal = await start(await api.create_flow(one_step(
        {"id": "paid", "type": "wait", "signal": "order.paid", "match": {"order": "{{ payload.o }}"},
         "timeout_seconds": 600})), {"o": "o-1"})  # fmt: skip
    approval = await start(await api.create_flow(one_step(
        {"id": "boss", "type": "approval", "message": "Refund?"})))  # fmt: skip
    child_flow = await api.create_flow(one_step({"id": "nap", "type": "delay", "seconds": 600}))
    parent = await start(await api.create_flow(one_step(
        {"id": "call", "type": "flow", "flow_id": child_flow})))  # fmt: skip
    fan = await start(await api.create_flow(one_step(
        {"id": "each", "type": "map", "items": "{{ payload.items }}",
         "steps": [{"id": "hold", "type": "wait", "signal": "never"}]})), {"items": [1, 2, 3]})  # fmt: skip
    receiver.default = (503, {"down": True})
    retry = await start(await api.create_flow(one_step(
        {"id": "call_out", "type": "http", "request": {"method": "POST", "url": receiver.url},
         "retry": {"max_attempts": 3, "backoff_seconds": 600}})))  # fmt: skip

    said = await why(api, delay, "delay")
    assert said["step_id"] == "nap" and datetime.fromisoformat(said["until"]) > datetime.now(UTC)
    said = await why(api, signal, "signal")
    assert (said["step_id"], said["name"], said["match"]) == (
        "paid",
        "order.paid",
        {"order": "o-1"},
    )
    assert said["until"] is not None
    said = await why(api, approval, "approval")
    assert said["step_id"] == "boss" and said["until"] is None  # no time limit set
    said = await why(api, parent, "child")
    assert said["step_id"] == "call" and said["run_id"].startswith("run_")
    child = (await api.get(f"/api/v1/flows/runs/{said['run_id']}")).json()
    assert child["parent_run_id"] == parent
    said = await why(api, fan, "parts")
    assert said["step_id"] == "each"
    async with asyncio.timeout(15):  # the items start, then sleep in their own wait steps
        while said["parts"] != {"running": 3}:
            said = await why(api, fan, "parts")
    said = await why(api, retry, "retry")
    assert (said["step_id"], said["attempt"]) == ("call_out", 2)
    assert datetime.fromisoformat(said["until"]) > datetime.now(UTC)

    # the runs list says the same of each, read for the whole page at once
    r = await api.get("/api/v1/flows/runs?limit=50")
    listed = {x["run_id"]: x["waiting_for"] for x in r.json()["data"]}
    expected = {delay: "delay", signal: "signal", approval: "approval", parent: "child",
                fan: "parts", retry: "retry"}  # fmt: skip
    assert {run_id: (listed[run_id] or {}).get("reason") for run_id in expected} == expected
    assert listed[signal]["name"] == "order.paid" and listed[approval]["step_id"] == "boss"


def test_a_queued_run_not_held_waits_for_a_worker_and_the_cli_says_each_reason() -> None:
    queued_at = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    run = Run(
        run_id="run_1", workspace_id="ws", mode=Mode.TEST, flow_id="wf_1", flow_version=1,
        trigger="api", status=RunStatus.QUEUED, payload={}, queued_at=queued_at,
    )  # fmt: skip
    assert why_queued(run) == {"reason": "worker", "since": queued_at}
    lines = {
        "worker": {"reason": "worker", "since": "2026-12-05T10:00:00Z"},
        "concurrency": {"reason": "concurrency", "key": "cus_1", "held_by": ["run_a"]},
        "delay": {"reason": "delay", "step_id": "nap", "until": "2026-12-05T11:00:00Z"},
        "retry": {"reason": "retry", "step_id": "call", "attempt": 2, "until": "x"},
        "signal": {"reason": "signal", "step_id": "paid", "name": "order.paid"},
        "approval": {"reason": "approval", "step_id": "boss"},
        "child": {"reason": "child", "step_id": "call", "run_id": "run_c"},
        "parts": {"reason": "parts", "step_id": "each", "parts": {"running": 2, "completed": 1}},
        "task": {"reason": "task", "task": "t", "no_worker": True},
    }
    said = {reason: waiting_line(why) for reason, why in lines.items()}
    assert said["worker"].startswith("waiting for an engine worker")
    assert "held by run_a" in said["concurrency"]
    assert "attempt 2" in said["retry"] and "order.paid" in said["signal"]
    assert "run_c" in said["child"] and "2 running" in said["parts"]
    assert "no worker runs it" in said["task"]
    assert waiting_line(None) == ""
