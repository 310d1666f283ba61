"""Deliveries: the list (failed ones first), one delivery with its attempts and the headers
it was signed with, and replaying it."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import NotFound
from flowhook.events import EVENT_TYPES
from flowhook.signing import build_headers, new_secret
from flowhook.web.pages import Page, PageDep, redirect

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/deliveries")
async def deliveries(p: Page = PageDep) -> Response:
    q = p.request.query_params
    status = q.get("status", "failed")
    endpoint_id, event = q.get("endpoint_id") or None, q.get("event") or None
    page_ = await p.services.webhooks.list_deliveries(
        p.who, limit=50, cursor=q.get("cursor") or None, status=status if status != "all" else None,
        endpoint_id=endpoint_id, event=event,
    )  # fmt: skip
    endpoints = (await p.services.webhooks.list_endpoints(p.who, limit=100, cursor=None)).data
    more = None
    if page_.next_cursor:
        more = "/deliveries?" + urlencode({**dict(q), "cursor": page_.next_cursor})
    later = await p.services.webhooks.delivered_later(p.who, page_.data)
    return p.render(
        "deliveries.html", rows=page_.data, status=status, endpoint_id=endpoint_id or "", event=event or "",
        endpoints=endpoints, events=EVENT_TYPES, more=more, later=later,
    )  # fmt: skip


@router.get("/deliveries/{delivery_id}")
async def delivery(delivery_id: str, p: Page = PageDep) -> Response:
    d, event = await p.services.webhooks.get_delivery(p.who, delivery_id)
    headers = None
    if event is not None:
        sample = build_headers(
            body=event.body, event_id=event.id, event_type=event.type, delivery_id=d.id,
            attempt=max(d.attempts, 1), secret=new_secret(), previous_secret=None,
            now=d.attempt_log[-1].started_at if d.attempt_log else d.created_at,
        )  # fmt: skip
        headers = "\n".join(
            f"{k}: {'(signature)' if 'ignature' in k else v}" for k, v in sample.items()
        )
    try:
        endpoint = await p.services.webhooks.get_endpoint(p.who, d.endpoint_id)
    except NotFound:
        endpoint = None  # deleted since
    return p.render(
        "delivery.html",
        d=d,
        endpoint=endpoint,
        event=event,
        headers=headers,
        notice=p.request.query_params.get("notice"),
    )


@router.post("/deliveries/{delivery_id}/replay")
async def delivery_replay(delivery_id: str, p: Page = PageDep) -> Response:
    await p.form()
    copy = await p.services.webhooks.replay(p.who, delivery_id)
    return redirect(f"/deliveries/{copy.id}?notice=Replay+queued")
