"""``flowhook flows``: apply a definition from a file, list, show, version history, delete."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.markup import escape

from flowhook.cli_remote.connection import client, resolve_flow
from flowhook.cli_remote.output import console, err, listing, out_json, shown
from flowhook.cli_remote.params import FlowArg, JsonOpt

__all__ = ["flows"]

flows = typer.Typer(help="Flow definitions.", no_args_is_help=True)


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
