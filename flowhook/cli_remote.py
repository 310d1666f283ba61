"""CLI commands that talk to a running Flowhook over HTTP through the SDK
(``FLOWHOOK_URL``, ``FLOWHOOK_API_KEY``): flows, runs, endpoints, deliveries, hooks, schedules.
Lists print tables; ``--json`` prints what the API answered."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flowhook.cli_watch import follow, print_step, wait_quietly, watch
from flowhook.client import APIError, Client, FlowhookClientError, Run, RunAccepted

__all__ = ["register"]

console = Console()
err = Console(stderr=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@contextmanager
def client() -> Iterator[Client]:
    url = os.environ.get("FLOWHOOK_URL", "http://127.0.0.1:8080")
    key = os.environ.get("FLOWHOOK_API_KEY")
    if not key:
        err.print(
            "[red]error:[/red] set FLOWHOOK_API_KEY to a sandbox or live key (and FLOWHOOK_URL if not local)"
        )
        raise typer.Exit(2)
    try:
        with Client(url, key) as c:
            yield c
    except APIError as exc:
        err.print(f"[red]error {exc.status}:[/red] {exc.error} [dim]({exc.code})[/dim]")
        raise typer.Exit(1) from None
    except FlowhookClientError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except httpx.ConnectError:
        err.print(
            f"[red]error:[/red] cannot reach Flowhook at {escape(url)}: is `flowhook serve` "
            "running? Set FLOWHOOK_URL otherwise.",
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    except (httpx.TransportError, OSError) as exc:  # a timeout, a connection cut short
        err.print(
            f"[red]error:[/red] the request to {escape(url)} failed: {_said(exc)}", soft_wrap=True
        )
        raise typer.Exit(1) from None


def _said(exc: BaseException) -> str:
    """An outside failure in words: its message, or its kind when it has none."""
    return escape(str(exc)) or type(exc).__name__


def out_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


_AN_ID = re.compile(r"[a-z]+_[0-9a-z]{20,}")
"""The shape of this service's ids (``run_…``, ``dlv_…``): a table never cuts one, as a cut
id is one no command takes."""


def table(columns: list[str], rows: list[list[Any]], empty: str) -> None:
    if not rows:
        console.print(f"[dim]{empty}[/dim]")
        return
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    t = Table()
    for i, name in enumerate(columns):
        values = [row[i] for row in cells if row[i]]
        if values and all(_AN_ID.fullmatch(v) for v in values):
            # whole on one line, whatever the terminal's width: the other columns give way
            t.add_column(name, no_wrap=True, min_width=max(map(len, values)))
        else:
            t.add_column(name)
    for row in cells:
        t.add_row(*row)
    console.print(t)


def listing(
    data: list[Any], as_json: bool, columns: list[str], row: Callable[[Any], list[Any]], empty: str
) -> None:
    """A list command's answer: the items as JSON, or a table of ``row(item)`` each."""
    if as_json:
        out_json(data)
        return
    table(columns, [row(x) for x in data], empty)


def shown(value: Any, as_json: bool, text: Callable[[], str]) -> None:
    """A command's answer about one thing: ``value`` as JSON, or the line ``text()``."""
    if as_json:
        out_json(value)
    else:
        console.print(text())


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        err.print(f"[red]error:[/red] {what} is not valid JSON: {exc}")
        raise typer.Exit(2) from None


flows = typer.Typer(help="Flow definitions.", no_args_is_help=True)
runs = typer.Typer(help="Start, follow and cancel runs.", no_args_is_help=True)
endpoints = typer.Typer(help="Webhook endpoints.", no_args_is_help=True)
deliveries = typer.Typer(help="Webhook deliveries.", no_args_is_help=True)
hooks = typer.Typer(help="Inbound hooks.", no_args_is_help=True)
schedules = typer.Typer(help="Cron schedules.", no_args_is_help=True)
signals = typer.Typer(help="Signals that resume runs waiting in a wait step.", no_args_is_help=True)


@flows.command("apply")
def flows_apply(
    file: Annotated[
        Path,
        typer.Option(
            "-f", "--file", help="A flow definition, YAML or JSON.", exists=True, dir_okay=False
        ),
    ],
    flow_id: Annotated[
        str | None, typer.Option("--flow-id", help="Save as a new version of this flow.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a flow, or a new version of it when --flow-id is given or a flow of the same name exists."""
    try:
        definition = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        err.print(f"[red]error:[/red] {file} is not valid YAML or JSON: {exc}")
        raise typer.Exit(2) from None
    if not isinstance(definition, dict):
        err.print(f"[red]error:[/red] {file} must hold a flow definition (a mapping)")
        raise typer.Exit(2)
    with client() as c:
        if flow_id is None:
            same = [f for f in c.list_flows() if f["name"] == definition.get("name")]
            flow_id = same[0]["flow_id"] if same else None
        saved = c.update_flow(flow_id, definition) if flow_id else c.create_flow(definition)
    shown(
        saved,
        as_json,
        lambda: f"{saved['flow_id']} [bold]{saved['name']}[/bold] version {saved['version']}",
    )


@flows.command("list")
def flows_list(as_json: JsonOpt = False) -> None:
    """List flows: each one's id, name, current version and number of steps."""
    with client() as c:
        data = c.list_flows()
    listing(
        data,
        as_json,
        ["flow_id", "name", "version", "steps", "updated"],
        lambda f: [
            f["flow_id"],
            f["name"],
            f["version"],
            len(f["definition"]["steps"]),
            f["updated_at"],
        ],
        "no flows",
    )


def resolve_flow(c: Client, flow: str) -> str:
    """The id of ``flow``: an id as it is, else the one flow of that name (exact, then
    ignoring case); a clear error, exit 2, for none or several."""
    if flow.startswith("wf_"):
        return flow
    every = c.list_flows()
    exact = [f for f in every if f["name"] == flow]
    found = exact or [f for f in every if f["name"].lower() == flow.lower()]
    if len(found) == 1:
        return str(found[0]["flow_id"])
    if len(found) > 1:
        ids = ", ".join(f["flow_id"] for f in found)
        err.print(f"[red]error:[/red] {len(found)} flows are named {flow!r} ({ids}); give its id")
        raise typer.Exit(2)
    err.print(f"[red]error:[/red] no flow is named {flow!r}; `flowhook flows list` shows them")
    raise typer.Exit(2)


@flows.command("show")
def flows_show(
    flow: Annotated[str, typer.Argument(help="The flow: its id (wf_…) or its name.")],
    as_json: JsonOpt = False,
) -> None:
    """Show a flow: its name, id, current version and steps."""
    with client() as c:
        found = c.get_flow(resolve_flow(c, flow))
    if as_json:
        out_json(found)
        return
    console.print(
        f"{found['flow_id']} [bold]{escape(found['name'])}[/bold] version {found['version']}"
    )
    for step in found["definition"]["steps"]:
        console.print(f"  {step['id']} [dim]{step['type']}[/dim]")


@flows.command("versions")
def flows_versions(
    flow: Annotated[str, typer.Argument(help="The flow: its id (wf_…) or its name.")],
    as_json: JsonOpt = False,
) -> None:
    """List a flow's versions, newest first (a run keeps the version it started on)."""
    with client() as c:
        data = c.flow_versions(resolve_flow(c, flow))
    listing(
        data,
        as_json,
        ["version", "created"],
        lambda v: [v["version"], v["created_at"]],
        "no versions",
    )


@flows.command("delete")
def flows_delete(
    flow: Annotated[str, typer.Argument(help="The flow: its id (wf_…) or its name.")],
) -> None:
    """Archive a flow: executing it answers 404 from now on; its runs and versions are kept."""
    with client() as c:
        flow_id = resolve_flow(c, flow)
        c.delete_flow(flow_id)
    console.print(f"{flow_id} deleted (archived: its runs are kept)")


@runs.command("start")
def runs_start(
    flow_id: Annotated[str, typer.Argument(help="The flow to run: its id (wf_…) or its name.")],
    payload: Annotated[
        str, typer.Option("--payload", help="A JSON object handed to the flow.")
    ] = "{}",
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the run and exit 0 only if it completes.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="How long --wait follows, seconds.")] = 600,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a run; with --wait, show its steps as they finish and its final status."""
    body = parse_json(payload, "--payload")
    if not isinstance(body, dict):
        err.print("[red]error:[/red] --payload must be a JSON object")
        raise typer.Exit(2)
    with client() as c:
        accepted = c.execute(resolve_flow(c, flow_id), body, idempotency_key=idempotency_key)
        _answer(c, accepted, wait=wait, timeout=timeout, as_json=as_json)


def _answer(c: Client, accepted: RunAccepted, *, wait: bool, timeout: float, as_json: bool) -> None:
    """Print a started run; with ``wait``, follow it and exit 0 only if it completes."""
    if not wait:
        if as_json:
            out_json(_fields(accepted))
        else:
            console.print(f"{accepted.run_id} queued")
        return
    if not as_json:
        console.print(f"{accepted.run_id} [dim]queued, following…[/dim]")
    run = (
        follow(c, accepted.run_id, timeout, console)
        if not as_json
        else wait_quietly(c, accepted.run_id, timeout)
    )
    if as_json:
        out_json(run.raw)
    else:
        _ended(run)
    raise typer.Exit(0 if run.status == "completed" else 1)


def _ended(run: Run) -> None:
    colour = {"completed": "green", "failed": "red"}.get(run.status, "yellow")
    console.print(
        f"[{colour}]{run.status}[/{colour}] in {run.duration_ms} ms"
        + (f": {escape(str(run.error['message']))}" if run.error else "")
    )


def _fields(accepted: RunAccepted) -> dict[str, Any]:
    names = ("run_id", "flow_id", "status", "queued_at", "rerun_of")
    values = {k: getattr(accepted, k) for k in names}
    return {k: v for k, v in values.items() if v is not None}


@runs.command("rerun")
def runs_rerun(
    run_id: Annotated[str, typer.Argument(help="The finished run to rerun (run_…).")],
    from_step: Annotated[
        str | None,
        typer.Option(
            "--from-step",
            help="The step to run first; the steps before it are reused. "
            "Default: the first step with no result.",
        ),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option(
            "--version", help="The flow version to run: N or latest (default: the run's)."
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="A new JSON object payload (default: the run's)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the new run and exit 0 only if it completes.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="How long --wait follows, seconds.")] = 600,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Rerun a finished run from a step: the steps before it are not run again."""
    flow_version: int | str | None = version
    if version is not None and version != "latest":
        if not (version.isascii() and version.isdigit()) or int(version) < 1:
            err.print(f"[red]error:[/red] --version must be a number or latest, not {version!r}")
            raise typer.Exit(2)
        flow_version = int(version)
    body = None if payload is None else parse_json(payload, "--payload")
    if body is not None and not isinstance(body, dict):
        err.print("[red]error:[/red] --payload must be a JSON object")
        raise typer.Exit(2)
    with client() as c:
        accepted = c.rerun(
            run_id,
            from_step=from_step,
            flow_version=flow_version,
            payload=body,
            idempotency_key=idempotency_key,
        )
        if not as_json and not wait:
            console.print(f"{accepted.run_id} queued (rerun of {run_id})")
            return
        _answer(c, accepted, wait=wait, timeout=timeout, as_json=as_json)


def _run_row(r: Run, names: dict[str, str]) -> list[Any]:
    return [
        r.run_id, names.get(r.flow_id, ""), r.flow_id, r.status, r.steps_executed, r.duration_ms,
        r.queued_at,
    ]  # fmt: skip


@runs.command("list")
def runs_list(
    flow: Annotated[
        str | None, typer.Option("--flow", help="Only runs of this flow: its id or its name.")
    ] = None,
    status: Annotated[
        str | None,
        typer.Option("--status", help="Only runs in this status: queued, running, completed…"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """List runs, newest first, with their flow's name."""
    with client() as c:
        flow_id = resolve_flow(c, flow) if flow is not None else None
        data = c.list_runs(flow_id=flow_id, status=status, limit=limit)
        names = flow_names(c) if data and not as_json else {}
    if as_json:
        out_json([r.raw for r in data])
        return
    table(
        ["run_id", "flow", "flow_id", "status", "steps", "ms", "queued_at"],
        [_run_row(r, names) for r in data],
        "no runs",
    )


RunArg = Annotated[str, typer.Argument(help="The run (run_…).")]


@runs.command("show")
def runs_show(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Show a run: its status, each step with its duration, its error or output."""
    with client() as c:
        run = c.get_run(run_id)
        name = None if as_json else flow_names(c).get(run.flow_id)
    if as_json:
        out_json(run.raw)
        return
    flow = f"{escape(name)} ({run.flow_id})" if name else run.flow_id
    console.print(f"{run.run_id} [bold]{run.status}[/bold] flow {flow}")
    for step in run.steps:
        print_step(console, step)
    if run.error:
        console.print(f"[red]error:[/red] {run.error}")
    if run.output is not None:
        console.print_json(json.dumps(run.output))


@runs.command("watch")
def runs_watch(
    run_id: Annotated[str, typer.Argument(help="The run to watch (run_…).")],
) -> None:
    """Watch a run live: a table of its steps with their status and duration, updated as
    its events come (a line per event when the output is not a terminal). Exits when the
    run ends: 0 if it completed, 1 otherwise (as runs start --wait)."""
    with client() as c:
        run = watch(c, run_id, console)
    _ended(run)
    raise typer.Exit(0 if run.status == "completed" else 1)


def _decide(run_id: str, step_id: str, comment: str | None, approve: bool, as_json: bool) -> None:
    with client() as c:
        decided = (c.approve if approve else c.reject)(run_id, step_id, comment)
    word = "approved" if approve else "rejected"
    shown(decided, as_json, lambda: f"{run_id} step {step_id} {word}")


@runs.command("approve")
def runs_approve(
    run_id: Annotated[str, typer.Argument(help="The run (run_…).")],
    step_id: Annotated[str, typer.Argument(help="Its approval step's id.")],
    comment: Annotated[
        str | None, typer.Option("--comment", help="Why, kept with the decision.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Approve a run's waiting approval step; the run goes on."""
    _decide(run_id, step_id, comment, True, as_json)


@runs.command("reject")
def runs_reject(
    run_id: Annotated[str, typer.Argument(help="The run (run_…).")],
    step_id: Annotated[str, typer.Argument(help="Its approval step's id.")],
    comment: Annotated[
        str | None, typer.Option("--comment", help="Why, kept with the decision.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Reject a run's waiting approval step (the run fails, or goes on if the step says so)."""
    _decide(run_id, step_id, comment, False, as_json)


@runs.command("cancel")
def runs_cancel(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Cancel a run: a queued one at once, a running one at its next step (its step in
    flight is interrupted)."""
    with client() as c:
        run = c.cancel(run_id)
    if as_json:
        out_json(run.raw)
    else:
        console.print(
            f"{run.run_id} {run.status}"
            + (" (cancel requested)" if run.status != "cancelled" else "")
        )


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
            "enabled" if e["enabled"] else "disabled",
        ],
        "no endpoints",
    )


EndpointArg = Annotated[str, typer.Argument(help="The endpoint (ep_…).")]


@endpoints.command("show")
def endpoints_show(endpoint_id: EndpointArg, as_json: JsonOpt = False) -> None:
    """Show an endpoint: its URL, events, state and settings (never its secret)."""
    with client() as c:
        ep = c.get_endpoint(endpoint_id)
    if as_json:
        out_json(ep)
        return
    state = "enabled" if ep["enabled"] else f"disabled ({ep.get('disabled_reason') or 'by hand'})"
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


@endpoints.command("delete")
def endpoints_delete(endpoint_id: EndpointArg) -> None:
    """Delete an endpoint: nothing more is sent to it, its deliveries are kept."""
    with client() as c:
        c.delete_endpoint(endpoint_id)
    console.print(f"{endpoint_id} deleted")


@deliveries.command("list")
def deliveries_list(
    failed: Annotated[bool, typer.Option("--failed", help="Only failed deliveries.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first.")] = 20,
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


HookArg = Annotated[str, typer.Argument(help="The hook (hk_…).")]


def flow_names(c: Client) -> dict[str, str]:
    """Every flow's name by its id, to print beside the ids a list holds."""
    return {f["flow_id"]: f["name"] for f in c.list_flows()}


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
    flow: Annotated[str, typer.Argument(help="The flow to run: its id (wf_…) or its name.")],
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


ScheduleArg = Annotated[str, typer.Argument(help="The schedule (sch_…).")]


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
    body = parse_json(data, "--data")
    if not isinstance(body, dict):
        err.print("[red]error:[/red] --data must be a JSON object")
        raise typer.Exit(2)
    if run_id is not None and signal_id is not None:
        err.print("[red]error:[/red] --id applies to a broadcast signal, not one sent with --run")
        raise typer.Exit(2)
    with client() as c:
        sent = c.send_signal(name, body, id=signal_id, run_id=run_id)
    shown(sent, as_json, lambda: f"{sent['id']} sent: resumed {sent['matched']} waiting step(s)")


def register(app: typer.Typer) -> None:
    for name, sub in (
        ("flows", flows),
        ("runs", runs),
        ("endpoints", endpoints),
        ("deliveries", deliveries),
        ("hooks", hooks),
        ("schedules", schedules),
        ("signals", signals),
    ):
        app.add_typer(sub, name=name)
