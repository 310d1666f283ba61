"""What starts or resumes runs besides ``runs start``: ``flowhook hooks`` (inbound URLs),
``flowhook schedules`` (cron) and ``flowhook signals``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from flowhook.cli_remote.connection import client, flow_names, resolve_flow
from flowhook.cli_remote.output import (
    console,
    err,
    listing,
    out_json,
    parse_json,
    parse_json_object,
    shown,
)
from flowhook.cli_remote.params import FlowToRunArg, HookArg, JsonOpt, ScheduleArg

__all__ = ["hooks", "schedules", "signals"]

hooks = typer.Typer(help="Inbound hooks.", no_args_is_help=True)
schedules = typer.Typer(help="Cron schedules.", no_args_is_help=True)
signals = typer.Typer(help="Signals that resume runs waiting in a wait step.", no_args_is_help=True)


@hooks.command("create")
def hooks_create(
    flow_id: Annotated[
        str | None, typer.Argument(help="The flow each POST starts a run of.", show_default=False)
    ] = None,
    signal: Annotated[
        str | None,
        typer.Option("--signal", help="Instead of a flow: each POST sends this signal."),
    ] = None,
    verify: Annotated[str | None, typer.Option("--verify", help="hmac or standard")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a public URL whose POSTs start runs of FLOW_ID, or send a signal (--signal NAME)
    with the POST's body as its data."""
    if (flow_id is None) == (signal is None):
        raise typer.BadParameter("give a FLOW_ID or --signal NAME (one of the two)")
    with client() as c:
        h = c.create_hook(flow_id, {"type": verify} if verify else None, signal=signal)
    does = f"sends signal {h['signal']}" if h.get("signal") else f"starts runs of {h['flow_id']}"
    shown(
        h,
        as_json,
        lambda: (
            f"{h['id']} ({does})\nPOST {h['url']}"
            + (f"\nsecret: {h['verify']['secret']}" if h.get("verify") else "")
        ),
    )


def _hook_does(h: dict[str, Any], names: dict[str, str]) -> str:
    if h.get("signal"):
        return f"sends signal {h['signal']}"
    name = names.get(h["flow_id"])
    return f"starts runs of {h['flow_id']}" + (f" ({name})" if name else "")


@hooks.command("list")
def hooks_list(as_json: JsonOpt = False) -> None:
    """List inbound hooks: what each POST does, and its URL."""
    with client() as c:
        data = c.list_hooks()
        names = flow_names(c) if data and not as_json else {}
    listing(
        data,
        as_json,
        ["id", "does", "verify", "url"],
        lambda h: [
            h["id"],
            _hook_does(h, names),
            (h.get("verify") or {}).get("type") or "none",
            h["url"],
        ],
        "no hooks",
    )


@hooks.command("show")
def hooks_show(hook_id: HookArg, as_json: JsonOpt = False) -> None:
    """Show an inbound hook (its secret is shown only when made or rotated)."""
    with client() as c:
        h = c.get_hook(hook_id)
        names = flow_names(c) if not as_json and h.get("flow_id") else {}
    if as_json:
        out_json(h)
        return
    console.print(f"{h['id']} ({_hook_does(h, names)})\nPOST {escape(h['url'])}")
    verify = h.get("verify") or {}
    console.print(f"  verify: {verify.get('type') or 'none'}")
    if h.get("rate_limit"):
        console.print(f"  rate limit: {h['rate_limit']:g}/s")
    console.print(f"  created: {h['created_at']}")


@hooks.command("rotate")
def hooks_rotate(hook_id: HookArg, as_json: JsonOpt = False) -> None:
    """Move a hook to a new id and URL (and a new secret when it verifies); the old URL
    answers 404 at once."""
    with client() as c:
        h = c.rotate_hook(hook_id)
    secret = (h.get("verify") or {}).get("secret")
    shown(
        h,
        as_json,
        lambda: (
            f"{hook_id} is now {h['id']}: POST {h['url']}"
            + (f"\nsecret: {secret}" if secret else "")
        ),
    )


@hooks.command("delete")
def hooks_delete(hook_id: HookArg) -> None:
    """Delete an inbound hook: its URL answers 404 from now on."""
    with client() as c:
        c.delete_hook(hook_id)
    console.print(f"{hook_id} deleted")


@schedules.command("create")
def schedules_create(
    flow: FlowToRunArg,
    cron: Annotated[str, typer.Option("--cron", help="Five fields, such as `*/5 * * * *`.")],
    timezone: Annotated[
        str, typer.Option("--timezone", help="An IANA time zone, such as Europe/Paris.")
    ] = "UTC",
    payload: Annotated[
        str, typer.Option("--payload", help="A JSON object each run is handed.")
    ] = "{}",
    as_json: JsonOpt = False,
) -> None:
    """Run a flow on a cron schedule (trigger `schedule`); prints its next run."""
    with client() as c:
        flow_id = resolve_flow(c, flow)
        s = c.create_schedule(flow_id, cron, timezone, parse_json(payload, "--payload"))
    shown(
        s,
        as_json,
        lambda: f"{s['id']} {s['cron']} ({s['timezone']}) next run {s.get('next_run_at')}",
    )


@schedules.command("list")
def schedules_list(as_json: JsonOpt = False) -> None:
    """List cron schedules, each with its flow's name and its next run."""
    with client() as c:
        data = c.list_schedules()
        names = flow_names(c) if data and not as_json else {}
    listing(
        data,
        as_json,
        ["id", "flow", "cron", "timezone", "state", "next run"],
        lambda s: [
            s["id"],
            f"{names.get(s['flow_id'], '')} {s['flow_id']}".strip(),
            s["cron"],
            s["timezone"],
            "active" if s["enabled"] else "paused",
            s.get("next_run_at") if s["enabled"] else "",
        ],
        "no schedules",
    )


def _switch(schedule_id: str, enabled: bool, as_json: bool) -> None:
    with client() as c:
        s = c.update_schedule(schedule_id, enabled=enabled)
    shown(
        s,
        as_json,
        lambda: (
            f"{s['id']} "
            + (
                f"resumed: next run {s.get('next_run_at')}"
                if enabled
                else "paused: no run until resumed"
            )
        ),
    )


@schedules.command("pause")
def schedules_pause(schedule_id: ScheduleArg, as_json: JsonOpt = False) -> None:
    """Pause a schedule: it starts no run until resumed (the runs it missed are not made up)."""
    _switch(schedule_id, False, as_json)


@schedules.command("resume")
def schedules_resume(schedule_id: ScheduleArg, as_json: JsonOpt = False) -> None:
    """Resume a paused schedule from its next time on."""
    _switch(schedule_id, True, as_json)


@schedules.command("delete")
def schedules_delete(schedule_id: ScheduleArg) -> None:
    """Delete a schedule: it starts no more runs; the runs it started are kept."""
    with client() as c:
        c.delete_schedule(schedule_id)
    console.print(f"{schedule_id} deleted")


@signals.command("send")
def signals_send(
    name: Annotated[str, typer.Argument(help="The signal's name, such as order.paid.")],
    data: Annotated[
        str, typer.Option("--data", help="A JSON object: what the resumed steps see as data.")
    ] = "{}",
    run_id: Annotated[
        str | None, typer.Option("--run", help="Send it to this run only (run_…).")
    ] = None,
    signal_id: Annotated[
        str | None,
        typer.Option("--id", help="Your id for it: the same id again is the same signal."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a signal: it resumes the runs waiting for it now, and counts for runs queued
    before it that reach their wait step later."""
    body = parse_json_object(data, "--data")
    if run_id is not None and signal_id is not None:
        err.print("[red]error:[/red] --id applies to a broadcast signal, not one sent with --run")
        raise typer.Exit(2)
    with client() as c:
        sent = c.send_signal(name, body, id=signal_id, run_id=run_id)
    shown(sent, as_json, lambda: f"{sent['id']} sent: resumed {sent['matched']} waiting step(s)")
