"""/metrics: behind FLOWHOOK_METRICS_TOKEN when it is set, and no series that name a flow."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import SecretStr

from flowhook.app import create_app
from flowhook.config import Settings
from flowhook.webhooks import metrics as webhook_metrics
from tests.conftest import Api

TOKEN = "metrics-token-0123456789"


async def scrape(settings: Settings, *headers: dict[str, Any]) -> AsyncIterator[httpx.Response]:
    app = create_app(settings, run_worker=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://flowhook.test"
        ) as client,
    ):
        for h in headers:
            yield await client.get("/metrics", headers=h)


async def test_metrics_token_is_required_when_set(settings: Settings) -> None:
    guarded = settings.model_copy(update={"metrics_token": SecretStr(TOKEN)})
    refused: list[dict[str, Any]] = [
        {},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer jeton-é".encode()},  # bytes outside ASCII
        {"Authorization": TOKEN},
    ]
    answers = [r async for r in scrape(guarded, *refused, {"Authorization": f"Bearer {TOKEN}"})]
    for headers, r in zip(refused, answers, strict=False):
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json() == {
            "error": "send Authorization: Bearer <FLOWHOOK_METRICS_TOKEN> to read the metrics",
            "code": "unauthenticated",
        }
        assert "flowhook_" not in r.text
    assert answers[-1].status_code == 200
    assert "flowhook_queue_depth" in answers[-1].text


async def test_metrics_open_without_a_token(settings: Settings) -> None:
    for blank in (None, SecretStr("")):
        open_ = settings.model_copy(update={"metrics_token": blank})
        (r,) = [r async for r in scrape(open_, {})]
        assert r.status_code == 200 and "flowhook_queue_depth" in r.text


async def test_metrics_name_no_flow(api: Api) -> None:
    flow_id = await api.create_flow(
        {"name": "m", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}
    )
    assert (await api.wait(await api.execute(flow_id)))["status"] == "completed"
    text = (await api.client.get("/metrics")).text
    assert 'flowhook_runs_finished_total{status="completed"}' in text
    assert flow_id not in text and "flow_id=" not in text


def test_attempt_outcomes_are_a_fixed_set() -> None:
    before = webhook_metrics.ATTEMPTS.labels(outcome="other")._value.get()
    webhook_metrics.record_attempt("made-up-outcome-123", 5)
    assert webhook_metrics.ATTEMPTS.labels(outcome="other")._value.get() == before + 1
    families = {m.name: m for m in webhook_metrics.ATTEMPTS.collect()}
    outcomes = {s.labels["outcome"] for s in families["flowhook_webhook_attempts"].samples}
    assert outcomes <= webhook_metrics.OUTCOMES | {"other"}
