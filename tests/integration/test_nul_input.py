"""The NUL character from outside answers 400, never 500: PostgreSQL cannot hold it in text
(the audit's odd-input finding; SQLite would keep it)."""

from __future__ import annotations

import pytest

from tests.conftest import Api, Receiver


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/flows/wf_x%00",
        "/api/v1/webhooks/deliveries?endpoint_id=%00",
        "/api/v1/flows/runs?flow_id=wf_%00",
        "/api/v1/events?event=a%00",
        "/settings/runs?status=%00",
    ],
)
async def test_nul_in_a_url_answers_400(api: Api, path: str) -> None:
    r = await api.get(path)
    assert r.status_code == 400, r.text
    assert "NUL" in r.json()["error"]


async def test_nul_in_a_body_field_never_answers_500(api: Api, receiver: Receiver) -> None:
    r = await api.post(
        "/api/v1/webhooks/endpoints",
        {"url": receiver.url, "events": ["flow.completed"], "description": "a\u0000b"},
    )
    assert r.status_code in (201, 400), r.text  # SQLite keeps it; PostgreSQL cannot
    if r.status_code == 400:
        assert "NUL" in r.json()["error"]
