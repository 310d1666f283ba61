"""The pages on an app: every page's router, their static files, and the way to the sign-in
page. :mod:`flowhook.app` calls :func:`mount` beside the API's."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from flowhook.web import (
    approvals,
    deliveries,
    flow_editor,
    flows,
    keys,
    overview,
    pages,
    runs,
    secrets,
    signin,
    triggers,
    webhooks,
    workers,
)
from flowhook.web.pages import STATIC_DIR, render_error

__all__ = ["mount", "render_error"]


def mount(app: FastAPI) -> None:
    """Add the pages' routes (after the API's) and what they need."""
    for page in (
        approvals,
        signin,
        webhooks,
        secrets,
        keys,
        triggers,
        deliveries,
        runs,
        flow_editor,  # /flows/new before /flows/{flow_id}
        flows,
        overview,
        workers,
    ):
        app.include_router(page.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    pages.install(app)
