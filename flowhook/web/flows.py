"""Flows: the list, one flow's definition at a version, and starting a run of it with a
payload typed into its page."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import InvalidInput
from flowhook.store.models import MAX_FLOW_VERSION
from flowhook.web.graph import called_flows, flow_graph
from flowhook.web.pages import Page, PageDep, first, redirect

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/flows")
async def flows(p: Page = PageDep) -> Response:
    page_ = await p.services.flows.list(p.who, limit=100, cursor=None)
    return p.render("flows.html", rows=page_.data)


@router.get("/flows/{flow_id}")
async def flow(flow_id: str, p: Page = PageDep) -> Response:
    f = await p.services.flows.get(p.who, flow_id, _version(p.request.query_params.get("version")))
    versions = await p.services.flows.versions(p.who, flow_id)
    names = await p.services.flows.names(p.who, called_flows(f.definition))
    graph = flow_graph(f.definition, flow_names=names)
    return p.render(
        "flow.html", f=f, versions=versions, error=None, payload="{\n  \n}", graph=graph
    )


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
    fields = await p.form()
    text = first(fields, "payload", "{}") or "{}"
    payload, error = _payload(text)
    if payload is not None:
        started = await p.services.runs.start(p.who, flow_id=flow_id, payload=payload)
        return redirect(f"/runs/{started.run.run_id}")
    f = await p.services.flows.get(p.who, flow_id)
    versions = await p.services.flows.versions(p.who, flow_id)
    return p.render("flow.html", 400, f=f, versions=versions, error=error, payload=text)


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
