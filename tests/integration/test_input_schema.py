"""A flow's ``input_schema`` on both backends: a definition whose schema is no valid JSON
Schema is refused naming the place; an execute (or a rerun with a new payload) whose payload
fails it answers 400 naming the field, and nothing is stored; a payload that meets it starts
the run. A hostile ``pattern`` costs microseconds, not the API."""

from __future__ import annotations

from typing import Any

from tests.conftest import Api

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "amount"],
    "properties": {
        "order_id": {"type": "string", "pattern": "^ord_[0-9]+$", "title": "Order"},
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "email": {"type": "string", "format": "email"},
        "lines": {"type": "array", "items": {"type": "integer"}},
        "rush": {"type": "boolean"},
    },
}
FLOW = {"name": "Refund", "input_schema": SCHEMA,
        "steps": [{"id": "a", "type": "transform", "output": {"n": "{{ payload.amount }}"}}]}  # fmt: skip


async def _runs(api: Api) -> int:
    return len((await api.get("/api/v1/flows/runs?limit=100")).json()["data"])


async def test_a_payload_that_fails_the_schema_is_refused_naming_the_field(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    bad = {"order_id": "123", "amount": -4, "email": "nope", "lines": [1, "two"]}
    r = await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "payload": bad})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request", body
    fields = [e["field"] for e in body["errors"]]
    assert fields == ["payload.order_id", "payload.amount", "payload.email", "payload.lines[1]"]
    assert "^ord_[0-9]+$" in body["errors"][0]["message"]
    assert body["error"].startswith("the payload does not match the flow's input_schema: ")
    missing = await api.post(
        "/api/v1/flows/execute", {"flow_id": flow_id, "payload": {"amount": 1}}
    )
    assert missing.status_code == 400, missing.text
    [problem] = missing.json()["errors"]
    assert problem["field"] == "payload.order_id" and "required" in problem["message"]
    assert await _runs(api) == 0  # nothing stored

    good = {"order_id": "ord_42", "amount": 12.5, "email": "ana@example.com", "lines": [1, 2]}
    run_id = await api.execute(flow_id, good)
    done = await api.wait(run_id)
    assert done["status"] == "completed" and done["steps"][0]["output"]["n"] == 12.5
    assert await _runs(api) == 1


async def test_a_flow_without_a_schema_takes_any_payload_and_a_new_version_may_add_one(
    api: Api,
) -> None:
    plain = {k: v for k, v in FLOW.items() if k != "input_schema"}
    flow_id = await api.create_flow(plain)
    await api.execute(flow_id, {"anything": True})
    r = await api.client.put(f"/api/v1/flows/{flow_id}", json=FLOW, headers=api.auth())
    assert r.status_code == 200, r.text
    refused = await api.post("/api/v1/flows/execute", {"flow_id": flow_id, "payload": {}})
    assert refused.status_code == 400
    assert [e["field"] for e in refused.json()["errors"]] == ["payload.order_id", "payload.amount"]


async def test_a_rerun_with_a_new_payload_meets_the_schema_too(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    run_id = await api.execute(flow_id, {"order_id": "ord_1", "amount": 1})
    await api.wait(run_id)
    path = f"/api/v1/flows/runs/{run_id}/rerun"
    r = await api.post(path, {"payload": {"order_id": "ord_1", "amount": 0}})
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "payload.amount", r.text
    assert await _runs(api) == 1
    again = await api.post(path, {})  # its own payload met the schema
    assert again.status_code == 202, again.text


async def test_a_schema_that_is_no_json_schema_is_refused_naming_the_place(api: Api) -> None:
    cases = {
        "definition.input_schema.properties.amount.type": {"properties": {"amount": {"type": "money"}}},
        "definition.input_schema.properties.id.pattern": {"properties": {"id": {"type": "string", "pattern": "(ord_"}}},
        "definition.input_schema.properties.who.$ref": {"properties": {"who": {"$ref": "https://example.com/person.json"}}},
        "definition.input_schema": ["not", "an", "object"],
        "definition.input_schema.properties.ref.pattern": {"properties": {"ref": {"type": "string", "pattern": "^(?!tmp_)"}}},
    }  # fmt: skip
    for field, schema in cases.items():
        r = await api.post("/api/v1/flows", {**FLOW, "input_schema": schema})
        assert r.status_code == 400, (schema, r.text)
        body = r.json()
        assert body["code"] == "invalid_definition", body
        assert [e["field"] for e in body["errors"]] == [field], body
    assert (await api.get("/api/v1/flows")).json()["data"] == []
    huge = {
        "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(700)}
    }
    r = await api.post("/api/v1/flows", {**FLOW, "input_schema": huge})
    assert r.status_code == 400 and "more than 65,536" in r.json()["error"], r.text


async def test_a_catastrophic_pattern_costs_the_api_nothing(api: Api) -> None:
    """``^(a+)+$`` against 40 a's and a '!' takes Python's re about 2**40 steps; the payload
    check answers at once (its regular expressions run in linear time)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    flow_id = await api.create_flow({**FLOW, "input_schema": schema})
    r = await api.post(
        "/api/v1/flows/execute", {"flow_id": flow_id, "payload": {"s": "a" * 40 + "!"}}
    )  # with Python's re this would not answer within the test run's timeout
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "payload.s", r.text


async def test_a_hook_arrival_that_fails_the_schema_is_refused_with_its_reason(api: Api) -> None:
    flow_id = await api.create_flow(FLOW)
    r = await api.post("/api/v1/hooks", {"flow_id": flow_id})
    assert r.status_code == 201, r.text
    url = "/api/v1/hooks/" + r.json()["id"]
    refused = await api.client.post(url, json={"order_id": "ord_1"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["errors"] == [
        {"field": "payload.amount", "message": '"amount" is a required property'}
    ]
    assert await _runs(api) == 0
    events = (await api.get("/api/v1/events")).json()["data"]
    [refusal] = [e for e in events if e["event"].startswith("webhook.")]  # why, not what
    assert refusal["event"] == "webhook.delivered"
    assert refusal["body"]["payload"]["accepted"] is False
    assert refusal["body"]["payload"]["reason"] == (
        "payload does not match the flow's input_schema (payload.amount)"
    )
    accepted = await api.client.post(url, json={"order_id": "ord_1", "amount": 3})
    assert accepted.status_code == 202, accepted.text


async def test_a_sub_flows_payload_meets_the_called_flows_schema(api: Api) -> None:
    """A ``flow`` step whose payload fails the called flow's ``input_schema`` fails with
    error type ``schema`` naming the field, and starts no child; one that meets it runs."""
    child = await api.create_flow(FLOW)
    parent = await api.create_flow({"name": "Orders", "steps": [
        {"id": "refund", "type": "flow", "flow_id": child,
         "payload": {"order_id": "{{ payload.order }}", "amount": "{{ payload.amount }}"}}]})  # fmt: skip
    failed = await api.wait(await api.execute(parent, {"order": "ord_1", "amount": -1}))
    assert failed["status"] == "failed" and failed["error"]["type"] == "schema", failed
    assert "payload.amount" in failed["error"]["message"]
    assert "'Refund'" in failed["error"]["message"]  # the called flow, by name
    children = (await api.get("/api/v1/flows/runs", params={"flow_id": child})).json()["data"]
    assert children == []
    done = await api.wait(await api.execute(parent, {"order": "ord_1", "amount": 5}))
    assert done["status"] == "completed", done
