"""Workers: the workers of this workspace and mode seen lately (what they run, what they hold)
and each task name's queue (how many wait, for how long), beside the way to start one."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.web.pages import Page, PageDep

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/workers")
async def workers(p: Page = PageDep) -> Response:
    seen = await p.services.tasks.workers(p.who)
    queues = await p.services.tasks.queues(p.who)
    now = p.services.clock.now()
    widest = max([q.waiting + q.running for q in queues], default=0)
    return p.render(
        "workers.html",
        workers=[(w, (now - w.last_seen_at).total_seconds()) for w in seen],
        queues=[
            (q, None if q.oldest_at is None else (now - q.oldest_at).total_seconds())
            for q in queues
        ],
        widest=widest,
    )
