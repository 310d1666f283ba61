"""``405 Method Not Allowed`` with an ``Allow`` header that lists every method the path takes.

FastAPI makes one route per method, and Starlette answers a method no route takes with the
methods of the first route whose path matched: ``OPTIONS /api/v1/flows`` said ``Allow: POST``
although ``GET /api/v1/flows`` exists. And a fixed path shadowed by a templated one
(``/api/v1/flows/runs`` and ``/api/v1/flows/{flow_id}``) let ``PUT /api/v1/flows/runs`` reach
``PUT /api/v1/flows/{flow_id}`` with the flow id ``runs``.

:func:`install_allow`, called once when the app is built, reads every route's path and
methods into a table (``app.state.allow``) and puts a route answering 405 right after each
fixed path that a templated one also matches, so the fixed path keeps its own methods, as its
OpenAPI path item says. :func:`allowed_methods` reads the table when a 405 is answered, never
on a request that a route takes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute, Route, compile_path

__all__ = ["AllowTable", "allowed_methods", "install_allow"]

_EVERY_METHOD = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")
_ORDER = {m: i for i, m in enumerate(_EVERY_METHOD)}

AllowTable = list[tuple[re.Pattern[str], str]]
"""(path regex, ``Allow`` value) for each route path, in routing order."""


def _routes(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[int, str, set[str]]]:
    """(index of the top-level route it is under, full path, methods) of every route, in
    routing order, looking into included routers (FastAPI keeps them whole since 0.16x)."""
    for index, route in enumerate(routes):
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            inner_prefix = prefix + str(getattr(context, "prefix", ""))
            for _i, path, methods in _routes(inner.routes, inner_prefix):
                yield index, path, methods
        elif isinstance(route, Route) and route.methods:
            yield index, prefix + route.path, set(route.methods)


def _sorted(methods: set[str]) -> str:
    return ", ".join(sorted(methods, key=lambda m: _ORDER.get(m, len(_ORDER))))


def allowed_methods(table: AllowTable, path: str) -> str:
    """The ``Allow`` value for ``path``: the methods of the first route path (in routing
    order) that matches it, across all the routes of that path. Empty when none matches."""
    for regex, allow in table:
        if regex.match(path):
            return allow
    return ""


def install_allow(app: FastAPI, prefix: str = "/api/") -> None:
    """Build ``app.state.allow`` and, after each fixed path under ``prefix`` (no ``{…}``)
    that a later templated route also matches, a route taking every other method and
    answering 405. The routes before it are untouched, so a request a route takes is routed
    as fast as before."""
    found = list(_routes(app.router.routes))
    by_path: dict[str, set[str]] = {}
    last: dict[str, int] = {}
    for index, path, methods in found:
        by_path.setdefault(path, set()).update(methods)
        last[path] = index
    app.state.allow = [(compile_path(path)[0], _sorted(m)) for path, m in by_path.items()]
    templated = [compile_path(p)[0] for p in by_path if "{" in p]
    guards: list[tuple[int, Route]] = []
    for path, methods in by_path.items():
        if not path.startswith(prefix) or "{" in path:
            continue
        if not any(regex.match(path) for regex in templated):
            continue
        others = [m for m in _EVERY_METHOD if m not in methods]
        guards.append((last[path], Route(path, _refuse, methods=others, include_in_schema=False)))
    for index, guard in sorted(guards, key=lambda g: g[0], reverse=True):
        app.router.routes.insert(index + 1, guard)


async def _refuse(request: Request) -> Any:
    raise StarletteHTTPException(405)
