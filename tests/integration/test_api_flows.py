"""Flows over HTTP: create, validate, version, list, archive."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api

HELLO: dict[str, Any] = {
    "name": "Hello",
    "steps": [{"id": "greet", "type": "transform", "output": {"hi": "{{ payload.name }}"}}],
}


async def test_create_answers_201_with_the_flow(api: Api) -> None:
    r = await api.post("/api/v1/flows", HELLO)
    assert r.status_code == 201
    body = r.json()
    assert body["flow_id"].startswith("wf_")
    assert body["version"] == 1
    assert body["name"] == "Hello"
    assert body["definition"] == HELLO
    assert body["created_at"].endswith("Z")
    got = (await api.get(f"/api/v1/flows/{body['flow_id']}")).json()
    assert got == body


async def test_invalid_definitions_answer_400_naming_step_and_field(api: Api) -> None:
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"steps": HELLO["steps"]}, ["name"]),
        ({"name": "x", "steps": [{"id": "a", "type": "transform"}]}, ["'a'", "output"]),
        ({"name": "x", "steps": [{"id": "a", "type": "teleport"}]}, ["'a'", "type"]),
        (
            {"name": "x", "steps": [{"id": "a", "type": "transform", "output": {}, "oops": 1}]},
            ["'a'", "oops"],
        ),
        (
            {
                "name": "x",
                "steps": [{"id": "a", "type": "condition", "if": "{{ 1 }}", "then": "zz"}],
            },
            ["'a'", "then"],
        ),
        (
            {
                "name": "x",
                "steps": [{"id": "a", "type": "transform", "output": {"v": "{{ 1 + }}"}}],
            },
            ["'a'", "output"],
        ),
        (
            {
                "name": "x",
                "steps": [
                    {"id": "a", "type": "transform", "output": {}},
                    {"id": "a", "type": "transform", "output": {}},
                ],
            },
            ["'a'", "already"],
        ),
    ]
    for definition, words in cases:
        r = await api.post("/api/v1/flows", definition)
        assert r.status_code == 400, (definition, r.text)
        assert r.json()["code"] == "invalid_definition"
        for word in words:
            assert word in r.json()["error"], (word, r.json()["error"])
    r = await api.post("/api/v1/flows", [1, 2])
    assert r.status_code == 400


async def test_every_problem_of_a_definition_is_in_one_answer(api: Api) -> None:
    """One 400 lists every problem, each with its field (``errors``); ``error`` is the first's,
    saying how many more there are. Nothing is saved."""
    definition = {
        "name": "x",
        "steps": [
            {"id": "a", "type": "transform", "output": {"v": "{{ 1 + }}"}},
            {"id": "b", "type": "transform", "output": {"w": "{{ steps.nope.output }}"}},
        ],
    }
    r = await api.post("/api/v1/flows", definition)
    assert r.status_code == 400, r.text
    body = r.json()
    assert [p["field"] for p in body["errors"]] == [
        "definition.steps[0].output", "definition.steps[1].output",
    ]  # fmt: skip
    assert "steps.nope" in body["errors"][1]["message"]
    assert body["error"] == f"{body['errors'][0]['message']} (and 1 more problem)"
    listed = await api.get("/api/v1/flows")
    assert [f["name"] for f in listed.json()["data"]] == []


async def test_put_makes_a_new_version_and_old_ones_stay_readable(api: Api) -> None:
    flow_id = await api.create_flow(HELLO)
    v2 = {**HELLO, "name": "Hello v2"}
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=v2, headers=api.auth())
    assert r.status_code == 200
    assert (r.json()["version"], r.json()["name"]) == (2, "Hello v2")
    old = (await api.get(f"/api/v1/flows/{flow_id}", params={"version": 1})).json()
    assert old["definition"]["name"] == "Hello"
    versions = (await api.get(f"/api/v1/flows/{flow_id}/versions")).json()["data"]
    assert [v["version"] for v in versions] == [2, 1]
    r = await api.get(f"/api/v1/flows/{flow_id}", params={"version": 9})
    assert r.status_code == 404
    bad = await api.client.put(f"/api/v1/flows/{flow_id}", json={"name": "x"}, headers=api.auth())
    assert bad.status_code == 400
    assert (await api.get(f"/api/v1/flows/{flow_id}")).json()["version"] == 2


async def test_delete_archives_and_then_execute_answers_404(api: Api) -> None:
    flow_id = await api.create_flow(HELLO)
    r = await api.client.delete(f"/api/v1/flows/{flow_id}", headers=api.auth())
    assert r.status_code == 204
    assert (await api.get(f"/api/v1/flows/{flow_id}")).status_code == 404
    r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id})
    assert r.status_code == 404
    r = await api.client.delete(f"/api/v1/flows/{flow_id}", headers=api.auth())
    assert r.status_code == 404
    assert (await api.get("/api/v1/flows")).json()["data"] == []


async def test_list_flows_pages_by_cursor(api: Api) -> None:
    ids = [await api.create_flow({**HELLO, "name": f"f{i}"}) for i in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await api.get("/api/v1/flows", params=params)).json()
        seen += [f["flow_id"] for f in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    assert (await api.get("/api/v1/flows", who="live")).json()["data"] == []


async def test_schema_is_published(api: Api) -> None:
    r = await api.client.get("/api/v1/schemas/flow.json")
    assert r.status_code == 200
    schema = r.json()
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert set(schema["$defs"]) >= {"transform", "condition", "fail", "http", "delay", "python"}


async def test_an_output_field_that_flow_completed_sets_itself_is_refused(api: Api) -> None:
    """flow.completed's payload is the output's fields plus `status`, `steps_executed` and
    `duration_ms` (SPEC §6): an output naming one of those would be overwritten in the
    webhook, so the definition is refused, on create and on a new version, and nothing is
    written."""
    for name in ("status", "steps_executed", "duration_ms"):
        shipped = {**HELLO, "output": {name: "shipped", "order": "{{ payload.name }}"}}
        r = await api.post("/api/v1/flows", shipped)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["code"] == "invalid_definition", body
        assert f"definition.output.{name} cannot be used" in body["error"], body
        assert "flow.completed" in body["error"], body
    assert (await api.get("/api/v1/flows")).json()["data"] == []
    flow_id = await api.create_flow({**HELLO, "output": {"order_status": "shipped"}})
    r = await api.client.put(
        f"/api/v1/flows/{flow_id}", json={**HELLO, "output": {"status": "x"}}, headers=api.auth()
    )
    assert r.status_code == 400 and "definition.output.status" in r.json()["error"], r.text
    assert (await api.get(f"/api/v1/flows/{flow_id}")).json()["version"] == 1
    # renamed, the output and the run's own fields both reach the event whole
    run = await api.wait(await api.execute(flow_id, {"name": "Ada"}))
    assert run["status"] == "completed" and run["output"] == {"order_status": "shipped"}
    [event] = (await api.get("/api/v1/events", params={"event": "flow.completed"})).json()["data"]
    payload = event["body"]["payload"]
    assert payload["order_status"] == "shipped" and payload["status"] == "completed"
    assert payload["steps_executed"] == 1 and isinstance(payload["duration_ms"], int)
