"""The OpenAPI document says what the API does (issue 21): the flow definition's schema, error
statuses with their body, links, content types, the README's examples; and a 405 lists every
method of its path. tests/e2e/test_openapi_contract.py checks the whole with schemathesis."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from flowhook.api.openapi import EXAMPLES
from flowhook.app import create_app
from flowhook.config import Settings
from flowhook.definition import FLOW_SCHEMA, STEP_TYPES
from tests.conftest import Api

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]


def _component_validator(document: dict[str, Any], name: str) -> jsonschema.Validator:
    root = {"components": document["components"], "$ref": f"#/components/schemas/{name}"}
    registry: Registry[Any] = Registry().with_resource(
        "urn:openapi", Resource.from_contents(root, default_specification=DRAFT202012)
    )
    return jsonschema.Draft202012Validator({"$ref": "urn:openapi"}, registry=registry)


_STEPS: list[dict[str, Any]] = [
    {"id": "t", "type": "transform", "output": {"a": 1}},
    {"id": "c", "type": "condition", "if": "{{ true }}", "then": "end"},
    {"id": "f", "type": "fail", "message": "no"},
    {"id": "h", "type": "http", "request": {"url": "https://example.com", "method": "GET"}},
    {"id": "d", "type": "delay", "seconds": 1},
    {"id": "p", "type": "python", "function": "f", "input": {}},
    {"id": "w", "type": "wait", "signal": "paid", "on_timeout": "continue"},
    {"id": "a", "type": "approval", "message": "ok?", "on_reject": "continue"},
    {"id": "par", "type": "parallel", "branches": {"x": [{"id": "x1", "type": "fail"}]}},
    {"id": "m", "type": "map", "items": [1], "steps": [{"id": "m1", "type": "fail"}]},
    {"id": "sub", "type": "flow", "flow_id": "wf_01jd7w2k3m4n5p6q7r8s9t0v1w"},
]


def _definitions() -> list[Any]:
    """Valid and invalid definitions, one change away from valid ones."""
    good = [{"name": "n", "steps": [step]} for step in _STEPS]
    bad: list[Any] = [{}, {"name": "n"}, {"name": "", "steps": [_STEPS[0]]}, []]
    for step in _STEPS:
        bad.append({"name": "n", "steps": [{**step, "type": "nope"}]})
        bad.append({"name": "n", "steps": [{**step, "unknown": 1}]})
        bad.append({"name": "n", "steps": [{k: v for k, v in step.items() if k != "id"}]})
        bad.append({"name": "n", "steps": [{**step, "id": "1bad"}]})
    bad.append({"name": "n", "steps": [{"id": "h", "type": "http", "request": {"url": ""}}]})
    bad.append({"name": "n", "steps": [{"id": "w", "type": "wait", "signal": ""}]})
    return good + bad


def test_the_flow_definition_component_is_the_served_schema(document: dict[str, Any]) -> None:
    served = jsonschema.Draft202012Validator(FLOW_SCHEMA)
    component = _component_validator(document, "FlowDefinition")
    definitions = _definitions()
    assert any(served.is_valid(d) for d in definitions)
    assert not all(served.is_valid(d) for d in definitions)
    for definition in definitions:
        assert component.is_valid(definition) == served.is_valid(definition), definition
    steps = document["components"]["schemas"]["FlowStep"]["discriminator"]["mapping"]
    assert set(steps) == set(STEP_TYPES)  # a new step type reaches the document by itself


def test_flow_bodies_and_records_use_the_flow_definition(document: dict[str, Any]) -> None:
    ref = {"$ref": "#/components/schemas/FlowDefinition"}
    for method, path in [("post", "/api/v1/flows"), ("put", "/api/v1/flows/{flow_id}")]:
        body = document["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["schema"] == ref
    assert document["components"]["schemas"]["FlowRecord"]["properties"]["definition"] == ref


def test_every_error_answer_is_documented_with_the_error_body(document: dict[str, Any]) -> None:
    error = {"$ref": "#/components/schemas/ErrorBody"}
    for method, path, op in _operations(document):
        errors = {int(s): r for s, r in op["responses"].items() if int(s) >= 400}
        assert 400 in errors, (method, path)
        assert 422 not in errors, (method, path)
        for status, response in errors.items():
            assert response["content"]["application/json"]["schema"] == error, (path, status)
        if op.get("security"):
            assert {401, 429, 503} <= set(errors), (method, path)
        if method in ("post", "put", "patch"):
            assert 413 in errors, (method, path)
        else:
            assert not {413, 415} & set(errors), (method, path)
    assert set(document["components"]["schemas"]["ErrorBody"]["required"]) == {"error", "code"}


def test_fields_the_api_checks_are_constrained(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["ScheduleCreate"]["properties"]["cron"]["minLength"] == 1
    assert schemas["EndpointCreate"]["properties"]["url"]["minLength"] == 1
    assert schemas["EndpointCreate"]["properties"]["events"]["items"]["enum"]
    assert schemas["ExecuteRequest"]["properties"]["trigger"]["enum"] == ["api"]
    execute = document["paths"]["/api/v1/flows/execute"]["post"]
    key = next(p for p in execute["parameters"] if p["name"] == "idempotency-key")
    assert (key["schema"]["minLength"], key["schema"]["maxLength"]) == (1, 255)
    runs = document["paths"]["/api/v1/flows/runs"]["get"]
    cursor = next(p for p in runs["parameters"] if p["name"] == "cursor")["schema"]
    assert re.fullmatch(cursor["pattern"], "run_01jd7w2k3m4n5p6q7r8s9t0v1w")
    assert re.fullmatch(cursor["pattern"], "")
    assert not re.fullmatch(cursor["pattern"], "wf_01jd7w2k3m4n5p6q7r8s9t0v1w")


def test_each_create_links_to_what_takes_its_id(document: dict[str, Any]) -> None:
    ids = {op["operationId"] for _m, _p, op in _operations(document)}
    creates = {
        ("post", "/api/v1/flows"): "201",
        ("post", "/api/v1/flows/execute"): "202",
        ("post", "/api/v1/webhooks/endpoints"): "201",
        ("post", "/api/v1/hooks"): "201",
        ("post", "/api/v1/schedules"): "201",
        ("post", "/api/v1/secrets"): "201",
    }
    linked: set[str] = set()
    for (method, path), status in creates.items():
        links = document["paths"][path][method]["responses"][status]["links"]
        assert links, path
        for link in links.values():
            assert link["operationId"] in ids
    for _m, _p, op in _operations(document):
        for response in op["responses"].values():
            linked |= {link["operationId"] for link in response.get("links", {}).values()}
    with_ids = {
        op["operationId"]
        for _m, path, op in _operations(document)
        if "{" in path and not path.endswith(("/stream", "/rotate"))
    }
    # every id-taking operation is reachable; but a hook's rotation, which moves the hook to
    # a new id (a tool following links would take the old one for lost)
    assert with_ids <= linked, sorted(with_ids - linked)


def test_the_flow_schema_is_documented_as_schema_json(document: dict[str, Any]) -> None:
    content = document["paths"]["/api/v1/schemas/flow.json"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["application/schema+json"]


def test_the_docs_page_shows_the_readme_examples(document: dict[str, Any]) -> None:
    """The examples are the request bodies the README's tour and the docs pages send with
    ``curl -d``."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    bodies = [
        json.loads(m.replace("\n", " "))
        for m in re.findall(r"-d '(\{.*?\})'", text, flags=re.DOTALL)
    ]
    shown = 0
    for (method, path), value in EXAMPLES.items():
        media = document["paths"]["/api/v1" + path][method]["requestBody"]["content"]
        assert media["application/json"]["examples"]["readme"]["value"] == value
        if any(_same_shape(value, body) for body in bodies):
            shown += 1
    assert shown >= 4  # execute, flow, endpoint, signal, hook: as the README and docs write them


def _same_shape(example: Any, readme: Any) -> bool:
    """Equal, but for the README's elided ids (``wf_…``)."""
    if isinstance(readme, str) and readme.endswith("…"):
        return isinstance(example, str) and example.startswith(readme[:-1])
    if isinstance(example, dict) and isinstance(readme, dict):
        return example.keys() == readme.keys() and all(
            _same_shape(example[k], readme[k]) for k in example
        )
    if isinstance(example, list) and isinstance(readme, list):
        return len(example) == len(readme) and all(map(_same_shape, example, readme))
    return bool(example == readme)


async def test_405_lists_every_method_of_the_path(api: Api) -> None:
    cases = [
        ("OPTIONS", "/api/v1/flows", "GET, POST"),
        ("PATCH", "/api/v1/flows/wf_01jd7w2k3m4n5p6q7r8s9t0v1w", "GET, PUT, DELETE"),
        ("OPTIONS", "/api/v1/webhooks/endpoints/ep_x", "GET, PATCH, DELETE"),
        # a fixed path keeps its own methods, though a templated path would match it
        ("PUT", "/api/v1/flows/runs", "GET"),
        ("GET", "/api/v1/flows/execute", "POST"),
        ("DELETE", "/api/v1/events/stream", "GET"),
    ]
    for method, path, allow in cases:
        r = await api.client.request(method, path, headers=api.auth())
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers["allow"] == allow, (method, path)
        assert r.json()["code"] == "method_not_allowed"
    # the templated routes still take what is theirs
    r = await api.get("/api/v1/flows/wf_01jd7w2k3m4n5p6q7r8s9t0v1w")
    assert r.status_code == 404
    r = await api.get("/api/v1/flows/runs")
    assert r.status_code == 200


async def test_the_served_schema_has_its_media_type(api: Api) -> None:
    r = await api.client.get("/api/v1/schemas/flow.json")
    assert r.headers["content-type"] == "application/schema+json"
    assert r.json() == copy.deepcopy(FLOW_SCHEMA)
