"""The overview page (``/overview``), where a signed-in browser lands: the session's workspace
and mode at a glance, runs over the last hour and day, durations by flow, webhook success by
endpoint, and what waits now."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.service.overview import HOUR, MINUTE, Overview
from flowhook.store.overview import COUNT_CAP, DURATION_SAMPLE, EndpointRate, FlowDurations
from flowhook.web import charts
from flowhook.web.pages import Page, PageDep

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True, slots=True)
class DurationRow:
    flow: FlowDurations
    p50: float
    """The p50 bar's width, percent of the longest p95 on the page."""
    p95: float


@dataclass(frozen=True, slots=True)
class EndpointRow:
    endpoint: EndpointRate
    ok: float
    """The succeeded part of the bar (percent of those that ended); the rest failed."""
    tone: str
    """``ok`` from 99 %, ``wait`` from 90 %, else ``bad``; ``off`` with nothing ended."""


def _durations(found: list[FlowDurations]) -> list[DurationRow]:
    longest = max((f.p95_ms for f in found), default=0.0)
    return [
        DurationRow(
            f, charts.share(int(f.p50_ms), int(longest)), charts.share(int(f.p95_ms), int(longest))
        )
        for f in found
    ]


def _endpoints(found: list[EndpointRate]) -> list[EndpointRow]:
    rows = []
    for e in found:
        rate = e.rate
        tone = "off" if rate is None else "ok" if rate >= 0.99 else "wait" if rate >= 0.9 else "bad"
        rows.append(EndpointRow(e, charts.share(e.succeeded, e.succeeded + e.failed), tone))
    return rows


def _view(o: Overview) -> dict[str, Any]:
    hour = charts.stacked(
        o.last_hour, width=MINUTE, time_format="%H:%M",
        marks=("60 min ago", "45 min", "30 min ago", "15 min", "now"),
    )  # fmt: skip
    day = charts.stacked(
        o.last_day, width=HOUR, time_format="%H:%M",
        marks=("24 h ago", "18 h", "12 h ago", "6 h", "now"),
    )  # fmt: skip
    b = o.backlog
    return {
        "o": o,
        "hour": hour,
        "day": day,
        "statuses": charts.STACK_ORDER,
        "durations": _durations(o.durations),
        "endpoints": _endpoints(o.endpoints),
        "cap": COUNT_CAP,
        "sample": DURATION_SAMPLE,
        "oldest_due": (o.now - b.oldest_due_at).total_seconds() if b.oldest_due_at else None,
        "oldest_pending": (
            (o.now - b.oldest_pending_at).total_seconds() if b.oldest_pending_at else None
        ),
    }


@router.get("/overview")
async def overview(p: Page = PageDep) -> Response:
    found = await p.services.overview.get(p.who)
    settings = p.services.settings
    return p.render(
        "overview.html",
        **_view(found),
        retention_days=settings.retention_days,
        delivery_days=min(settings.delivery_retention_days, settings.retention_days),
    )
