"""Runs: the list, a run's page (drawn by :mod:`flowhook.web.run_tree`, redrawn live on its
event stream), and what the page does to a run: cancel it, decide its approval, rerun it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import Conflict, InvalidInput, NotFound
from flowhook.events import EVENT_TYPES
from flowhook.service.sessions import session_hash
from flowhook.serving.streams import open_run_stream
from flowhook.store.models import RunStatus, RunStep
from flowhook.web.graph import called_flows, flow_graph, step_states
from flowhook.web.pages import COOKIE, Page, PageDep, first, redirect
from flowhook.web.run_tree import run_view

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/runs")
async def runs(p: Page = PageDep) -> Response:
    q = p.request.query_params
    status = q.get("status") or None
    waiting = q.get("waiting") if q.get("waiting") in _ASLEEP else None
    page_ = await p.services.runs.list(
        p.who,
        limit=50,
        cursor=q.get("cursor") or None,
        status=status,
        flow_id=q.get("flow_id") or None,
        asleep=_ASLEEP[waiting] if waiting else None,
    )
    more = (
        "/runs?" + urlencode({**dict(q), "cursor": page_.next_cursor})
        if page_.next_cursor
        else None
    )
    template = "runs_table.html" if q.get("partial") else "runs.html"
    await p.services.runs.explain(p.who, page_.data)
    names = await p.services.flows.names(p.who, [r.flow_id for r in page_.data])
    return p.render(
        template, rows=page_.data, status=status or "", more=more, statuses=_STATUSES,
        flow_names=names, waiting=waiting or "",
    )  # fmt: skip


_ASLEEP = {"approval": "approval", "signal": "wait"}
"""The runs list's ``?waiting=`` (the overview links to it): the step type those runs sleep
in."""


_STATUSES = [s.value for s in RunStatus]
"""The list's status filter, in the enum's order."""


@router.get("/runs/{run_id}")
async def run(run_id: str, p: Page = PageDep) -> Response:
    return await _run_page(p, run_id)


@router.get("/runs/{run_id}/stream")
async def run_stream(run_id: str, p: Page = PageDep) -> Response:
    """The run's events as Server-Sent Events, for its page (the API's stream, signed in
    with the session instead of a key). ``?after=`` is the last event the page was drawn
    with, so the stream starts after it (``Last-Event-ID``, on a reconnect, wins)."""
    last = p.request.headers.get("last-event-id") or p.request.query_params.get("after")
    session = session_hash(p.request.cookies.get(COOKIE, ""))  # signing out ends the stream
    return await open_run_stream(p.request, p.services, p.who, run_id, last, session)


async def _run_page(p: Page, run_id: str, code: int = 200, error: str | None = None) -> Response:
    r = await p.services.runs.get(p.who, run_id)
    events = await p.services.runs.events(p.who, run_id)
    sent = await p.services.webhooks.list_deliveries(p.who, limit=100, cursor=None, run_id=run_id)
    template = "run_body.html" if p.request.query_params.get("partial") else "run.html"
    children = await p.services.runs.children(p.who, run_id)
    names = {c.flow_id: await _flow_name(p, c.flow_id) for c in children.values()}
    view = run_view(r, datetime.now(UTC))
    tasks = await p.services.tasks.of_run(p.who, run_id) if _has_tasks(r.steps) else []
    graph = await _graph(p, r)
    caller = (getattr(r, "scope", None) or {}).get("caller", r.parent_run_id)
    return p.render(
        template,
        code,
        r=r,
        caller_flow=await _caller_flow(p, caller) if caller else None,
        flow_name=await _flow_name(p, r.flow_id),
        graph=graph,
        tree=view.tree,
        decidable=view.decidable,
        children=children,
        child_flow_names=names,
        events=events,
        deliveries=sent.data,
        notice=p.request.query_params.get("notice"),
        error=error,
        stream_events=" ".join(EVENT_TYPES),
        between_steps=view.between_steps,
        tasks_at={t.idx: t for t in tasks if t.run_id == r.run_id},
    )


async def _caller_flow(p: Page, run_id: str) -> str | None:
    """The name of the flow of the run that started this one (its parent), when known."""
    try:
        caller = await p.services.runs.get(p.who, run_id)
    except NotFound:
        return None
    return await _flow_name(p, caller.flow_id)


async def _graph(p: Page, r: Any) -> Any:
    """The run's flow version drawn, each step coloured by its status here (``None`` once
    the flow is archived or gone)."""
    try:
        definition = (await p.services.flows.get(p.who, r.flow_id, r.flow_version)).definition
    except NotFound:
        return None
    called = await p.services.flows.names(p.who, called_flows(definition))
    return flow_graph(definition, flow_names=called, status=step_states(r.steps))


def _has_tasks(steps: list[RunStep]) -> bool:
    return any(s.type == "task" for s in steps)


async def _flow_name(p: Page, flow_id: str) -> str | None:
    """The flow's name, or ``None`` when it is archived or gone."""
    try:
        return (await p.services.flows.get(p.who, flow_id)).name
    except NotFound:
        return None


@router.post("/runs/{run_id}/cancel")
async def run_cancel(run_id: str, p: Page = PageDep) -> Response:
    await p.form()
    await p.services.runs.cancel(p.who, run_id)
    return redirect(f"/runs/{run_id}?notice=Cancel+requested")


@router.post("/runs/{run_id}/steps/{step_id}/decide")
async def run_decide(run_id: str, step_id: str, p: Page = PageDep) -> Response:
    """Approve or reject a run's ``approval`` step from its page."""
    fields = await p.form()
    approve = first(fields, "decision") == "approve"
    try:
        await p.services.approvals.decide(
            p.who, run_id, step_id, approve=approve, comment=first(fields, "comment") or None,
            by=f"the settings screen ({await p.services.keys.describe(p.who.key_id)})",
        )  # fmt: skip
    except (Conflict, InvalidInput) as exc:
        return await _run_page(p, run_id, 409 if isinstance(exc, Conflict) else 400, exc.message)
    notice = f"Step {step_id} {'approved' if approve else 'rejected'}"
    return redirect(f"/runs/{run_id}?" + urlencode({"notice": notice}))


@router.post("/runs/{run_id}/rerun")
async def run_rerun(run_id: str, p: Page = PageDep) -> Response:
    """Rerun from the step the form names (``from_step``), or from the first step with no
    result; a refusal (a step before it has no result) shows on the run's page."""
    fields = await p.form()
    from_step = first(fields, "from_step") or None
    try:
        started = await p.services.runs.rerun(p.who, run_id, from_step=from_step)
    except InvalidInput as exc:
        return await _run_page(p, run_id, 400, f"Cannot rerun: {exc.message}")
    where = f"step {from_step}" if from_step else "its first unfinished step"
    notice = f"Rerun of {run_id} from {where}"
    return redirect(f"/runs/{started.run.run_id}?" + urlencode({"notice": notice}))
