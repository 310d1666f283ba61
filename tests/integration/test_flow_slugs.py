"""Flows kept as code, on both backends: a definition's ``slug`` names one flow of a workspace
and mode (another flow may not take it: 409), ``GET /flows?slug=`` finds it, an archived
flow gives it up, and ``POST /flows/validate`` checks a definition without saving it."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api


def flow(name: str, slug: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "steps": [{"id": "a", "type": "transform", "output": {}}]}
    if slug is not None:
        body["slug"] = slug
    return {**body, **extra}


async def test_a_slug_names_one_flow(api: Api) -> None:
    first = await api.create_flow(flow("Orders", "orders"))
    r = await api.get("/api/v1/flows", params={"slug": "orders"})
    assert [f["flow_id"] for f in r.json()["data"]] == [first]
    r = await api.post("/api/v1/flows", flow("Orders again", "orders"))
    assert r.status_code == 409 and first in r.json()["error"], r.text
    other = await api.create_flow(flow("Refunds", "refunds"))
    r = await api.client.put(f"/api/v1/flows/{other}", json=flow("Refunds", "orders"),
                             headers=api.auth())  # fmt: skip
    assert r.status_code == 409, r.text
    # another workspace or mode has slugs of its own
    assert (
        await api.post("/api/v1/flows", flow("Orders", "orders"), who="other")
    ).status_code == 201
    assert (
        await api.post("/api/v1/flows", flow("Orders", "orders"), who="live")
    ).status_code == 201
    # a new version may change the slug; an archived flow gives its slug up
    r = await api.client.put(f"/api/v1/flows/{first}", json=flow("Orders", "orders-v2"),
                             headers=api.auth())  # fmt: skip
    assert r.status_code == 200, r.text
    assert (await api.get("/api/v1/flows", params={"slug": "orders"})).json()["data"] == []
    assert (
        await api.client.delete(f"/api/v1/flows/{first}", headers=api.auth())
    ).status_code == 204
    assert (await api.post("/api/v1/flows", flow("Orders", "orders-v2"))).status_code == 201
    for bad in ("Orders", "a b", "x" * 65):
        r = await api.post("/api/v1/flows", flow("Bad", bad))
        assert r.status_code == 400 and "slug" in r.text, r.text
        assert (await api.get("/api/v1/flows", params={"slug": bad})).status_code == 400


async def test_validate_checks_without_saving(api: Api) -> None:
    r = await api.post("/api/v1/flows/validate", flow("Checked", "checked"))
    assert r.status_code == 200 and r.json()["valid"] is True, r.text
    assert r.json()["definition"]["slug"] == "checked"
    r = await api.post(
        "/api/v1/flows/validate", {"name": "x", "steps": [{"id": "a", "type": "nope"}]}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_definition", r.text
    assert (await api.get("/api/v1/flows")).json()["data"] == []
