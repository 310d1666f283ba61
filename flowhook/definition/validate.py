"""Validation of flow definitions: the JSON Schema, then what a schema cannot say (unique
step ids, jump targets that exist and lie ahead, expressions that compile)."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from flowhook.definition.expressions import ExpressionError, compile_value
from flowhook.definition.requests import request_problem
from flowhook.definition.schema import FLOW_SCHEMA
from flowhook.errors import InvalidDefinition
from flowhook.targets import TargetRefused, check_url

__all__ = ["validate_definition", "ACTIONS"]

ACTIONS = frozenset({"continue", "end", "fail"})
_validator = Draft202012Validator(FLOW_SCHEMA)
_QUOTED = re.compile(r"'([^']+)'")
# scheme://host followed by a path, query or fragment: the host ends before a template.
_HOST_THEN_REST = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#{]+[/?#]")


def _where(path: Iterable[Any], steps: list[Any]) -> tuple[str, str]:
    """("steps[1].output", "step 'price' (steps[1])") for a schema path."""
    field = "definition"
    label = ""
    parts = list(path)
    for i, part in enumerate(parts):
        field += f"[{part}]" if isinstance(part, int) else f".{part}"
        if i == 1 and parts[0] == "steps" and isinstance(part, int):
            step = steps[part] if part < len(steps) else None
            sid = step.get("id") if isinstance(step, dict) else None
            label = f"step {sid!r} (steps[{part}])" if isinstance(sid, str) else f"steps[{part}]"
    return field, label


def _schema_error(err: ValidationError, definition: Any) -> InvalidDefinition:
    steps = definition.get("steps") if isinstance(definition, dict) else None
    steps = steps if isinstance(steps, list) else []
    path = deque(err.absolute_path)
    if err.validator == "required" or err.validator == "additionalProperties":
        # Name the missing or unexpected field itself.
        missing = _field_named(err)
        if missing:
            path.append(missing)
    field, label = _where(path, steps)
    prefix = f"{label}: " if label else ""
    return InvalidDefinition(f"{prefix}{field} — {err.message}", field=field)


def _field_named(err: ValidationError) -> str | None:
    m = _QUOTED.search(err.message)
    return m.group(1) if m else None


def validate_definition(definition: Any, *, allow_private_targets: bool = False) -> dict[str, Any]:
    """Return the definition if valid; raise :class:`InvalidDefinition` naming step and field.

    An ``http`` step's literal parts are checked as they will be sent: its method and
    headers, and its URL against the target guard (a URL whose host is templated is
    checked when the step runs)."""
    error = best_match(_validator.iter_errors(definition), key=_relevance)
    if error is not None:
        raise _schema_error(error, definition)
    steps: list[dict[str, Any]] = definition["steps"]
    position: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step["id"] in position:
            raise InvalidDefinition(
                f"step {step['id']!r} (steps[{i}]): id is already used by steps[{position[step['id']]}]",
                field=f"definition.steps[{i}].id",
            )
        position[step["id"]] = i
    for i, step in enumerate(steps):
        label = f"step {step['id']!r} (steps[{i}])"
        if step["type"] == "condition":
            for branch in ("then", "else"):
                target = step.get(branch, "continue")
                if target in ACTIONS:
                    continue
                if target not in position or position[target] <= i:
                    raise InvalidDefinition(
                        f"{label}: {branch} must be continue, end, fail or the id of a later "
                        f"step, not {target!r}",
                        field=f"definition.steps[{i}].{branch}",
                    )
        for key, value in step.items():
            if key in ("id", "type", "then", "else", "description"):
                continue
            _check_expressions(value, f"definition.steps[{i}].{key}", label)
        if step["type"] == "http":
            _check_request(step["request"], f"definition.steps[{i}].request", label,
                           allow_private_targets=allow_private_targets)  # fmt: skip
    if "output" in definition:
        _check_expressions(definition["output"], "definition.output", "output")
    return definition  # type: ignore[no-any-return]


def _check_expressions(value: Any, field: str, label: str) -> None:
    try:
        compile_value(value)
    except ExpressionError as exc:
        raise InvalidDefinition(
            f"{label}: {field} has an invalid expression: {exc}", field=field
        ) from exc
    except (RecursionError, MemoryError):  # the compiler's own limits, on absurd nesting
        raise InvalidDefinition(
            f"{label}: {field} has an expression nested too deeply to compile", field=field
        ) from None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        raise InvalidDefinition(
            f"{label}: {field} has an invalid expression: {exc}", field=field
        ) from None


def _check_request(
    request: dict[str, Any], field: str, label: str, *, allow_private_targets: bool
) -> None:
    method = request.get("method")
    literal_method = method if isinstance(method, str) and "{{" not in method else None
    headers = {k: v for k, v in (request.get("headers") or {}).items() if "{{" not in k + v}
    problem = request_problem(literal_method, headers)
    if problem:
        where = "method" if problem.startswith("method") else "headers"
        raise InvalidDefinition(f"{label}: {field}.{where} — {problem}", field=f"{field}.{where}")
    url: str = request["url"]
    literal = url.split("{{", 1)[0]
    if literal != url and not _HOST_THEN_REST.match(literal):
        return  # the host itself is templated: checked when the step runs
    try:
        check_url(literal, allow_private=allow_private_targets)
    except TargetRefused as exc:
        raise InvalidDefinition(
            f"{label}: {field}.url — refused: {exc.message}", field=f"{field}.url"
        ) from None


def _relevance(error: ValidationError) -> tuple[int, int]:
    # Prefer the deepest error (the one inside a step's own schema) over the generic ones.
    return (-len(error.absolute_path), 0)
