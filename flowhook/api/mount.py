"""The API on an app: its routers, under ``/api/v1`` but for the system routes (health,
metrics, the flow schema). :mod:`flowhook.app` calls :func:`mount` beside the pages'."""

from __future__ import annotations

from fastapi import FastAPI

from flowhook.api.routes import (
    approvals,
    flows,
    hooks,
    runs,
    schedules,
    secrets,
    signals,
    streams,
    system,
    tasks,
    webhooks,
)

__all__ = ["PREFIX", "mount"]

PREFIX = "/api/v1"


def mount(app: FastAPI) -> None:
    """Add the API's routes, in routing order."""
    app.include_router(system.router)
    # streams before webhooks: /events/stream before /events/{event_id}
    parts = (runs, streams, flows, webhooks, hooks, schedules, signals, approvals, tasks, secrets)
    for part in parts:
        app.include_router(part.router, prefix=PREFIX)
