"""The JSON Schema of a flow definition, served at ``/api/v1/schemas/flow.json``."""

from __future__ import annotations

from typing import Any

__all__ = ["FLOW_SCHEMA", "STEP_TYPES", "STEP_ID_PATTERN", "NESTING"]

STEP_ID_PATTERN = "^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
NESTING = frozenset({"parallel", "map", "flow"})
"""Steps that run other steps (their own, or a whole flow): retried by their inner steps'
``retry``, never as a whole."""
_NESTED_STEPS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 200,
    "items": {"$ref": "#/$defs/step"},
}
_EXPR = {"type": "string", "minLength": 1}
_ACTION = {
    "type": "string",
    "minLength": 1,
    "description": "continue, end, fail, or the id of a later step to skip to",
}

_COMMON: dict[str, Any] = {
    "id": {"type": "string", "pattern": STEP_ID_PATTERN, "description": "Unique in the flow."},
    "type": {"type": "string"},
    "description": {"type": "string", "maxLength": 1000},
    "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
    "retry": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
            "backoff_seconds": {
                "oneOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1},
                ]
            },
        },
    },
}

_STEPS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "transform": (["output"], {"output": {"type": "object"}}),
    "condition": (["if"], {"if": _EXPR, "then": _ACTION, "else": _ACTION}),
    "fail": ([], {"message": {"type": "string"}}),
    "http": (
        ["request"],
        {
            "request": {
                "type": "object",
                "required": ["url"],
                "additionalProperties": False,
                "properties": {
                    "method": {"type": "string"},
                    "url": {"type": "string", "minLength": 1},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                    "query": {"type": "object"},
                    "json": {},
                    "body": {"type": "string"},
                },
            },
            "accept_status": {"type": "array", "items": {"type": "integer"}},
        },
    ),
    "delay": ([], {"seconds": {"type": ["number", "string"]}, "until": {"type": "string"}}),
    "python": (["function"], {"function": {"type": "string", "minLength": 1}, "input": {}}),
    "wait": (
        ["signal"],
        {
            "signal": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "description": "The name of the signal that resumes the run.",
            },
            "match": {
                "type": "object",
                "description": "Fields the signal's data must hold with these values (templated).",
            },
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 2592000,
                "description": "How long to wait; default: until the run's own timeout.",
            },
            "on_timeout": {"enum": ["fail", "continue"]},
        },
    ),
    "approval": (
        [],
        {
            "message": {
                "type": "string",
                "maxLength": 2000,
                "description": "What the person is asked (templated).",
            },
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 2592000,
                "description": "How long the links and the request last; default: until "
                "the run's own timeout.",
            },
            "on_timeout": {"enum": ["fail", "approve", "reject"]},
            "on_reject": {"enum": ["fail", "continue"]},
        },
    ),
    "parallel": (
        ["branches"],
        {
            "branches": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 50,
                "propertyNames": {"pattern": STEP_ID_PATTERN},
                "additionalProperties": _NESTED_STEPS,
                "description": "Named branches, each a list of steps; they run side by side. "
                "Output: each branch's last output, by name.",
            },
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 2592000,
                "description": "How long the branches may take; default: the run's own timeout.",
            },
        },
    ),
    "map": (
        ["items", "steps"],
        {
            "items": {
                "type": ["string", "array"],
                "minLength": 1,
                "description": "The list to map over: an expression or a literal list. Its "
                "steps see `item` and `index`. Output: each item's last output, in order.",
            },
            "concurrency": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "description": "How many items run at once (default 10).",
            },
            "steps": _NESTED_STEPS,
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 2592000,
                "description": "How long the items may take; default: the run's own timeout.",
            },
        },
    ),
    "flow": (
        ["flow_id"],
        {
            "flow_id": {
                "type": "string",
                "pattern": "^wf_[0-9a-hjkmnp-tv-z]{26}$",
                "description": "A flow of the same workspace and mode, run as a child run.",
            },
            "payload": {"type": "object", "description": "The child run's payload (templated)."},
            "wait": {
                "type": "boolean",
                "description": "Wait for the child run and take its output (default); "
                'false: go on at once with {"run_id"}.',
            },
        },
    ),
    "task": (
        ["task"],
        {
            "task": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_.:-]{1,200}$",
                "description": "The name of the task, as a worker registers its function "
                "(e.g. payments.charge): a worker of the same workspace and mode runs it.",
            },
            "input": {"description": "What the worker's function is given (templated)."},
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 86400,
                "description": "How long one attempt may take (error type timeout).",
            },
            "heartbeat_seconds": {
                "type": "number",
                "minimum": 1,
                "maximum": 3600,
                "description": "An attempt neither heartbeated nor finished within this is "
                "taken back and offered again as the next attempt (default 30).",
            },
        },
    ),
}

STEP_TYPES = tuple(_STEPS)


def _step_schema(kind: str) -> dict[str, Any]:
    required, own = _STEPS[kind]
    common = {k: v for k, v in _COMMON.items() if not (kind in NESTING and k == "retry")}
    return {
        "type": "object",
        "required": ["id", "type", *required],
        "additionalProperties": False,
        "properties": {**common, **own, "type": {"const": kind}},
    }


RESERVED_OUTPUT_FIELDS = {
    "status": "the run's status",
    "steps_executed": "how many steps ran",
    "duration_ms": "how long the run took",
}
"""The fields SPEC §6 fixes in ``flow.completed``'s payload, beside the flow's output: an
output field of one of these names would be overwritten there, so a definition may not use
them."""

_KEY: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 2000,
    "description": "An expression read when the run is accepted, e.g. {{ payload.customer_id }}",
}

FLOW_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "/api/v1/schemas/flow.json",
    "title": "Flowhook flow definition",
    "type": "object",
    "required": ["name", "steps"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "slug": {
            "type": "string",
            "pattern": "^[a-z0-9-]{1,64}$",
            "description": "The flow's own short name, unique in its workspace and mode: what "
            "`flowhook flows apply` and `GET /api/v1/flows?slug=` find it by.",
        },
        "description": {"type": "string", "maxLength": 2000},
        "input_schema": {
            "type": "object",
            "description": "A JSON Schema (draft 2020-12) every run's payload must meet: an "
            "execute whose payload fails it answers 400 naming the field, and nothing is "
            "stored. The flow's page builds its start form from it.",
        },
        "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 2592000},
        "concurrency": {
            "description": "At most this many runs are running at once (per key value).",
            "oneOf": [
                {"type": "integer", "minimum": 1},
                {
                    "type": "object",
                    "required": ["limit"],
                    "additionalProperties": False,
                    "properties": {"limit": {"type": "integer", "minimum": 1}, "key": _KEY},
                },
            ],
        },
        "throttle": {
            "description": "At most `limit` runs start per `period_seconds` (per key value).",
            "type": "object",
            "required": ["limit", "period_seconds"],
            "additionalProperties": False,
            "properties": {
                "limit": {"type": "integer", "minimum": 1, "maximum": 100000},
                "period_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                "key": _KEY,
            },
        },
        "debounce": {
            "description": "Executes within `period_seconds` of each other (per key value) "
            "collapse into one run, started with the last payload.",
            "type": "object",
            "required": ["period_seconds"],
            "additionalProperties": False,
            "properties": {
                "period_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                "max_wait_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 604800},
                "key": _KEY,
            },
        },
        "priority": {
            "description": "-100 to 100 (default 0), or an expression giving one: among due "
            "runs the higher priority is claimed first.",
            "oneOf": [
                {"type": "integer", "minimum": -100, "maximum": 100},
                {"type": "string", "minLength": 1, "maxLength": 2000},
            ],
        },
        "output": {
            "description": "The run's output (its values may be expressions). Not "
            "`status`, `steps_executed` or `duration_ms`: flow.completed sets those itself "
            "beside the output's fields.",
            "type": "object",
            "propertyNames": {"not": {"enum": list(RESERVED_OUTPUT_FIELDS)}},
        },
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": 200,
            "items": {"$ref": "#/$defs/step"},
        },
    },
    "$defs": {
        "step": {
            "type": "object",
            "required": ["id", "type"],
            "properties": {
                "id": _COMMON["id"],
                "type": {"enum": list(STEP_TYPES)},
            },
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": kind}}, "required": ["type"]},
                    "then": {"$ref": f"#/$defs/{kind}"},
                }
                for kind in STEP_TYPES
            ],
        },
        **{kind: _step_schema(kind) for kind in STEP_TYPES},
    },
}
