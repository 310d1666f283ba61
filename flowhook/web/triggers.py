"""Settings → Triggers: what starts runs besides the API. Inbound hooks (their URL, which
flow or signal they feed, how they verify; rotate, delete) and schedules (cron and zone, the
next fire times, paused or not; pause, resume, delete), each naming its flow."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.cron import next_tick
from flowhook.errors import FlowhookError
from flowhook.web.pages import Page, PageDep, redirect

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

NEXT_SHOWN = 3
"""Fire times shown per schedule."""


def _fire_times(cron: str, timezone: str, first: datetime) -> list[datetime]:
    """``first`` and the ticks after it, :data:`NEXT_SHOWN` in all."""
    times = [first]
    while len(times) < NEXT_SHOWN:
        times.append(next_tick(cron, timezone, times[-1]))
    return times


async def _page(
    p: Page, *, notice: str | None = None, error: str | None = None, rotated: Any = None,
    status: int = 200,
) -> Response:  # fmt: skip
    hooks = (await p.services.hooks.list(p.who, limit=100, cursor=None)).data
    schedules = (await p.services.schedules.list(p.who, limit=100, cursor=None)).data
    names = await p.services.flows.names(
        p.who, [h.flow_id for h in hooks if h.flow_id] + [s.flow_id for s in schedules]
    )
    fires = {s.id: _fire_times(s.cron, s.timezone, s.next_run_at) for s in schedules}
    arrivals = await p.services.hooks.recent_arrivals(p.who) if hooks else {}
    settings = p.services.settings
    base = (settings.public_url or str(p.request.base_url)).rstrip("/")
    return p.render(
        "triggers.html", status, hooks=hooks, schedules=schedules, flow_names=names,
        fires=fires, base=base, notice=notice, error=error, rotated=rotated, arrivals=arrivals,
    )  # fmt: skip


@router.get("/settings/triggers")
async def triggers(p: Page = PageDep) -> Response:
    done = p.request.query_params.get("done") or None
    return await _page(p, notice=_NOTICES.get(done or ""))


_NOTICES = {
    "deleted-hook": "Hook deleted: its URL answers 404 now.",
    "paused": "Schedule paused: it starts no run until resumed.",
    "resumed": "Schedule resumed.",
    "deleted-schedule": "Schedule deleted.",
}


@router.post("/settings/triggers/hooks/{hook_id}/rotate")
async def hook_rotate(hook_id: str, p: Page = PageDep) -> Response:
    """A new URL (and secret): shown once on the page this answers with."""
    await p.form()
    try:
        hook = await p.services.hooks.rotate(p.who, hook_id)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, status=404)
    return await _page(p, notice="New URL made; the old one answers 404 now.", rotated=hook)


@router.post("/settings/triggers/hooks/{hook_id}/delete")
async def hook_delete(hook_id: str, p: Page = PageDep) -> Response:
    await p.form()
    try:
        await p.services.hooks.delete(p.who, hook_id)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, status=404)
    return redirect("/settings/triggers?done=deleted-hook")


@router.post("/settings/triggers/schedules/{schedule_id}/{action}")
async def schedule_action(schedule_id: str, action: str, p: Page = PageDep) -> Response:
    await p.form()
    changes: dict[str, Any] = {"pause": {"enabled": False}, "resume": {"enabled": True}}.get(
        action, {}
    )
    try:
        if action == "delete":
            await p.services.schedules.delete(p.who, schedule_id)
            return redirect("/settings/triggers?done=deleted-schedule")
        if not changes:
            return await _page(p, error=f"Unknown action {action!r}.", status=404)
        await p.services.schedules.update(p.who, schedule_id, changes)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, status=404)
    return redirect(f"/settings/triggers?done={'paused' if action == 'pause' else 'resumed'}")
