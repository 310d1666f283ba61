"""``GET /runs/{id}?wait=`` is woken by its run's events (the event hub), on both backends:
a run that ends is answered within milliseconds, where a read every 0.1 s answered up to
0.1 s late; a long poll takes no share of the key's streams."""

from __future__ import annotations

import asyncio

import pytest

from flowhook.service import runs as run_service
from tests.conftest import Api

HOLD = {"name": "hold", "steps": [{"id": "w", "type": "wait", "signal": "go"}]}


@pytest.fixture
def only_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the 0.1 s read nor the fallback's: only a wake-up can answer in time."""
    monkeypatch.setattr(run_service, "LONG_POLL_INTERVAL", 3600.0)
    monkeypatch.setattr(run_service, "LONG_POLL_FALLBACK", 3600.0)


@pytest.mark.usefixtures("only_woken")
async def test_a_long_poll_answers_when_its_run_ends(api: Api) -> None:
    flow_id = await api.create_flow(HOLD)
    run_id = await api.execute(flow_id)
    polls = [
        asyncio.create_task(api.get(f"/api/v1/flows/runs/{run_id}", params={"wait": "50"}))
        for _ in range(3)
    ]
    await asyncio.sleep(0)  # the polls are under way (they answer only once the run ends)
    hub = api.app.state.hub
    async with asyncio.timeout(10):
        while hub._watching < 3:
            await asyncio.sleep(0.01)
    assert hub.open_streams == 0  # not streams: no share of the key's, not in the gauge
    sent = await api.post("/api/v1/signals", {"name": "go", "data": {}})
    assert sent.status_code in (200, 201, 202), sent.text
    async with asyncio.timeout(10):  # an hour without the wake-up
        answers = await asyncio.gather(*polls)
    assert {a.json()["status"] for a in answers} == {"completed"}
    assert hub._watching == 0


@pytest.mark.usefixtures("only_woken")
async def test_a_long_poll_of_another_workspace_s_run_is_refused_and_watches_nothing(
    api: Api,
) -> None:
    run_id = await api.execute(await api.create_flow(HOLD))
    r = await api.get(f"/api/v1/flows/runs/{run_id}", who="other", params={"wait": "50"})
    assert r.status_code == 404
    assert api.app.state.hub._watching == 0
