"""Validation of flow definitions: the JSON Schema, then what a schema cannot say (unique
step ids, jump targets that exist and lie ahead, expressions that compile)."""

from __future__ import annotations

import contextlib
import difflib
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from flowhook.definition.expressions import (
    ExpressionError,
    check_size,
    compile_value,
    expression_chars,
    referenced_steps,
)
from flowhook.definition.input_schema import schema_problems
from flowhook.definition.requests import request_problem
from flowhook.definition.schema import FLOW_SCHEMA, RESERVED_OUTPUT_FIELDS
from flowhook.definition.secret_refs import SECRET_FIELDS, SecretUse, secret_names
from flowhook.errors import InvalidDefinition
from flowhook.targets import TargetRefused, check_url

__all__ = [
    "validate_definition",
    "secrets_of",
    "ACTIONS",
    "MAX_DEFINITION_EXPRESSION_CHARS",
    "COMPILE_SECONDS",
]

MAX_DEFINITION_EXPRESSION_CHARS = 32_000
"""All the expressions of one definition together, in characters (about 1.5 s to compile)."""

COMPILE_SECONDS = 5.0
"""The time a definition's expressions may take to compile before it is refused."""


class _OverBudget(InvalidDefinition):
    """A definition past the size or compile time its expressions may have: the checks end."""


@dataclass(slots=True)
class _Budget:
    """What compiling one definition's expressions may still cost."""

    deadline: float
    chars: int = 0

    def take(self, value: Any, field: str, label: str) -> None:
        self.chars += expression_chars(value)
        if self.chars > MAX_DEFINITION_EXPRESSION_CHARS:
            raise _OverBudget(
                f"{label}: {field} brings the definition's expressions to {self.chars} "
                f"characters, more than the {MAX_DEFINITION_EXPRESSION_CHARS} one flow may "
                "have; move the work into fewer, shorter expressions or a python step",
                field=field,
            )
        if time.monotonic() > self.deadline:
            raise _OverBudget(
                f"{label}: {field}: the definition's expressions took longer than "
                f"{COMPILE_SECONDS:g} s to compile; make them shorter",
                field=field,
            )


ACTIONS = frozenset({"continue", "end", "fail"})
_validator = Draft202012Validator(FLOW_SCHEMA)
_QUOTED = re.compile(r"'([^']+)'")
# scheme://host followed by a path, query or fragment: the host ends before a template.
_HOST_THEN_REST = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#{]+[/?#]")


@dataclass(frozen=True, slots=True)
class _Placed:
    """A step of the definition with where it is: its field path (``steps[2].branches.crm[0]``),
    the list it belongs to, and its position there."""

    step: dict[str, Any]
    field: str
    siblings: list[dict[str, Any]]
    position: int

    @property
    def label(self) -> str:
        return f"step {self.step['id']!r} ({self.field.removeprefix('definition.')})"


def _placed(steps: list[Any], field: str = "definition.steps") -> Iterator[_Placed]:
    """Every step of the definition, nested ones too, in order (a step before its own)."""
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        here = _Placed(step, f"{field}[{i}]", steps, i)
        yield here
        if step.get("type") == "parallel" and isinstance(step.get("branches"), dict):
            for name, branch in step["branches"].items():
                if isinstance(branch, list):
                    yield from _placed(branch, f"{here.field}.branches.{name}")
        elif step.get("type") == "map" and isinstance(step.get("steps"), list):
            yield from _placed(step["steps"], f"{here.field}.steps")


def _where(path: Iterable[Any], definition: Any) -> tuple[str, str]:
    """("steps[1].output", "step 'price' (steps[1])") for a schema path: the field, and the
    innermost step it lies in. A step is an entry of a list of steps (the flow's, a map's
    ``steps``, a parallel's branch), known by the shape of the path, not by field names: a
    branch may be called anything."""
    field = "definition"
    label = ""
    node = definition
    kind = "flow"  # what ``node`` is: the flow, a list of steps, a step, a step's branches
    for part in path:
        field += f"[{part}]" if isinstance(part, int) else f".{part}"
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
        kind = _next_kind(kind, part)
        if kind == "step" and isinstance(node, dict):
            sid = node.get("id")
            where = field.removeprefix("definition.")
            label = f"step {sid!r} ({where})" if isinstance(sid, str) else where
    return field, label


def _next_kind(kind: str, part: Any) -> str:
    """What ``part`` of a node of ``kind`` is, as :func:`_where` walks a path: a list of steps
    (the flow's ``steps``, a step's ``steps``, any branch), a step (an entry of such a list),
    a step's ``branches``, or nothing of the kind (``""``)."""
    if kind == "steps":
        return "step" if isinstance(part, int) else ""
    if kind == "branches":
        return "steps" if isinstance(part, str) else ""
    if kind in ("flow", "step") and part == "steps":
        return "steps"
    if kind == "step" and part == "branches":
        return "branches"
    return ""


def _schema_error(err: ValidationError, definition: Any) -> InvalidDefinition:
    path = deque(err.absolute_path)
    message = err.message
    schema = err.schema if isinstance(err.schema, dict) else {}
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = sorted(schema.get("properties") or {})
        unknown = sorted(k for k in err.instance if k not in known)
        if unknown:
            path.append(unknown[0])
            message = f"unknown field {unknown[0]!r}{_did_you_mean(unknown[0], known)}"
    elif err.validator == "required":
        missing = _field_named(err)  # name the missing field itself
        if missing:
            path.append(missing)
    elif err.validator == "enum" and isinstance(err.instance, str):
        choices = [str(c) for c in schema.get("enum") or ()]
        message = (
            f"{err.instance!r} is not one of {', '.join(choices)}"
            f"{_did_you_mean(err.instance, choices)}"
        )
    field, label = _where(path, definition)
    prefix = f"{label}: " if label else ""
    return InvalidDefinition(f"{prefix}{field} — {message}", field=field)


def _did_you_mean(given: str, known: list[str]) -> str:
    close = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _field_named(err: ValidationError) -> str | None:
    m = _QUOTED.search(err.message)
    return m.group(1) if m else None


def validate_definition(definition: Any, *, allow_private_targets: bool = False) -> dict[str, Any]:
    """Return the definition if valid; raise :class:`InvalidDefinition` naming step and field.

    Step ids are unique across the whole flow (nested steps included); a ``condition`` jumps
    only ahead within its own list; a literal ``steps.<id>`` in an expression names a step
    of the flow. An ``http`` step's literal parts are checked as they will be sent: its
    method and headers, and its URL against the target guard (a URL whose host is templated
    is checked when the step runs)."""
    problems = _Problems()
    if isinstance(definition, dict):  # before the schema, which states it in its own words
        with problems.noted():
            _check_output_names(definition.get("output"))
    errors = list(_validator.iter_errors(definition))
    for group in _by_place(errors):
        # A misspelled field is both unknown and (the field it meant) missing: name the typo.
        unknown = [e for e in group if e.validator == "additionalProperties"]
        error = best_match(unknown or group, key=_relevance)
        if error is not None:
            problems.add(_schema_error(error, definition))
    problems.raise_any()  # what follows needs the schema's shape
    if "input_schema" in definition:
        for problem in schema_problems(definition["input_schema"]):
            problems.add(problem)
    everything = list(_placed(definition["steps"]))
    first: dict[str, _Placed] = {}
    for placed in everything:
        sid = placed.step["id"]
        if sid in first:
            problems.add(
                InvalidDefinition(
                    f"{placed.label}: id is already used by "
                    f"{first[sid].field.removeprefix('definition.')}",
                    field=f"{placed.field}.id",
                )
            )
            continue
        first[sid] = placed
    budget = _Budget(time.monotonic() + COMPILE_SECONDS)
    for placed in everything:
        with problems.noted():
            _check_step(placed, set(first), budget, allow_private_targets=allow_private_targets)
    if "output" in definition:
        with problems.noted():
            _check_expressions(
                definition["output"], "definition.output", "output", set(first), budget
            )
            _refuse_secrets(definition["output"], "definition.output", "output")
    for field, value in _control_expressions(definition):
        with problems.noted():  # read when the run is accepted: the payload is all there is
            _check_expressions(value, f"definition.{field}", field, set(), budget)
            _refuse_secrets(value, f"definition.{field}", field)
    problems.raise_any()
    return definition  # type: ignore[no-any-return]


class _Problems:
    """The problems of one definition, each found where it lies, raised together."""

    def __init__(self) -> None:
        self.found: list[InvalidDefinition] = []

    def add(self, problem: InvalidDefinition) -> None:
        self.found.extend(problem.problems)

    @contextlib.contextmanager
    def noted(self) -> Iterator[None]:
        """Note a check's problem and go on to the next check; a cap on the definition's
        size or compile time ends the checks (what is left would not be looked at)."""
        try:
            yield
        except _OverBudget as exc:
            self.add(exc)
            self.raise_any()
        except InvalidDefinition as exc:
            self.add(exc)

    def raise_any(self) -> None:
        if self.found:
            raise InvalidDefinition.of(self.found)


def _by_place(errors: list[ValidationError]) -> list[list[ValidationError]]:
    """Schema errors grouped by the step they lie in (the innermost), or the flow's own field:
    one problem is told for each place."""
    groups: dict[tuple[Any, ...], list[ValidationError]] = {}
    for error in errors:
        path = list(error.absolute_path)
        place: tuple[Any, ...] = tuple(path[:1])
        for i in range(len(path) - 1):
            if isinstance(path[i + 1], int) and (path[i] == "steps" or _in_branches(path, i)):
                place = tuple(path[: i + 2])
        groups.setdefault(place, []).append(error)
    return list(groups.values())


def _in_branches(path: list[Any], i: int) -> bool:
    """Whether ``path[i]`` is a branch's name (``…, "branches", <name>, <index>``)."""
    return i >= 1 and path[i - 1] == "branches" and isinstance(path[i], str)


def _control_expressions(definition: dict[str, Any]) -> list[tuple[str, Any]]:
    """The flow control expressions of a definition, by field."""
    found = []
    for name in ("concurrency", "throttle", "debounce"):
        spec = definition.get(name)
        if isinstance(spec, dict) and "key" in spec:
            found.append((f"{name}.key", spec["key"]))
    if isinstance(definition.get("priority"), str):
        found.append(("priority", definition["priority"]))
    return found


def _check_step(
    placed: _Placed, ids: set[str], budget: _Budget, *, allow_private_targets: bool
) -> None:
    step, label = placed.step, placed.label
    if step["type"] == "condition":
        later = {s["id"] for s in placed.siblings[placed.position + 1 :]}
        for branch in ("then", "else"):
            target = step.get(branch, "continue")
            if target in ACTIONS or target in later:
                continue
            raise InvalidDefinition(
                f"{label}: {branch} must be continue, end, fail or the id of a later "
                f"step of the same list, not {target!r}",
                field=f"{placed.field}.{branch}",
            )
    for key, value in step.items():
        if key in ("id", "type", "then", "else", "description", "branches", "steps"):
            continue
        _check_expressions(value, f"{placed.field}.{key}", label, ids, budget)
        if step["type"] == "http" and key == "request" and isinstance(value, dict):
            for part, inner in value.items():
                if part not in SECRET_FIELDS:
                    _refuse_secrets(inner, f"{placed.field}.request.{part}", label)
                else:
                    _secrets_read(inner, f"{placed.field}.request.{part}", label)
        else:
            _refuse_secrets(value, f"{placed.field}.{key}", label, step["type"])
    if step["type"] == "http":
        _check_request(step["request"], f"{placed.field}.request", label,
                       allow_private_targets=allow_private_targets)  # fmt: skip


def _secrets_read(value: Any, field: str, label: str) -> set[str]:
    """The secrets ``value`` reads by name; refused when it reads them otherwise."""
    try:
        return secret_names(value)
    except SecretUse as exc:
        raise InvalidDefinition(f"{label}: {field} — {exc}", field=field) from None


_STORED = {
    "task": "a task's input is stored and handed to a worker",
    "transform": "a transform's output is stored",
}


def _refuse_secrets(value: Any, field: str, label: str, step_type: str | None = None) -> None:
    """Refuse ``{{ secrets.… }}`` where it may not be read: all but an http step's request
    url, headers and body, where the value would be stored or shown."""
    names = _secrets_read(value, field, label)
    if names:
        why = _STORED.get(step_type or "", "the value would be stored or shown there")
        raise InvalidDefinition(
            f"{label}: {field} reads secrets.{sorted(names)[0]}, but only an http step's "
            f"request url, headers and body may read secrets ({why})",
            field=field,
        )


def secrets_of(definition: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The step secrets a valid definition's http steps read (what must exist to save it),
    each with where it is first read: the field, and the step's label."""
    found: dict[str, tuple[str, str]] = {}
    for placed in _placed(definition["steps"]):
        request = placed.step.get("request")
        if placed.step.get("type") == "http" and isinstance(request, dict):
            for part in SECRET_FIELDS:
                for name in sorted(secret_names(request.get(part))):
                    found.setdefault(name, (f"{placed.field}.request.{part}", placed.label))
    return found


def _check_output_names(output: Any) -> None:
    if not isinstance(output, dict):
        return
    for name, meaning in RESERVED_OUTPUT_FIELDS.items():
        if name in output:
            raise InvalidDefinition(
                f"output: definition.output.{name} cannot be used: flow.completed sets "
                f"{name!r} itself ({meaning}) beside the output's fields; rename it (for "
                f"example 'order_{name}')",
                field=f"definition.output.{name}",
            )


def _check_expressions(value: Any, field: str, label: str, ids: set[str], budget: _Budget) -> None:
    budget.take(value, field, label)
    try:
        check_size(value)
        compile_value(value)
        unknown = sorted(referenced_steps(value) - ids)
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
    if unknown:
        raise InvalidDefinition(
            f"{label}: {field} refers to steps.{unknown[0]}, but the flow has no step "
            f"{unknown[0]!r}",
            field=field,
        )


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
