"""``flowhook flows``: apply a definition from a file, list, show, version history, delete."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from flowhook.cli_remote import apply
from flowhook.cli_remote.connection import client, resolve_flow
from flowhook.cli_remote.output import console, err, listing, out_json, shown
from flowhook.cli_remote.params import FlowArg, JsonOpt

__all__ = ["flows"]

flows = typer.Typer(help="Flow definitions.", no_args_is_help=True)


@flows.command("apply")
def flows_apply(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Flow definitions: files (.json, .yaml, .yml) or folders of them.",
            show_default=False,
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("-f", "--file", help="A flow definition, YAML or JSON (one more PATH)."),
    ] = None,
    flow_id: Annotated[
        str | None,
        typer.Option(
            "--flow-id", help="Save the one definition given as a new version of this flow."
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and say what would change; change nothing.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Apply flow definitions kept as code: each creates its flow, or adds a version when its
    definition changed (found by its slug, else by --flow-id or its name), and says created,
    new version N or unchanged. Every file is checked first: one invalid file is named, with
    its step and field, and nothing is applied (exit 1). (-f FILE alone saves a version each
    time and prints the flow, as it always did.)"""
    if not paths and file is not None and not dry_run:
        _apply_one(file, flow_id, as_json)
        return
    files = apply.files([*(paths or []), *([file] if file else [])])
    if flow_id is not None and len(files) != 1:
        err.print("[red]error:[/red] --flow-id takes one definition, not " + str(len(files)))
        raise typer.Exit(2)
    with client() as c:
        plan = apply.plan(c, apply.load(files), flow_id)
        results = plan if dry_run else apply.run(c, plan)
    if as_json:
        out_json([r.summary() for r in results])
        return
    for r in results:
        console.print(r.line(dry_run))


def _apply_one(file: Path, flow_id: str | None, as_json: bool) -> None:
    """``flows apply -f FILE``: create the flow, or save a new version of it (--flow-id, or
    the flow of the same name), and print it."""
    [(_, definition)] = apply.load(apply.files([file]))
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


@flows.command("show")
def flows_show(flow: FlowArg, as_json: JsonOpt = False) -> None:
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
def flows_versions(flow: FlowArg, as_json: JsonOpt = False) -> None:
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
def flows_delete(flow: FlowArg) -> None:
    """Archive a flow: executing it answers 404 from now on; its runs and versions are kept."""
    with client() as c:
        flow_id = resolve_flow(c, flow)
        c.delete_flow(flow_id)
    console.print(f"{flow_id} deleted (archived: its runs are kept)")


@flows.command("pause")
def flows_pause(flow: FlowArg) -> None:
    """Pause a flow: it still accepts executes and its schedules fire, but its queued runs
    wait (waiting_for: paused) until `flowhook flows resume`; started runs go on."""
    with client() as c:
        flow_id = resolve_flow(c, flow)
        c.pause_flow(flow_id)
    console.print(f"{flow_id} paused: its queued runs wait until `flowhook flows resume {flow}`")


@flows.command("resume")
def flows_resume(
    flow: FlowArg,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate", help="Start the held runs at most this many a second (default 1000)."
        ),
    ] = None,
) -> None:
    """Resume a paused flow: the runs it held start oldest first."""
    with client() as c:
        flow_id = resolve_flow(c, flow)
        c.resume_flow(flow_id, rate)
    console.print(f"{flow_id} resumed")
