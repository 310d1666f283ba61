"""A store that cannot be reached: 503 with the error JSON, never a 500 or a hang."""

from __future__ import annotations

import httpx

from flowhook.app import create_app
from flowhook.config import Settings


async def test_unreachable_store_answers_503_json() -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1:9/nowhere")
    app = create_app(settings, run_worker=False, run_migrations=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            health = await client.get("/healthz")  # the process is up: 200, size unknown
            assert health.status_code == 200
            assert health.json()["disk"] == {
                "database_bytes": None,
                "budget_bytes": None,
                "over_budget": False,
            }
            r = await client.get("/readyz")
            assert r.status_code == 503
            assert r.json()["code"] == "store_unavailable"
            r = await client.post(
                "/api/v1/flows/execute",
                json={"flow_id": "wf_x"},
                headers={"Authorization": "Bearer sk_test_" + "a" * 32},
            )
            assert r.status_code == 503
            assert r.json()["code"] == "store_unavailable"
            assert r.headers["retry-after"] == "1"
