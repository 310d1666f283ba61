"""CLI commands that talk to a running Flowhook over HTTP through the SDK
(``FLOWHOOK_URL``, ``FLOWHOOK_API_KEY``): flows, runs, endpoints, deliveries, hooks, schedules.
Lists print tables; ``--json`` prints what the API answered.

A module per group of commands (:mod:`.flows`, :mod:`.runs`, :mod:`.webhooks`,
:mod:`.triggers`, :mod:`.tasks`), over the connection (:mod:`.connection`), the output
(:mod:`.output`) and the parameters several commands share (:mod:`.params`)."""

from __future__ import annotations

import typer

from flowhook.cli_remote import flows, runs, tasks, triggers, webhooks

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    for name, sub in (
        ("flows", flows.flows),
        ("runs", runs.runs),
        ("endpoints", webhooks.endpoints),
        ("deliveries", webhooks.deliveries),
        ("hooks", triggers.hooks),
        ("schedules", triggers.schedules),
        ("signals", triggers.signals),
        ("tasks", tasks.tasks),
        ("workers", tasks.workers),
    ):
        app.add_typer(sub, name=name)
