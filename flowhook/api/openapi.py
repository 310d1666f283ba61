"""The OpenAPI document, completed so it tells what the API does: the flow definition's JSON
Schema in its components, the cursors' format, every error status each operation can answer
(each with the ``{"error", "code"}`` body), links from each create to the operations that take
the id it returns, and the README's examples.

It is built once, the first time it is asked for, and kept (FastAPI's own caching): no
request but ``GET /api/v1/openapi.json`` and the docs page ever touches this module.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI

from flowhook.api.models import ID_SUFFIX
from flowhook.definition import FLOW_SCHEMA, STEP_TYPES
from flowhook.store.models import DeliveryStatus, RunStatus

__all__ = ["install_openapi", "flow_components", "complete"]

API = "/api/v1"
_REF = "#/components/schemas/"

_RULES = (
    "Beyond this schema, the API refuses with 400 (naming the field): a step id used twice in "
    "the flow (nested steps included); a condition's `then`/`else` that is not continue, end, "
    "fail or a later step of the same list; an expression that does not compile, or that "
    "names `steps.<id>` of no step; an `http` step's literal URL that is not http(s) or is "
    "a private address (unless FLOWHOOK_ALLOW_PRIVATE_TARGETS), or its literal method or "
    "headers that cannot be sent; a `python` step's function no plugin registered."
)


def _step_name(kind: str) -> str:
    return f"FlowStep_{kind}"


def _rewrite_refs(node: Any) -> Any:
    """The flow schema with its ``#/$defs/…`` references pointed into the components."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                name = value.removeprefix("#/$defs/")
                out[key] = _REF + ("FlowStep" if name == "step" else _step_name(name))
            else:
                out[key] = _rewrite_refs(value)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


def flow_components() -> dict[str, Any]:
    """``FlowDefinition``, ``FlowStep`` (one of the step types, told apart by ``type``) and a
    ``FlowStep_<type>`` per step type, from the served JSON Schema (``FLOW_SCHEMA``): the
    same rules, with the step chosen by a discriminator instead of ``if``/``then`` (each
    step type's schema fixes ``type`` to its own name, so exactly one matches either way)."""
    top = {k: v for k, v in FLOW_SCHEMA.items() if k not in ("$schema", "$id", "$defs")}
    top["description"] = (
        "A flow definition; the same JSON Schema is served at /api/v1/schemas/flow.json. " + _RULES
    )
    components: dict[str, Any] = {"FlowDefinition": _rewrite_refs(top)}
    components["FlowStep"] = {
        "title": "FlowStep",
        "description": "One step: its `type` says which of the step types it is.",
        "oneOf": [{"$ref": _REF + _step_name(kind)} for kind in STEP_TYPES],
        "discriminator": {
            "propertyName": "type",
            "mapping": {kind: _REF + _step_name(kind) for kind in STEP_TYPES},
        },
    }
    for kind in STEP_TYPES:
        schema = _rewrite_refs(copy.deepcopy(FLOW_SCHEMA["$defs"][kind]))
        schema["title"] = _step_name(kind)
        components[_step_name(kind)] = schema
    return components


# --- error statuses -------------------------------------------------------------------------

_ERROR_TEXT = {
    400: "Invalid request: the message names the field (`invalid_request`, `malformed_json`, "
    "or a code of its own).",
    401: "Missing, unknown or revoked API key (`unauthenticated`).",
    404: "Unknown, or not of this key's workspace and mode (`not_found`).",
    409: "Conflicts with the resource's state, or an Idempotency-Key used with another body.",
    413: "Body over FLOWHOOK_MAX_REQUEST_BYTES (`payload_too_large`).",
    415: "A body that is not JSON (`unsupported_media_type`).",
    429: "Too many requests (`rate_limited`); `Retry-After` says when to try again.",
    503: "The store cannot be reached (`store_unavailable`); `Retry-After` says when to retry.",
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}
_PUBLIC_HOOK = f"{API}/hooks/{{hook_id}}"
_NO_STORE = {f"{API}/schemas/flow.json", "/healthz"}


def _error_statuses(path: str, method: str, op: dict[str, Any]) -> set[int]:
    """Every error status the operation can answer: those its route declares, and those the
    middleware and the shared dependencies give any request of its kind."""
    declared = {int(s) for s in op.get("responses", {}) if s.isdigit() and int(s) >= 400}
    statuses = {400} | declared  # a NUL in the URL is refused everywhere
    if path not in _NO_STORE:
        statuses.add(503)
    if op.get("security"):
        statuses |= {401, 429}  # FLOWHOOK_RATE_LIMIT applies to every key
    if method in ("post", "put", "patch"):
        statuses.add(413)
        if path != _PUBLIC_HOOK:  # an inbound hook takes any body
            statuses.add(415)
    else:
        statuses -= {413, 415}  # only bodies of POST, PUT and PATCH are read
    return statuses - {422}


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _ERROR_TEXT.get(status, "Error."),
        "content": {"application/json": {"schema": {"$ref": _REF + "ErrorBody"}}},
    }
    if status in (429, 503):
        response["headers"] = copy.deepcopy(_RETRY_AFTER)
    return response


# --- parameters -----------------------------------------------------------------------------

_CURSOR_PREFIX = {
    f"{API}/flows": "wf",
    f"{API}/flows/runs": "run",
    f"{API}/webhooks/endpoints": "ep",
    f"{API}/webhooks/deliveries": "dlv",
    f"{API}/events": "evt",
    f"{API}/flows/runs/{{run_id}}/events": "evt",
    f"{API}/hooks": "hk",
    f"{API}/schedules": "sch",
}
_STATUS_FILTER = {
    f"{API}/flows/runs": [s.value for s in RunStatus],
    f"{API}/webhooks/deliveries": [s.value for s in DeliveryStatus],
}


def _cursor_schema(prefix: str) -> dict[str, Any]:
    return {
        "type": "string",
        "pattern": f"^({prefix}_{ID_SUFFIX})?$",
        "description": f"`next_cursor` of the previous page ({prefix}_…); empty or absent: the "
        "first page.",
    }


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without FastAPI's ``anyOf: [X, null]`` for an optional one: a
    query parameter or header is absent or a string, never null."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or {"type": "null"} not in options or len(options) != 2:
        return schema
    (kept,) = [o for o in options if o != {"type": "null"}]
    rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
    return {**kept, **rest}


def _fix_parameters(path: str, op: dict[str, Any]) -> None:
    for param in op.get("parameters", []):
        name, where = param.get("name"), param.get("in")
        if "schema" in param:
            param["schema"] = _not_null(param["schema"])
        if where == "query" and name == "cursor" and path in _CURSOR_PREFIX:
            param["schema"] = _cursor_schema(_CURSOR_PREFIX[path])
        elif where == "query" and name == "status" and path in _STATUS_FILTER:
            param["schema"] = {"type": "string", "enum": _STATUS_FILTER[path]}


# --- links ----------------------------------------------------------------------------------

_RUN_ACTIONS = [
    ("get", "/flows/runs/{run_id}"),
    ("post", "/flows/runs/{run_id}/cancel"),
    ("post", "/flows/runs/{run_id}/rerun"),
    ("get", "/flows/runs/{run_id}/events"),
    ("post", "/flows/runs/{run_id}/signal"),
    ("get", "/flows/runs/{run_id}/stream"),
]
_FLOW_ACTIONS = [
    ("get", "/flows/{flow_id}"),
    ("put", "/flows/{flow_id}"),
    ("delete", "/flows/{flow_id}"),
    ("get", "/flows/{flow_id}/versions"),
    ("post", "/flows/{flow_id}/pause"),
    ("post", "/flows/{flow_id}/resume"),
]
_ENDPOINT_ACTIONS = [
    ("get", "/webhooks/endpoints/{endpoint_id}"),
    ("patch", "/webhooks/endpoints/{endpoint_id}"),
    ("delete", "/webhooks/endpoints/{endpoint_id}"),
    ("get", "/webhooks/endpoints/{endpoint_id}/secret"),
    ("post", "/webhooks/endpoints/{endpoint_id}/pause"),
    ("post", "/webhooks/endpoints/{endpoint_id}/resume"),
    ("post", "/webhooks/endpoints/{endpoint_id}/rotate-secret"),
    ("post", "/webhooks/endpoints/{endpoint_id}/promote-secret"),
    ("post", "/webhooks/endpoints/{endpoint_id}/test"),
    ("post", "/webhooks/endpoints/{endpoint_id}/recover"),
]
_HOOK_ACTIONS = [
    ("get", "/hooks/{hook_id}"),
    ("delete", "/hooks/{hook_id}"),
    ("post", "/hooks/{hook_id}"),
]
# Rotating moves a hook to a new id (its URL is its secret): the old id is gone as if deleted,
# which link-following tools expect only of a DELETE (schemathesis then reports the hook it
# created as lost). So no link leads to the rotation; its answer links to the new id.
_SCHEDULE_ACTIONS = [
    ("get", "/schedules/{schedule_id}"),
    ("patch", "/schedules/{schedule_id}"),
    ("delete", "/schedules/{schedule_id}"),
]
_DELIVERY_ACTIONS = [
    ("get", "/webhooks/deliveries/{delivery_id}"),
    ("post", "/webhooks/deliveries/{delivery_id}/replay"),
]
_EVENT_ACTIONS = [("get", "/events/{event_id}")]
_SECRET_ACTIONS = [("put", "/secrets/{name}"), ("delete", "/secrets/{name}")]
_TASK_ACTIONS = [
    ("post", "/tasks/{task_id}/heartbeat"),
    ("post", "/tasks/{task_id}/complete"),
    ("post", "/tasks/{task_id}/fail"),
]

# (operation, status) → [(target operation, parameter, runtime expression, request body)]
_Link = tuple[tuple[str, str], str, str, dict[str, str] | None]


def _to(actions: list[tuple[str, str]], param: str, expr: str) -> list[_Link]:
    return [(action, param, expr, None) for action in actions]


_LINKS: dict[tuple[str, str, str], list[_Link]] = {
    ("post", "/flows", "201"): [
        *_to(_FLOW_ACTIONS, "flow_id", "$response.body#/flow_id"),
        (("post", "/flows/execute"), "", "", {"flow_id": "$response.body#/flow_id"}),
        (("post", "/hooks"), "", "", {"flow_id": "$response.body#/flow_id"}),
        (("post", "/schedules"), "", "", {"flow_id": "$response.body#/flow_id"}),
    ],
    ("put", "/flows/{flow_id}", "200"): _to(_FLOW_ACTIONS, "flow_id", "$response.body#/flow_id"),
    ("get", "/flows", "200"): _to(_FLOW_ACTIONS, "flow_id", "$response.body#/data/0/flow_id"),
    ("post", "/flows/execute", "202"): _to(_RUN_ACTIONS, "run_id", "$response.body#/run_id"),
    ("post", "/flows/runs/{run_id}/rerun", "202"): _to(
        _RUN_ACTIONS, "run_id", "$response.body#/run_id"
    ),
    ("get", "/flows/runs", "200"): _to(_RUN_ACTIONS, "run_id", "$response.body#/data/0/run_id"),
    ("post", "/webhooks/endpoints", "201"): [
        *_to(_ENDPOINT_ACTIONS, "endpoint_id", "$response.body#/id"),
        (("get", "/webhooks/deliveries"), "endpoint_id", "$response.body#/id", None),
    ],
    ("get", "/webhooks/endpoints", "200"): _to(
        _ENDPOINT_ACTIONS, "endpoint_id", "$response.body#/data/0/id"
    ),
    ("post", "/webhooks/endpoints/{endpoint_id}/test", "202"): [
        *_to(_EVENT_ACTIONS, "event_id", "$response.body#/id"),
        (("get", "/webhooks/deliveries"), "run_id", "$response.body#/run_id", None),
    ],
    ("post", "/webhooks/endpoints/{endpoint_id}/recover", "202"): _to(
        _DELIVERY_ACTIONS, "delivery_id", "$response.body#/replayed/0/id"
    ),
    ("get", "/webhooks/deliveries", "200"): _to(
        _DELIVERY_ACTIONS, "delivery_id", "$response.body#/data/0/id"
    ),
    ("post", "/webhooks/deliveries/{delivery_id}/replay", "202"): _to(
        _DELIVERY_ACTIONS, "delivery_id", "$response.body#/id"
    ),
    ("get", "/events", "200"): _to(_EVENT_ACTIONS, "event_id", "$response.body#/data/0/id"),
    ("post", "/hooks", "201"): _to(_HOOK_ACTIONS, "hook_id", "$response.body#/id"),
    ("post", "/hooks/{hook_id}/rotate", "200"): _to(_HOOK_ACTIONS, "hook_id", "$response.body#/id"),
    ("get", "/hooks", "200"): _to(_HOOK_ACTIONS, "hook_id", "$response.body#/data/0/id"),
    ("post", "/hooks/{hook_id}", "202"): _to(_RUN_ACTIONS, "run_id", "$response.body#/run_id"),
    ("post", "/schedules", "201"): _to(_SCHEDULE_ACTIONS, "schedule_id", "$response.body#/id"),
    ("post", "/tasks/claim", "200"): _to(
        _TASK_ACTIONS, "task_id", "$response.body#/tasks/0/task_id"
    ),
    ("post", "/tasks/batch", "200"): _to(
        _TASK_ACTIONS, "task_id", "$response.body#/tasks/0/task_id"
    ),
    ("get", "/schedules", "200"): _to(
        _SCHEDULE_ACTIONS, "schedule_id", "$response.body#/data/0/id"
    ),
    ("post", "/secrets", "201"): _to(_SECRET_ACTIONS, "name", "$response.body#/name"),
    ("get", "/secrets", "200"): _to(_SECRET_ACTIONS, "name", "$response.body#/data/0/name"),
}
# A run's approval steps are decided by the step ids its record lists.
for _action in ("approve", "reject"):
    _LINKS.setdefault(("get", "/flows/runs/{run_id}", "200"), []).append(
        (("post", f"/flows/runs/{{run_id}}/steps/{{step_id}}/{_action}"), "", "", None)
    )


def _link_name(method: str, path: str) -> str:
    words = [p.strip("{}") for p in path.split("/") if p]
    return "".join(w.title().replace("_", "").replace("-", "") for w in [method, *words])


def _add_links(paths: dict[str, Any]) -> None:
    for (method, path, status), links in _LINKS.items():
        response = paths[API + path][method]["responses"].setdefault(
            status, {"description": "Successful Response"}
        )
        found = response.setdefault("links", {})
        for (target_method, target_path), param, expr, body in links:
            target = paths[API + target_path][target_method]
            link: dict[str, Any] = {"operationId": target["operationId"]}
            if target_path.endswith(("/approve", "/reject")):
                link["parameters"] = {
                    "run_id": "$response.body#/run_id",
                    "step_id": "$response.body#/steps/0/id",
                }
            elif param:
                where = "query" if "{" + param + "}" not in target_path else "path"
                link["parameters"] = {param if where == "path" else f"query.{param}": expr}
            if body is not None:
                link["requestBody"] = body
            found[_link_name(target_method, target_path)] = link


# --- examples (the README's) ----------------------------------------------------------------

_FLOW_EXAMPLE = {
    "name": "Process order",
    "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.amount > 0 }}", "else": "fail"},
        {"id": "price", "type": "transform", "output": {"total": "{{ payload.amount * 1.2 }}"}},
    ],
    "output": {"order_id": "{{ payload.order_id }}", "total": "{{ steps.price.output.total }}"},
}
EXAMPLES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/flows"): _FLOW_EXAMPLE,
    ("put", "/flows/{flow_id}"): _FLOW_EXAMPLE,
    ("post", "/flows/validate"): _FLOW_EXAMPLE,
    ("post", "/flows/execute"): {
        "flow_id": "wf_01jd7w2k3m4n5p6q7r8s9t0v1w",
        "trigger": "api",
        "payload": {"order_id": "ord_123", "amount": 42},
    },
    ("post", "/webhooks/endpoints"): {
        "url": "https://example.com/flowhook",
        "events": ["flow.completed", "flow.failed"],
    },
    ("post", "/hooks"): {"signal": "payment.captured", "verify": {"type": "standard"}},
    ("post", "/schedules"): {
        "flow_id": "wf_01jd7w2k3m4n5p6q7r8s9t0v1w",
        "cron": "0 9 * * 1-5",
        "timezone": "Europe/Berlin",
        "payload": {},
    },
    ("post", "/signals"): {
        "name": "payment.captured",
        "data": {"order_id": "ord_123", "amount": 50.4},
        "id": "psp_evt_881",
    },
}
"""Request bodies the README shows, shown by the docs page (``/api/v1/docs``) as examples."""


def _add_examples(paths: dict[str, Any]) -> None:
    for (method, path), value in EXAMPLES.items():
        body = paths[API + path][method].get("requestBody")
        if body is None:
            continue
        media = body["content"]["application/json"]
        media.pop("example", None)
        media["examples"] = {"readme": {"summary": "As in the README", "value": value}}
        media["schema"].pop("examples", None)


# --- the whole ------------------------------------------------------------------------------

_FLOW_BODIES = [("post", "/flows"), ("put", "/flows/{flow_id}"), ("post", "/flows/validate")]


def complete(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (FastAPI's document) completed in place, and returned."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(flow_components())
    if "FlowRecord" in schemas:
        schemas["FlowRecord"]["properties"]["definition"] = {"$ref": _REF + "FlowDefinition"}
    paths: dict[str, Any] = doc["paths"]
    for method, path in _FLOW_BODIES:
        media = paths[API + path][method]["requestBody"]["content"]["application/json"]
        media["schema"] = {"$ref": _REF + "FlowDefinition"}
    for path, item in paths.items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch"):
                continue
            _fix_parameters(path, op)
            statuses = _error_statuses(path, method, op)
            responses = op.setdefault("responses", {})
            for code in [c for c in responses if c.isdigit() and int(c) >= 400]:
                del responses[code]  # 422 is FastAPI's own: validation errors answer 400 here
            for status in sorted(statuses):
                responses[str(status)] = _error_response(status)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    _add_links(paths)
    _add_examples(paths)
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve the completed document (built on first use, then kept)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
