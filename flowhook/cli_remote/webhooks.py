"""``flowhook endpoints`` (add, list, show, test, pause, resume, delete) and ``flowhook deliveries`` (list,
replay): the webhooks this service sends."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from flowhook.cli_remote.connection import client
from flowhook.cli_remote.output import console, listing, out_json, shown
from flowhook.cli_remote.params import EndpointArg, JsonOpt, LimitOpt

__all__ = ["endpoints", "deliveries"]

endpoints = typer.Typer(help="Webhook endpoints.", no_args_is_help=True)
deliveries = typer.Typer(help="Webhook deliveries.", no_args_is_help=True)


@endpoints.command("add")
def endpoints_add(
    url: str,
    events: Annotated[str, typer.Option("--events", help="Comma-separated event names.")],
    description: Annotated[str, typer.Option("--description")] = "",
    rate_limit: Annotated[
        float | None, typer.Option("--rate-limit", help="At most this many deliveries a second.")
    ] = None,
    fifo: Annotated[
        bool, typer.Option("--fifo", help="One delivery in flight, in event order.")
    ] = False,
    flow: Annotated[
        list[str] | None,
        typer.Option("--flow", help="Only events of this flow (wf_…); repeat for more."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a webhook endpoint; prints its signing secret (shown once)."""
    with client() as c:
        ep = c.create_endpoint(
            url, [e.strip() for e in events.split(",") if e.strip()], description,
            rate_limit=rate_limit, fifo=fifo, flow_ids=flow or None,
        )  # fmt: skip
    shown(
        ep,
        as_json,
        lambda: (
            f"{ep['id']} {ep['url']}\nsecret: {ep['secret']}  [dim](verify X-Service-Signature with it)[/dim]"
        ),
    )


@endpoints.command("list")
def endpoints_list(as_json: JsonOpt = False) -> None:
    """List webhook endpoints: each one's URL, events and state."""
    with client() as c:
        data = c.list_endpoints()
    listing(
        data,
        as_json,
        ["id", "url", "description", "events", "state"],
        lambda e: [
            e["id"],
            e["url"],
            e.get("description") or "",
            ", ".join(e["events"]),
            _state(e),
        ],
        "no endpoints",
    )


@endpoints.command("show")
def endpoints_show(endpoint_id: EndpointArg, as_json: JsonOpt = False) -> None:
    """Show an endpoint: its URL, events, state and settings (never its secret)."""
    with client() as c:
        ep = c.get_endpoint(endpoint_id)
    if as_json:
        out_json(ep)
        return
    state = _state(ep)
    if not ep["enabled"]:
        state += f" ({ep.get('disabled_reason') or 'by hand'})"
    console.print(f"{ep['id']} {escape(ep['url'])}")
    for label, value in (
        ("description", ep.get("description")),
        ("events", ", ".join(ep["events"])),
        ("state", state),
        ("failing since", ep.get("failing_since")),
        ("rate limit", f"{ep['rate_limit']:g}/s" if ep.get("rate_limit") else None),
        ("ordering", ep.get("ordering")),
        ("flows", ", ".join((ep.get("filter") or {}).get("flow_ids") or []) or None),
        ("created", ep["created_at"]),
    ):
        if value:
            console.print(f"  {label}: {escape(str(value))}")


@endpoints.command("test")
def endpoints_test(endpoint_id: EndpointArg, as_json: JsonOpt = False) -> None:
    """Send the endpoint a test event (webhook.test), signed as every event is."""
    with client() as c:
        event = c.test_endpoint(endpoint_id)
    shown(
        event,
        as_json,
        lambda: (
            f"{event['id']} {event['event']} queued for {endpoint_id}: "
            "`flowhook deliveries list` shows how it went"
        ),
    )


def _state(ep: dict[str, Any]) -> str:
    if not ep["enabled"]:
        return "disabled"
    return f"paused since {ep['paused_at']}" if ep.get("paused") else "enabled"


@endpoints.command("pause")
def endpoints_pause(endpoint_id: EndpointArg) -> None:
    """Pause an endpoint: its deliveries wait, using no attempts, until `flowhook endpoints
    resume`; an attempt under way finishes."""
    with client() as c:
        c.pause_endpoint(endpoint_id)
    console.print(
        f"{endpoint_id} paused: its deliveries wait until `flowhook endpoints resume {endpoint_id}`"
    )


@endpoints.command("resume")
def endpoints_resume(endpoint_id: EndpointArg) -> None:
    """Resume a paused endpoint: the deliveries it held are sent oldest first."""
    with client() as c:
        c.resume_endpoint(endpoint_id)
    console.print(f"{endpoint_id} resumed: what it held is sent oldest first")


@endpoints.command("delete")
def endpoints_delete(endpoint_id: EndpointArg) -> None:
    """Delete an endpoint: nothing more is sent to it, its deliveries are kept."""
    with client() as c:
        c.delete_endpoint(endpoint_id)
    console.print(f"{endpoint_id} deleted")


@deliveries.command("list")
def deliveries_list(
    failed: Annotated[bool, typer.Option("--failed", help="Only failed deliveries.")] = False,
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
) -> None:
    """List webhook deliveries, newest first: the event, where it went, how it went."""
    with client() as c:
        data = c.list_deliveries(status="failed" if failed else None, limit=limit)
        urls = {e["id"]: e["url"] for e in c.list_endpoints()} if data and not as_json else {}
    listing(
        data,
        as_json,
        ["id", "event", "endpoint", "status", "attempts", "last error", "run_id"],
        lambda d: [
            d["id"],
            d["event"],
            urls.get(d["endpoint_id"], d["endpoint_id"]),
            d["status"],
            d["attempts"],
            d["last_error"],
            d["run_id"],
        ],
        "no failed deliveries" if failed else "no deliveries",
    )


@deliveries.command("replay")
def deliveries_replay(
    delivery_id: Annotated[str, typer.Argument(help="The delivery (dlv_…).")],
    as_json: JsonOpt = False,
) -> None:
    """Send a delivery's event again, signed anew, as a new delivery (failed or not)."""
    with client() as c:
        d = c.replay_delivery(delivery_id)
    shown(d, as_json, lambda: f"{d['id']} queued (replay of {d['replay_of']})")
