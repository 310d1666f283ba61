"""Flows: the list, one flow's definition at a version, and starting a run of it with a
payload typed into its page."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.responses import Response

from flowhook.definition.input_schema import payload_problems
from flowhook.errors import InvalidInput
from flowhook.store.models import MAX_FLOW_VERSION, Flow, Run, RunStatus
from flowhook.web.graph import called_flows, flow_graph
from flowhook.web.pages import Page, PageDep, first, redirect
from flowhook.web.start_form import FIELD_PREFIX, form_fields, payload_from_form

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/flows")
async def flows(p: Page = PageDep) -> Response:
    page_ = await p.services.flows.list(p.who, limit=100, cursor=None)
    return p.render("flows.html", rows=page_.data)


@router.get("/flows/{flow_id}")
async def flow(flow_id: str, p: Page = PageDep) -> Response:
    f = await p.services.flows.get(p.who, flow_id, _version(p.request.query_params.get("version")))
    return await _flow_page(p, f)


async def _flow_page(
    p: Page, f: Flow, status: int = 200, *, error: str | None = None, payload: str = "{\n  \n}",
    problems: dict[str, str] | None = None, held: dict[str, str] | None = None,
) -> Response:  # fmt: skip
    """The flow's page: its start form (built from its ``input_schema`` when it has one),
    its graph, definition and versions."""
    versions = await p.services.flows.versions(p.who, f.flow_id)
    names = await p.services.flows.names(p.who, called_flows(f.definition))
    graph = flow_graph(f.definition, flow_names=names)
    latest = await p.services.runs.list(p.who, limit=HEALTH_RUNS, cursor=None, flow_id=f.flow_id)
    recent = latest.data[:RECENT_RUNS]
    await p.services.runs.explain(p.who, recent)
    q = p.request.query_params
    saved, unchanged = q.get("saved", ""), q.get("unchanged", "")
    notice = (
        f"Saved as version {saved}." if saved.isdigit()
        else f"Nothing changed: still version {unchanged}." if unchanged.isdigit()
        else None
    )  # fmt: skip
    return p.render(
        "flow.html", status, f=f, versions=versions, error=error, payload=payload, graph=graph,
        fields=form_fields(f.definition.get("input_schema")), problems=problems or {},
        held=held, prefix=FIELD_PREFIX, recent=recent, health=_health(latest.data),
        latest=max((v["version"] for v in versions), default=f.version), notice=notice,
    )  # fmt: skip


RECENT_RUNS = 10
"""Runs listed on a flow's page."""
HEALTH_RUNS = 100
"""A flow's success rate is taken over its latest this many runs (those that finished)."""


@dataclass(frozen=True, slots=True)
class Health:
    finished: int
    failed: int
    rate: str
    """Completed among the finished, in percent as people read it (``97.5``, ``100``)."""
    tone: str


def _health(runs: list[Run]) -> Health:
    finished = [r for r in runs if r.status in (RunStatus.COMPLETED, RunStatus.FAILED)]
    failed = sum(1 for r in finished if r.status is RunStatus.FAILED)
    if not finished:
        return Health(0, 0, "", "")
    share = 100 * (len(finished) - failed) / len(finished)
    tone = "good" if share >= 99 else "fair" if share >= 90 else "poor"
    return Health(len(finished), failed, f"{share:.1f}".removesuffix(".0"), tone)


def _version(text: str | None) -> int | None:
    """``?version=N``: absent or empty is the current version; anything but 1 to 2e9 in
    ASCII digits is refused (``str.isdigit`` takes "²", which ``int`` does not)."""
    if not text:
        return None
    digits = len(text) <= 10 and text.isascii() and text.isdigit()  # int() of 5,000 digits raises
    if not digits or not 1 <= int(text) <= MAX_FLOW_VERSION:
        raise InvalidInput(f"version must be a whole number from 1 to {MAX_FLOW_VERSION}")
    return int(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _payload(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(payload, None) for a JSON object the store can write back as it is, else
    (None, what is wrong with it)."""
    try:
        payload = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return None, (
            f"The payload is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        )
    except ValueError as exc:  # NaN, Infinity
        return None, f"The payload is not valid JSON: {exc}."
    except RecursionError:
        return None, "The payload nests too deeply."
    if not isinstance(payload, dict):
        return None, 'The payload must be a JSON object, such as {"order_id": "ord_123"}.'
    try:
        orjson.dumps(payload)  # what the store writes: 64-bit integers, bounded nesting
    except orjson.JSONEncodeError as exc:
        reason = str(exc)
        if "64-bit" in reason:
            return None, "The payload holds an integer too large to store (at most 64 bits)."
        if "ecursion" in reason:
            return None, "The payload nests too deeply to store (keep it under 250 levels)."
        return None, f"The payload cannot be stored: {reason}."
    return payload, None


@router.post("/flows/{flow_id}/start")
async def flow_start(flow_id: str, p: Page = PageDep) -> Response:
    """Start a run with the payload of the form built from the flow's ``input_schema``
    (``form=fields``) or typed as JSON; a payload the schema refuses shows each problem
    beside its field, and nothing is started."""
    fields = await p.form()
    f = await p.services.flows.get(p.who, flow_id)
    schema = f.definition.get("input_schema")
    if first(fields, "form") == "fields":
        inputs = form_fields(schema)
        payload, problems, held = payload_from_form(inputs, fields)
        if not problems and schema is not None:
            for where, message in payload_problems(f.flow_id, f.version, schema, payload):
                name = where.removeprefix("payload.").split(".")[0].split("[")[0]
                problems.setdefault(name, message)
        if problems:
            known = {i.name for i in inputs}
            stray = [f"{n or 'the payload'}: {m}" for n, m in problems.items() if n not in known]
            look = "; ".join(["Some fields need a look: each says why below", *stray]) + "."
            return await _flow_page(p, f, 400, error=look, problems=problems, held=held)
        text = json.dumps(payload, indent=2)
    else:
        text = first(fields, "payload", "{}") or "{}"
        typed, wrong = _payload(text)
        if typed is None:
            return await _flow_page(p, f, 400, error=wrong, payload=text)
        payload = typed
    try:
        started = await p.services.runs.start(p.who, flow_id=flow_id, payload=payload)
    except InvalidInput as exc:
        return await _flow_page(p, f, 400, error=exc.message, payload=text)
    return redirect(f"/runs/{started.run.run_id}")


@router.post("/flows/{flow_id}/pause")
async def flow_pause(flow_id: str, p: Page = PageDep) -> Response:
    await p.form()  # its CSRF token checked
    await p.services.flows.pause(p.who, flow_id)
    return redirect(f"/flows/{flow_id}")


@router.post("/flows/{flow_id}/resume")
async def flow_resume(flow_id: str, p: Page = PageDep) -> Response:
    await p.form()
    await p.services.flows.resume(p.who, flow_id)
    return redirect(f"/flows/{flow_id}")
