"""Idle workers are woken by new work, not by their slow fallback poll."""

from __future__ import annotations

import asyncio

import httpx

from flowhook.app import create_app
from flowhook.config import Settings
from flowhook.store.models import Mode
from tests.conftest import Receiver


async def test_new_runs_and_deliveries_wake_idle_loops(
    settings: Settings, receiver: Receiver
) -> None:
    slow_poll = settings.model_copy(update={"poll_interval": 60.0})
    app = create_app(slow_poll)
    async with app.router.lifespan_context(app):
        key = (await app.state.services.keys.create(Mode.TEST, "w")).key
        auth = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth
        ) as c:
            await asyncio.sleep(0.3)  # both loops are idle now, polling only every 60 s
            r = await c.post(
                "/api/v1/webhooks/endpoints",
                json={"url": receiver.url, "events": ["flow.completed"]},
            )
            assert r.status_code == 201
            flow = await c.post(
                "/api/v1/flows",
                json={"name": "x", "steps": [{"id": "a", "type": "transform", "output": {}}]},
            )
            run_id = (
                await c.post("/api/v1/flows/execute", json={"flow_id": flow.json()["flow_id"]})
            ).json()["run_id"]
            async with asyncio.timeout(5):  # far below the 60 s poll
                while not receiver.requests:
                    await asyncio.sleep(0.01)
            assert (await c.get(f"/api/v1/flows/runs/{run_id}")).json()["status"] == "completed"
