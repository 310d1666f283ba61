"""A shim: :func:`create_app` and :func:`api_app` live in :mod:`flowhook.app`, the composition
root, since the API and the pages became siblings. It stays for the bench scripts, which
``bench/ab.sh`` also runs on commits from before :mod:`flowhook.app` (they import
``flowhook.api.app``); nothing in Flowhook imports it."""

from __future__ import annotations

from flowhook.app import api_app, create_app

__all__ = ["create_app", "api_app"]
