"""The async SDK over the ASGI app (httpx transport passed in, nothing patched)."""

from __future__ import annotations

import asyncio

import httpx

from flowhook.client import AsyncClient
from tests.conftest import Api


async def test_async_client_round_trip(api: Api) -> None:
    transport = httpx.ASGITransport(app=api.app)
    async with AsyncClient("http://flowhook.test", api.keys["test"], transport=transport) as client:
        flow = await client.create_flow(
            {
                "name": "a",
                "steps": [{"id": "x", "type": "transform", "output": {"v": "{{ payload.v }}"}}],
            }
        )
        accepted = await client.execute(flow["flow_id"], {"v": 7})
        run = await client.wait(accepted.run_id, interval=0.02, max_attempts=200)
        assert (run.status, run.steps[0]["output"]) == ("completed", {"v": 7})
        assert [r.run_id for r in await client.list_runs()] == [accepted.run_id]
        rerun = await client.rerun(accepted.run_id, payload={"v": 8}, idempotency_key="r1")
        assert rerun.rerun_of == accepted.run_id
        again = await client.wait(rerun.run_id, interval=0.02, max_attempts=200)
        assert (again.rerun_of, again.output, again.steps[0]["output"]) == (
            accepted.run_id,
            None,
            {"v": 8},
        )
    async with AsyncClient(
        "http://flowhook.test/api/v1/", api.keys["live"], transport=transport
    ) as live:
        assert await live.list_runs() == []


async def test_async_client_sends_signals(api: Api) -> None:
    transport = httpx.ASGITransport(app=api.app)
    async with AsyncClient("http://flowhook.test", api.keys["test"], transport=transport) as client:
        flow = await client.create_flow(
            {
                "name": "w",
                "steps": [{"id": "go", "type": "wait", "signal": "go", "match": {"k": 1}}],
            }
        )
        accepted = await client.execute(flow["flow_id"])
        for _ in range(200):
            run = await client.get_run(accepted.run_id)
            if run.steps and run.steps[0]["status"] == "waiting":
                break
            await asyncio.sleep(0.02)
        assert (await client.send_signal("go", {"k": 2}, id="a"))["matched"] == 0
        sent = await client.send_signal("go", run_id=accepted.run_id, id="psp-1")
        assert sent["matched"] == 1 and sent["run_id"] == accepted.run_id
        again = await client.send_signal("go", run_id=accepted.run_id, id="psp-1")
        assert (again["id"], again["matched"]) == (sent["id"], 0)  # the id is kept
        done = await client.wait(accepted.run_id, interval=0.02, max_attempts=200)
        assert done.status == "completed" and done.steps[0]["output"]["id"] == sent["id"]


async def test_async_client_approves_and_rejects(api: Api) -> None:
    transport = httpx.ASGITransport(app=api.app)
    async with AsyncClient("http://flowhook.test", api.keys["test"], transport=transport) as client:
        flow = await client.create_flow(
            {"name": "a", "steps": [{"id": "ok", "type": "approval", "on_reject": "continue"}]}
        )
        first = (await client.execute(flow["flow_id"])).run_id
        second = (await client.execute(flow["flow_id"])).run_id
        for run_id in (first, second):
            for _ in range(200):
                run = await client.get_run(run_id)
                if run.steps and run.steps[0]["status"] == "waiting":
                    break
                await asyncio.sleep(0.02)
        assert (await client.approve(first, "ok", "yes"))["approved"] is True
        assert (await client.reject(second, "ok"))["approved"] is False
        done = await client.wait(first, interval=0.02, max_attempts=200)
        assert done.steps[0]["output"]["comment"] == "yes"
