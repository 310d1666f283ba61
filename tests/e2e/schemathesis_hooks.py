"""Schemathesis hooks for the contract test (tests/e2e/test_openapi_contract.py), loaded by
the ``schemathesis`` command through ``SCHEMATHESIS_HOOKS``.

A JSON Schema cannot state every rule the API checks: that a flow's step ids are unique, that
a cron fires at most once a minute, that a URL's host is public. The OpenAPI document lists
those rules in words; a request that breaks one is refused with 400, as it should be. So a
*positive* case (one the generator means to be valid) is brought within those rules here,
with the API's own checks, before it is sent: a step id used twice is renamed, a cron that
fires too often becomes a valid one, and so on. Everything else the generator drew is sent
as drawn, and negative cases are never touched.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import schemathesis
from schemathesis import GenerationMode

from flowhook.cron import check_cron, check_timezone, shortest_gap
from flowhook.definition import secrets_of, validate_definition
from flowhook.errors import FlowhookError
from flowhook.targets import TargetRefused, check_url

EXAMPLE_FLOW: dict[str, Any] = {
    "name": "Process order",
    "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.amount > 0 }}", "else": "fail"},
        {"id": "price", "type": "transform", "output": {"total": "{{ payload.amount * 1.2 }}"}},
    ],
}
CRON = "0 9 * * 1-5"
URL = "https://example.com/flowhook"
INT64 = (-(2**63), 2**63 - 1)
MIN_SCHEDULE_SECONDS = 60


def _storable(value: Any, depth: int = 0) -> Any:
    """JSON the store keeps as sent: no NUL in strings, integers within 64 bits, not nested
    past 254 levels (SPEC's limits on any JSON value, stated in the document's words)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return min(max(value, INT64[0]), INT64[1])
    if isinstance(value, dict):
        if depth > 200:
            return {}
        return {_storable(k): _storable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        if depth > 200:
            return []
        return [_storable(v, depth + 1) for v in value]
    return value


def _valid_definition(definition: Any) -> bool:
    try:
        validate_definition(definition)
    except FlowhookError:
        return False
    return not secrets_of(definition)  # a secret the workspace holds: none here


def _steps_in(steps: list[Any]) -> list[dict[str, Any]]:
    found = []
    for step in steps:
        if not isinstance(step, dict):
            continue
        found.append(step)
        if isinstance(step.get("steps"), list):
            found += _steps_in(step["steps"])
        if isinstance(step.get("branches"), dict):
            for branch in step["branches"].values():
                if isinstance(branch, list):
                    found += _steps_in(branch)
    return found


def _plain(value: Any) -> Any:
    """``value`` with no template syntax left in its strings."""
    if isinstance(value, str):
        return value.replace("{", "(").replace("}", ")").replace("%", "")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _repaired_definition(definition: Any) -> Any:
    """A definition the API accepts: as drawn when it holds the rules the schema cannot
    state; else with unique step ids, plain-text templates, forward-only conditions, public
    URLs, no python steps (no plugin is loaded) and no key expressions; else the README's."""
    if not isinstance(definition, dict) or not isinstance(definition.get("steps"), list):
        return definition  # the schema says no: the API says 400 (not our business here)
    definition = _without_keys(definition)
    if _valid_definition(definition):
        return definition
    fixed = copy.deepcopy(definition)
    for n, step in enumerate(_steps_in(fixed["steps"])):
        step["id"] = f"s{n}"
        if step.get("type") == "condition":
            step["then"], step["else"] = "continue", "continue"
            step["if"] = "{{ true }}"
        if step.get("type") == "python":
            step.clear()
            step.update({"id": f"s{n}", "type": "transform", "output": {}})
        if step.get("type") == "http" and isinstance(step.get("request"), dict):
            step["request"] = {"url": URL}
        if step.get("type") == "map" and isinstance(step.get("items"), str):
            step["items"] = "{{ [1, 2] }}"
        for key, value in list(step.items()):
            if key not in ("id", "type", "steps", "branches", "if", "items"):
                step[key] = _plain(value)
    if "output" in fixed:
        fixed["output"] = _plain(fixed["output"])
    if _valid_definition(fixed):
        return fixed
    return copy.deepcopy(EXAMPLE_FLOW)


def _without_keys(definition: dict[str, Any]) -> dict[str, Any]:
    """No flow control key expressions: each execute's payload must give them a value (else
    400 naming the field), and the generator cannot know what a drawn flow's keys read."""
    fixed = copy.deepcopy(definition)
    for control in ("concurrency", "throttle", "debounce"):
        if isinstance(fixed.get(control), dict):
            fixed[control].pop("key", None)
    if isinstance(fixed.get("priority"), str):
        fixed["priority"] = 0
    return fixed


def _valid_cron(cron: Any) -> bool:
    try:
        return shortest_gap(check_cron(cron)) >= MIN_SCHEDULE_SECONDS
    except Exception:  # croniter raises many kinds; any is a refusal
        return False


def _valid_timezone(name: Any) -> bool:
    try:
        check_timezone(name)
    except Exception:
        return False
    return True


def _public_url(url: Any) -> bool:
    try:
        check_url(url)
    except (TargetRefused, TypeError):
        return False
    return True


def _in_order(since: Any, until: Any) -> bool:
    try:
        start = datetime.fromisoformat(since)
        end = datetime.now(UTC) if until is None else datetime.fromisoformat(until)
        return start < end
    except (TypeError, ValueError, OverflowError):
        return False


def _printable(name: Any) -> bool:
    return isinstance(name, str) and name.isprintable()


def _repair(method: str, path: str, body: dict[str, Any]) -> None:
    route = (method, path.removeprefix("/api/v1"))
    if route in (("POST", "/schedules"), ("PATCH", "/schedules/{schedule_id}")):
        if "cron" in body and body["cron"] is not None and not _valid_cron(body["cron"]):
            body["cron"] = CRON
        if body.get("timezone") is not None and not _valid_timezone(body["timezone"]):
            body["timezone"] = "UTC"
    elif route in (("POST", "/webhooks/endpoints"), ("PATCH", "/webhooks/endpoints/{endpoint_id}")):
        if body.get("url") is not None and not _public_url(body["url"]):
            body["url"] = URL
    elif route in (("POST", "/signals"), ("POST", "/flows/runs/{run_id}/signal")):
        if not _printable(body.get("name")):
            body["name"] = "order.paid"
    elif route == ("POST", "/hooks"):
        if body.get("signal") is not None and not _printable(body["signal"]):
            body["signal"] = "payment.captured"
    elif route == ("POST", "/flows/runs/{run_id}/rerun"):
        body.pop("from_step", None)  # a step of a run the generator cannot know
        if body.get("flow_version") != "latest":
            body.pop("flow_version", None)
    elif route == ("POST", "/webhooks/endpoints/{endpoint_id}/recover") and not _in_order(
        body.get("since"), body.get("until")
    ):
        # "since must be before until" (default: now): an order no schema states
        body["since"], body["until"] = "2020-01-01T00:00:00Z", None


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    if isinstance(case.query, dict) and isinstance(case.query.get("wait"), int | float):
        # a long-poll on a run that never ends (a wait step) holds the call for up to a
        # minute: shortened, to keep the test's time bounded
        case.query["wait"] = min(case.query["wait"], 0.5)
    if case.path.endswith(("/tasks/claim", "/tasks/batch")) and isinstance(case.body, dict):
        # a claim waits for a task (20 s unless told; a batch 0) and none comes here:
        # shortened, as a value in range stays in range (an out-of-range one is refused)
        wait = case.body.get("wait_seconds", 20)
        if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait <= 60:
            case.body["wait_seconds"] = min(wait, 0.5)
    meta = case.meta
    if meta is None or meta.generation.mode != GenerationMode.POSITIVE:
        return case
    if not isinstance(case.body, dict):
        return case
    route = (case.method.upper(), case.path.removeprefix("/api/v1"))
    if route in (("POST", "/flows"), ("PUT", "/flows/{flow_id}"), ("POST", "/flows/validate")):
        case.body = _storable(_repaired_definition(case.body))
        return case
    body = _storable(case.body)
    _repair(case.method.upper(), case.path, body)
    case.body = body
    return case
