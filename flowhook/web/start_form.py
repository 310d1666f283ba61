"""The flow page's start form, built from the flow's ``input_schema``: one input per
top-level property (a text box, a number, a checkbox, a list of choices, or a small JSON box
for an object or a list), its title, description, default and whether it is required; and
back again, from the posted fields to the payload, each field's problem named beside it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FormField", "form_fields", "payload_from_form", "FIELD_PREFIX"]

FIELD_PREFIX = "in."
"""A posted field's name is this and the property's name (no clash with ``csrf``)."""

_INPUT_TYPES = {"email": "email", "date": "date", "uri": "url", "date-time": "text"}


@dataclass(frozen=True, slots=True)
class FormField:
    name: str
    label: str
    kind: str
    """``text``, ``number``, ``integer``, ``boolean``, ``choice`` or ``json``."""
    required: bool
    description: str = ""
    input_type: str = "text"
    """The HTML input's type for ``text`` (``email``, ``date``, ``url``)."""
    choices: list[tuple[str, Any]] = field(default_factory=list)
    """(as the form posts it, the value): text as it is, anything else as its JSON."""
    default: str = ""
    """The value shown before anything is typed, as the input holds it."""
    placeholder: str = ""


def _kind(prop: dict[str, Any]) -> str:
    if isinstance(prop.get("enum"), list) and prop["enum"]:
        return "choice"
    kind = prop.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("number", "integer", "boolean"):
        return str(kind)
    if kind in ("object", "array") or (kind is None and ("properties" in prop or "items" in prop)):
        return "json"
    return "text" if kind in ("string", None) else "json"


def _choice(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _shown(value: Any, kind: str) -> str:
    if kind == "choice":
        return _choice(value)
    if value is None:
        return ""
    if kind == "json":
        return json.dumps(value)
    if kind == "boolean":
        return "true" if value else ""
    return str(value)


def form_fields(schema: Any) -> list[FormField]:
    """The inputs for ``schema``'s top-level properties, in its order; empty when it
    describes no object with properties (the page offers the JSON box alone)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    required = set(schema.get("required") or [])
    found = []
    for name, prop in schema["properties"].items():
        if not isinstance(prop, dict):
            prop = {}
        kind = _kind(prop)
        fmt = prop.get("format")
        found.append(
            FormField(
                name=name,
                label=str(prop.get("title") or name),
                kind=kind,
                required=name in required,
                description=str(prop.get("description") or ""),
                input_type=_INPUT_TYPES.get(fmt, "text") if isinstance(fmt, str) else "text",
                choices=[(_choice(c), c) for c in prop["enum"]] if kind == "choice" else [],
                default=_shown(prop["default"], kind) if "default" in prop else "",
                placeholder="{…}"
                if prop.get("type") == "object"
                else "[…]"
                if kind == "json"
                else "",
            )
        )
    return found


def payload_from_form(
    fields: list[FormField], posted: dict[str, list[str]]
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """(payload, problems by field name, what each input held) from a posted start form.
    An empty optional input is left out of the payload; an empty required one is left out
    too, and the schema says it is missing."""
    payload: dict[str, Any] = {}
    problems: dict[str, str] = {}
    held: dict[str, str] = {}
    for f in fields:
        values = posted.get(FIELD_PREFIX + f.name) or []
        text = values[0] if values else ""
        held[f.name] = text
        if f.kind == "boolean":
            payload[f.name] = bool(values)
            continue
        if not text.strip():
            continue
        if f.kind == "text":
            payload[f.name] = text
        elif f.kind == "integer":
            try:
                payload[f.name] = int(text.strip())
            except ValueError:
                problems[f.name] = f"{text.strip()!r} is not a whole number"
        elif f.kind == "number":
            try:
                number = float(text.strip())
                if number != number or number in (float("inf"), float("-inf")):
                    raise ValueError
                payload[f.name] = int(number) if number.is_integer() and "." not in text else number
            except ValueError:
                problems[f.name] = f"{text.strip()!r} is not a number"
        elif f.kind == "choice":
            chosen = dict(f.choices)
            if text in chosen:
                payload[f.name] = chosen[text]
            else:
                problems[f.name] = f"{text!r} is not one of the choices"
        else:
            try:
                payload[f.name] = json.loads(text)
            except json.JSONDecodeError as exc:
                problems[f.name] = f"not valid JSON: {exc.msg} (column {exc.colno})"
            except RecursionError:
                problems[f.name] = "nests too deeply"
    return payload, problems, held
