"""``flowhook tasks serve MODULE:WORKER`` runs a team's worker (the SDK's ``Worker``, which
holds the server's URL and key); ``flowhook workers`` lists who works and what waits."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any

import typer

from flowhook.cli_remote.connection import client
from flowhook.cli_remote.output import console, err, out_json, table
from flowhook.cli_remote.params import JsonOpt

__all__ = ["tasks", "workers"]

tasks = typer.Typer(help="Tasks: your own code running the task steps of your flows.",
                    no_args_is_help=True)  # fmt: skip
workers = typer.Typer(help="Workers seen lately, and the tasks waiting for them.",
                      no_args_is_help=True)  # fmt: skip


def _load(target: str) -> Any:
    """The object ``module:name`` names, importing the module from the current folder too."""
    from flowhook.client import Worker

    module_name, sep, name = target.partition(":")
    if not sep or not module_name or not name:
        err.print(f"[red]error:[/red] {target!r} is not MODULE:WORKER (e.g. billing.tasks:worker)")
        raise typer.Exit(2)
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        err.print(f"[red]error:[/red] cannot import {module_name!r}: {exc}")
        raise typer.Exit(2) from None
    worker = getattr(module, name, None)
    if not isinstance(worker, Worker):
        what = "nothing" if worker is None else type(worker).__name__
        err.print(f"[red]error:[/red] {target} is {what}, not a flowhook.Worker")
        raise typer.Exit(2)
    return worker


@tasks.command("serve")
def serve(
    target: Annotated[str, typer.Argument(metavar="MODULE:WORKER", show_default=False,
                                          help="Where your Worker is, e.g. billing.tasks:worker")],
) -> None:  # fmt: skip
    """Run your worker: it claims the tasks it has functions for, runs them and reports their
    ends, until SIGTERM or Ctrl-C; then it claims no more, finishes what it holds, and exits
    0."""
    worker = _load(target)
    names = ", ".join(worker.tasks) or "(none)"
    console.print(
        f"worker {worker.worker_id} serving {names} from {worker.base_url} "
        f"(concurrency {worker.concurrency}); Ctrl-C to stop"
    )
    worker.run()
    console.print(f"worker {worker.worker_id} stopped after {worker.completed} tasks")


@workers.command("list")
def list_workers(as_json: JsonOpt = False) -> None:
    """The workers seen in the last 60 s and each task name's queue."""
    with client() as c:
        seen = c.workers()
    if as_json:
        out_json(seen)
        return
    table(
        ["worker", "tasks", "in flight", "last seen"],
        [[w["worker_id"], ", ".join(w["tasks"]), w["in_flight"], w["last_seen_at"]]
         for w in seen["workers"]],
        "No worker seen in the last 60 s.",
    )  # fmt: skip
    if seen["queues"]:
        table(
            ["task", "waiting", "running", "oldest waiting since"],
            [[q["task"], q["waiting"], q["running"], q["oldest_waiting_at"] or "-"]
             for q in seen["queues"]],
            "",
        )  # fmt: skip
