"""New flows and new versions from the settings screen, and two versions compared.

The editor takes JSON or YAML; the new version's editor opens on the current one. Saving
checks the definition as ``POST /api/v1/flows`` does and, when it is refused, shows every
problem found at once, each on the line of the text it is about (and its step and field),
with the text kept as typed. Saving a version identical to the current one makes no version.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import FlowhookError, InvalidDefinition, InvalidInput
from flowhook.store.models import Flow
from flowhook.web.flow_text import (
    FORMATS,
    Problem,
    as_text,
    diff_lines,
    lines_of,
    read_definition,
)
from flowhook.web.pages import Page, PageDep, first, redirect

__all__ = ["router", "STARTER"]

router = APIRouter(include_in_schema=False)

STARTER: dict[str, Any] = {
    "name": "My flow",
    "input_schema": {
        "type": "object",
        "required": ["order_id"],
        "properties": {"order_id": {"type": "string", "title": "Order"}},
    },
    "steps": [
        {"id": "hello", "type": "transform", "output": {"order": "{{ payload.order_id }}"}},
    ],
}
"""What a new flow's editor opens on: one step, and a payload schema to show the form."""


def _format(value: str | None) -> str:
    return value if value in FORMATS else "json"


MAX_PROBLEMS = 50
"""Problems shown at most (a definition can hold many more; the first fifty are plenty)."""


def _problems(text: str, exc: FlowhookError) -> list[Problem]:
    """Each problem of a refused definition (the first :data:`MAX_PROBLEMS`), placed on its
    line of ``text``: the text is composed once for all of them."""
    if isinstance(exc, InvalidDefinition):
        found = [(p.message, p.field) for p in exc.problems[:MAX_PROBLEMS]]
    else:
        found = [(exc.message, exc.field if isinstance(exc, InvalidInput) else None)]
    lines = lines_of(text, [field for _, field in found])
    return [Problem(m, f, line) for (m, f), line in zip(found, lines, strict=True)]


def _editor(
    p: Page, *, flow: Flow | None, text: str, fmt: str, problems: list[Problem] | None = None,
    status: int = 200,
) -> Response:  # fmt: skip
    problems = sorted(problems or [], key=lambda q: (q.line is None, q.line or 0))
    by_line: dict[int, list[Problem]] = {}
    for problem in problems:
        if problem.line is not None:
            by_line.setdefault(problem.line, []).append(problem)
    return p.render(
        "flow_edit.html", status, flow=flow, text=text, fmt=fmt, formats=FORMATS,
        problems=problems, lines=text.splitlines(), by_line=by_line,
    )  # fmt: skip


@router.get("/flows/new")
async def flow_new(p: Page = PageDep) -> Response:
    fmt = _format(p.request.query_params.get("format"))
    return _editor(p, flow=None, text=as_text(STARTER, fmt), fmt=fmt)


@router.post("/flows/new")
async def flow_create(p: Page = PageDep) -> Response:
    fields = await p.form()
    text, fmt = first(fields, "text"), _format(first(fields, "format"))
    definition, unreadable = await asyncio.to_thread(read_definition, text, fmt)
    if unreadable is not None:
        return _editor(p, flow=None, text=text, fmt=fmt, problems=[unreadable], status=400)
    try:
        made = await p.services.flows.create(p.who, definition)
    except FlowhookError as exc:
        problems = await asyncio.to_thread(_problems, text, exc)
        return _editor(p, flow=None, text=text, fmt=fmt, problems=problems, status=400)
    return redirect(f"/flows/{made.flow_id}?saved={made.version}")


@router.get("/flows/{flow_id}/edit")
async def flow_edit(flow_id: str, p: Page = PageDep) -> Response:
    f = await p.services.flows.get(p.who, flow_id)
    fmt = _format(p.request.query_params.get("format"))
    return _editor(p, flow=f, text=as_text(f.definition, fmt), fmt=fmt)


@router.post("/flows/{flow_id}/edit")
async def flow_save(flow_id: str, p: Page = PageDep) -> Response:
    fields = await p.form()
    f = await p.services.flows.get(p.who, flow_id)
    text, fmt = first(fields, "text"), _format(first(fields, "format"))
    base = first(fields, "base_version")
    if base and base != str(f.version):  # saved by someone else meanwhile
        moved = Problem(
            f"the flow is at version {f.version} now, not {base[:12]} as when you opened it: "
            "open Edit again to start from it (copy your text first)", None, None,
        )  # fmt: skip
        return _editor(p, flow=f, text=text, fmt=fmt, problems=[moved], status=409)
    definition, unreadable = await asyncio.to_thread(read_definition, text, fmt)
    if unreadable is not None:
        return _editor(p, flow=f, text=text, fmt=fmt, problems=[unreadable], status=400)
    if _same(definition, f.definition):
        return redirect(f"/flows/{flow_id}?unchanged={f.version}")
    try:
        saved = await p.services.flows.update(p.who, flow_id, definition)
    except FlowhookError as exc:
        problems = await asyncio.to_thread(_problems, text, exc)
        return _editor(p, flow=f, text=text, fmt=fmt, problems=problems, status=400)
    return redirect(f"/flows/{flow_id}?saved={saved.version}")


def _same(a: Any, b: Any) -> bool:
    """The same JSON (``1`` and ``true`` differ, as they do to the engine; key order not)."""
    try:
        return orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
            b, option=orjson.OPT_SORT_KEYS
        )
    except (TypeError, orjson.JSONEncodeError):
        return False


def _version_param(text: str | None, default: int, newest: int) -> int:
    if text and text.isascii() and text.isdigit() and len(text) <= 10:
        return max(1, min(int(text), newest))
    return default


@router.get("/flows/{flow_id}/diff")
async def flow_diff(flow_id: str, p: Page = PageDep) -> Response:
    """Two versions of the flow compared (``?from=N&to=M``; by default the current one
    against the one before it)."""
    current = await p.services.flows.get(p.who, flow_id)
    q = p.request.query_params
    to = _version_param(q.get("to"), current.version, current.version)
    since = _version_param(q.get("from"), max(1, to - 1), current.version)
    old = await p.services.flows.get(p.who, flow_id, since)
    new = await p.services.flows.get(p.who, flow_id, to)
    versions = await p.services.flows.versions(p.who, flow_id)
    lines = diff_lines(old.definition, new.definition)
    return p.render(
        "flow_diff.html", f=current, old=old, new=new, lines=lines, versions=versions,
        changed=sum(1 for d in lines if d.kind in ("add", "del")),
        swap="?" + urlencode({"from": to, "to": since}),
    )  # fmt: skip
