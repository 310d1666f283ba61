"""Settings → Webhooks: the endpoints, a new one's form, and an endpoint's own page (its
events, pace and order, secret, test event, failed deliveries and their recovery)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import InvalidInput
from flowhook.events import EVENT_TYPES
from flowhook.web.pages import Page, PageDep, first, redirect

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/settings/webhooks")
async def webhooks(p: Page = PageDep) -> Response:
    endpoints = (await p.services.webhooks.list_endpoints(p.who, limit=100, cursor=None)).data
    health = await p.services.webhooks.health(p.who, endpoints)
    return p.render(
        "webhooks.html", endpoints=endpoints, health=health, events=EVENT_TYPES, error=None,
        form={}, flows=await _flow_choices(p),
    )  # fmt: skip


async def _flow_choices(p: Page) -> list[Any]:
    """The flows an endpoint's filter may name, by name."""
    return list((await p.services.flows.list(p.who, limit=100, cursor=None)).data)


def _delivery_controls(fields: dict[str, list[str]]) -> dict[str, Any]:
    """An endpoint form's pace and order fields, as the service takes them (a rate that is
    not a number is left for the service to refuse, naming the field)."""
    given = first(fields, "rate_limit").strip()
    rate: Any = None
    if given:
        try:
            rate = float(given)
        except ValueError:
            rate = given
    flow_ids = [f for f in fields.get("flow_ids", []) if f]
    return {
        "rate_limit": rate,
        "ordering": "fifo" if first(fields, "fifo") else None,
        "filter": flow_ids or None,
    }


@router.post("/settings/webhooks")
async def webhooks_create(p: Page = PageDep) -> Response:
    fields = await p.form()
    url, description, chosen = (
        first(fields, "url").strip(),
        first(fields, "description"),
        fields.get("events", []),
    )
    controls = _delivery_controls(fields)
    try:
        ep = await p.services.webhooks.create_endpoint(
            p.who, url=url, events=chosen, description=description, **controls
        )
    except InvalidInput as exc:
        endpoints = (await p.services.webhooks.list_endpoints(p.who, limit=100, cursor=None)).data
        health = await p.services.webhooks.health(p.who, endpoints)
        form = {
            "url": url,
            "description": description,
            "events": chosen,
            "rate_limit": first(fields, "rate_limit"),
            "fifo": bool(controls["ordering"]),
            "flow_ids": controls["filter"],
        }
        return p.render(
            "webhooks.html", 400, endpoints=endpoints, health=health, events=EVENT_TYPES,
            error=exc.message, form=form, flows=await _flow_choices(p),
        )  # fmt: skip
    return redirect(f"/settings/webhooks/{ep.id}?created=1")


async def _endpoint_page(
    p: Page,
    endpoint_id: str,
    *,
    secret: bool = False,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response:
    ep = await p.services.webhooks.get_endpoint(p.who, endpoint_id)
    failed = await p.services.webhooks.list_deliveries(
        p.who, limit=20, cursor=None, status="failed", endpoint_id=ep.id
    )
    health = (await p.services.webhooks.health(p.who, [ep]))[ep.id]
    later = await p.services.webhooks.delivered_later(p.who, failed.data)
    created = p.request.query_params.get("created") == "1"
    return p.render(
        "endpoint.html", status, ep=ep, events=EVENT_TYPES, show_secret=secret or created, created=created,
        failed=failed.data, health=health, notice=notice, error=error, later=later,
        flows=await _flow_choices(p),
    )  # fmt: skip


@router.get("/settings/webhooks/{endpoint_id}")
async def endpoint(endpoint_id: str, p: Page = PageDep) -> Response:
    return await _endpoint_page(p, endpoint_id)


@router.post("/settings/webhooks/{endpoint_id}")
async def endpoint_action(endpoint_id: str, p: Page = PageDep) -> Response:
    fields = await p.form()
    action = first(fields, "action")
    hooks = p.services.webhooks
    try:
        if action == "events":
            await hooks.update_endpoint(
                p.who,
                endpoint_id,
                {
                    "events": fields.get("events", []),
                    "url": first(fields, "url") or None,
                    **_delivery_controls(fields),
                },
            )
            return await _endpoint_page(p, endpoint_id, notice="Saved.")
        if action == "pause":
            await hooks.pause_endpoint(p.who, endpoint_id)
            return await _endpoint_page(p, endpoint_id, notice="Paused: deliveries wait.")
        if action == "resume":
            await hooks.resume_endpoint(p.who, endpoint_id)
            return await _endpoint_page(p, endpoint_id, notice="Resumed: held deliveries go.")
        if action in ("enable", "disable"):
            await hooks.update_endpoint(p.who, endpoint_id, {"enabled": action == "enable"})
            return await _endpoint_page(
                p, endpoint_id, notice="Enabled." if action == "enable" else "Disabled."
            )
        if action == "delete":
            await hooks.delete_endpoint(p.who, endpoint_id)
            return redirect("/settings/webhooks")
        if action == "reveal":
            return await _endpoint_page(p, endpoint_id, secret=True)
        if action == "rotate":
            await hooks.rotate_secret(p.who, endpoint_id)
            return await _endpoint_page(
                p,
                endpoint_id,
                secret=True,
                notice="New secret made; the old one keeps signing for 24 h.",
            )
        if action == "test":
            await hooks.send_test(p.who, endpoint_id)
            return await _endpoint_page(p, endpoint_id, notice="Test event queued.")
        if action == "recover":
            since = datetime.fromisoformat(first(fields, "since")).replace(tzinfo=UTC)
            done = await hooks.recover(p.who, endpoint_id, since)
            return await _endpoint_page(
                p,
                endpoint_id,
                notice=f"Replaying {len(done.replayed)} failed deliveries ({done.skipped} already delivered).",
            )
    except InvalidInput as exc:
        return await _endpoint_page(p, endpoint_id, error=exc.message, status=400)
    except ValueError:
        return await _endpoint_page(
            p, endpoint_id, error="Pick a date and time to replay from.", status=400
        )
    return await _endpoint_page(p, endpoint_id, error=f"Unknown action {action!r}.", status=400)
