"""A flow's ``input_schema``: the JSON Schema (draft 2020-12) that the payload of every run
it starts must meet, checked when the run is asked for, before anything is stored.

The schema itself is checked when the flow is saved: against the draft's meta-schema (each
problem named by its place in the definition), and by compiling it, which finds what the
meta-schema cannot (a ``pattern`` that is no regular expression, a ``$ref`` to nothing).
A schema refers only to itself: nothing is ever fetched (``$ref`` to another document is
refused when the flow is saved).

Payloads are checked by ``jsonschema_rs``, compiled once per flow version, with its
linear-time regular expression engine (a ``pattern`` with look-around or back-references is
refused when the flow is saved), so a schema's ``pattern`` cannot hold the API for everyone
else with a crafted payload. A schema is at most :data:`MAX_SCHEMA_BYTES`. ``format`` is
asserted, not only noted: a user who writes ``"format": "email"`` expects it checked.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from flowhook.errors import InvalidDefinition, InvalidPayload

__all__ = ["schema_problems", "check_payload", "payload_problems", "MAX_PROBLEMS_SHOWN"]

MAX_PROBLEMS_SHOWN = 5
"""A refused payload's message lists this many problems at most (the first is its field)."""

MAX_SCHEMA_BYTES = 64 * 1024
"""The largest ``input_schema``, as compact JSON: its compiled form is kept per flow version."""
MAX_MESSAGE = 200
"""A problem's message is cut to this many characters (it may quote the payload's value)."""
_REGEX_BYTES = 1 << 20
"""A compiled ``pattern`` may take this much memory."""

_META = Draft202012Validator(Draft202012Validator.META_SCHEMA)
_CACHE_SIZE = 512
_compiled: OrderedDict[tuple[str, int], Any] = OrderedDict()
"""The compiled validator of each (flow, version) seen lately: a version never changes."""


def _compile(schema: Any) -> Any:
    return jsonschema_rs.Draft202012Validator(
        schema,
        validate_formats=True,
        offline=True,
        # the linear-time engine: no look-around, no back-references (refused when saved)
        pattern_options=jsonschema_rs.RegexOptions(size_limit=_REGEX_BYTES),
    )


def _field(path: Iterator[Any] | list[Any], root: str) -> str:
    field = root
    for part in path:
        field += f"[{part}]" if isinstance(part, int) else f".{part}"
    return field


def _refs(node: Any, path: list[Any]) -> Iterator[tuple[list[Any], str]]:
    """Every ``$ref`` / ``$dynamicRef`` of the schema that is not within it (not ``#…``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                if not value.startswith("#"):
                    yield [*path, key], value
            else:
                yield from _refs(value, [*path, key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _refs(value, [*path, i])


def schema_problems(schema: Any) -> list[InvalidDefinition]:
    """What is wrong with a definition's ``input_schema``, each problem at its place
    (``definition.input_schema.properties.amount.type``); empty when it is a usable schema."""
    root = "definition.input_schema"
    if not isinstance(schema, dict):
        return [InvalidDefinition("input_schema must be a JSON Schema object", field=root)]
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        return [
            InvalidDefinition(
                f"input_schema is {size:,} bytes as JSON, more than {MAX_SCHEMA_BYTES:,}",
                field=root,
            )
        ]
    found: list[InvalidDefinition] = []
    error = best_match(_META.iter_errors(schema))
    if error is not None:
        field = _field(list(error.absolute_path), root)
        found.append(
            InvalidDefinition(
                f"{field.removeprefix('definition.')}: {error.message} (not a valid "
                "JSON Schema, draft 2020-12)",
                field=field,
            )
        )
        return found
    for path, ref in _refs(schema, []):
        field = _field(path, root)
        found.append(
            InvalidDefinition(
                f"{field.removeprefix('definition.')}: {ref!r} points outside the schema; "
                "input_schema refers only to itself (#/$defs/…), nothing is fetched",
                field=field,
            )
        )
    if found:
        return found
    try:
        _compile(schema)
    except jsonschema_rs.ValidationError as exc:
        path = list(getattr(exc, "instance_path", []) or [])
        field = _field(path, root)
        reason = str(exc.message).splitlines()[0]
        if "regex" in reason:
            reason += " (patterns run in linear time: no look-around, no back-references)"
        found.append(
            InvalidDefinition(f"{field.removeprefix('definition.')}: {reason}", field=field)
        )
    except Exception as exc:  # noqa: BLE001 - whatever else the compiler refuses is a 400, never a 500
        found.append(InvalidDefinition(f"input_schema: {str(exc).splitlines()[0]}", field=root))
    return found


def _validator(flow_id: str, version: int, schema: dict[str, Any]) -> Any:
    key = (flow_id, version)
    found = _compiled.get(key)
    if found is None:
        found = _compiled[key] = _compile(schema)
        while len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    else:
        _compiled.move_to_end(key)
    return found


def payload_problems(
    flow_id: str, version: int, schema: dict[str, Any], payload: Any, *, limit: int = 50
) -> list[tuple[str, str]]:
    """(field, what is wrong) for each way ``payload`` fails the flow's ``input_schema``,
    ``limit`` at most; the field is the payload's (``payload.lines[2]``), and a missing
    required field is named itself (``payload.email``), not the object that lacks it."""
    problems = []
    for error in _validator(flow_id, version, schema).iter_errors(payload):
        path = list(error.instance_path)
        kind = error.kind
        if isinstance(kind, jsonschema_rs.ValidationErrorKind.Required):
            path.append(kind.property)
        message = str(error.message)
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        problems.append((_field(path, "payload"), message))
        if len(problems) >= limit:
            break
    return problems


def check_payload(flow_id: str, version: int, schema: dict[str, Any], payload: Any) -> None:
    """InvalidInput (400) naming the payload's first field at fault, with up to
    :data:`MAX_PROBLEMS_SHOWN` problems, when ``payload`` fails the flow's ``input_schema``."""
    problems = payload_problems(flow_id, version, schema, payload, limit=MAX_PROBLEMS_SHOWN + 1)
    if not problems:
        return
    shown = "; ".join(f"{field}: {message}" for field, message in problems[:MAX_PROBLEMS_SHOWN])
    more = " (and more)" if len(problems) > MAX_PROBLEMS_SHOWN else ""
    raise InvalidPayload(
        f"the payload does not match the flow's input_schema: {shown}{more}",
        problems[:MAX_PROBLEMS_SHOWN],
    )
