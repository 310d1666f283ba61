"""``flowhook runs``: start (and follow) a run, rerun one, list, show, watch, decide an
approval, cancel."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from flowhook.cli_remote.connection import client, flow_names, resolve_flow
from flowhook.cli_remote.output import (
    console,
    err,
    out_json,
    parse_json_object,
    shown,
    table,
)
from flowhook.cli_remote.params import (
    ApprovalStepArg,
    CommentOpt,
    FlowToRunArg,
    IdempotencyKeyOpt,
    JsonOpt,
    LimitOpt,
    RunArg,
    TimeoutOpt,
)
from flowhook.cli_watch import follow, print_step, wait_quietly, waiting_line, watch
from flowhook.client import Client, Run, RunAccepted

__all__ = ["runs"]

runs = typer.Typer(help="Start, follow and cancel runs.", no_args_is_help=True)


@runs.command("start")
def runs_start(
    flow_id: FlowToRunArg,
    payload: Annotated[
        str, typer.Option("--payload", help="A JSON object handed to the flow.")
    ] = "{}",
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the run and exit 0 only if it completes.")
    ] = False,
    timeout: TimeoutOpt = 600,
    idempotency_key: IdempotencyKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a run; with --wait, show its steps as they finish and its final status."""
    body = parse_json_object(payload, "--payload")
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
    timeout: TimeoutOpt = 600,
    idempotency_key: IdempotencyKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rerun a finished run from a step: the steps before it are not run again."""
    flow_version = _flow_version(version)
    body = None if payload is None else parse_json_object(payload, "--payload")
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


def _flow_version(version: str | None) -> int | str | None:
    """``--version``: a number from 1, or ``latest``; anything else is an error, exit 2."""
    if version is None or version == "latest":
        return version
    if not (version.isascii() and version.isdigit()) or int(version) < 1:
        err.print(f"[red]error:[/red] --version must be a number or latest, not {version!r}")
        raise typer.Exit(2)
    return int(version)


def _run_row(r: Run, names: dict[str, str]) -> list[Any]:
    waiting = "" if r.terminal else waiting_line(r.raw.get("waiting_for"))
    status = f"{r.status}, {waiting}" if waiting else r.status
    return [
        r.run_id, names.get(r.flow_id, ""), r.flow_id, status, r.steps_executed, r.duration_ms,
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
    limit: LimitOpt = 20,
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
    waiting = waiting_line(run.raw.get("waiting_for"))
    if waiting:
        console.print(f"[yellow]{waiting}[/yellow]")
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
    run_id: RunArg, step_id: ApprovalStepArg, comment: CommentOpt = None, as_json: JsonOpt = False
) -> None:
    """Approve a run's waiting approval step; the run goes on."""
    _decide(run_id, step_id, comment, True, as_json)


@runs.command("reject")
def runs_reject(
    run_id: RunArg, step_id: ApprovalStepArg, comment: CommentOpt = None, as_json: JsonOpt = False
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
