"""Where :func:`create_app` and :func:`api_app` were: they live in :mod:`flowhook.app`, the
composition root, since the API and the pages became siblings. Kept for ``flowhook/cli.py``
(``serve``, and ``flowhook.api.app:api_app``, the factory ``flowhook api`` hands uvicorn)
until it imports :mod:`flowhook.app`; nothing in the API imports this module."""

from __future__ import annotations

from flowhook.app import api_app, create_app

__all__ = ["create_app", "api_app"]
