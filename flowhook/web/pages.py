"""What every page shares: the templates and their filters, the signed-in caller
(:class:`Page`), the session cookie, and the page shown for an error.

Every page reads through the same services as the API, as the session's workspace and mode;
every form carries the session's CSRF token and is refused without it.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.templating import Jinja2Templates
from starlette.responses import RedirectResponse, Response

from flowhook.clock import isoformat
from flowhook.errors import Forbidden, Unauthenticated
from flowhook.service import Principal, Services
from flowhook.serving.deps import ServicesDep
from flowhook.store.sessions import WebSession
from flowhook.web import charts
from flowhook.web.words import clock_time, waiting_words

__all__ = [
    "COOKIE",
    "LANDING",
    "STATIC_DIR",
    "templates",
    "Page",
    "PageDep",
    "page",
    "redirect",
    "first",
    "render_error",
    "install",
]

COOKIE = "flowhook_session"
LANDING = "/overview"
"""Where a signed-in browser starts."""
HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=str(HERE / "templates"))


def _ts(value: datetime | str | None) -> str:
    """A time as the pages show it (``2026-11-23 10:15:30 UTC``); ``value`` may be ISO text."""
    if not value:
        return "—"
    text = value if isinstance(value, str) else isoformat(value)
    return text.replace("T", " ")[:19] + " UTC"


templates.env.filters["ts"] = _ts
templates.env.filters["pretty"] = lambda v: json.dumps(
    v, indent=2, ensure_ascii=False, sort_keys=False
)
templates.env.filters["prettyb"] = lambda b: json.dumps(
    orjson.loads(b), indent=2, ensure_ascii=False
)
templates.env.filters["num"] = charts.number
templates.env.filters["millis"] = charts.millis
templates.env.filters["age"] = charts.age
templates.env.filters["size"] = charts.size
templates.env.filters["waiting_words"] = waiting_words
templates.env.filters["clock"] = clock_time


class _SignIn(Exception):
    """A page asked for without a live session: the browser goes to the sign-in page."""


class Page:
    """The signed-in caller of a page."""

    def __init__(
        self, request: Request, services: Services, who: Principal, session: WebSession
    ) -> None:
        self.request = request
        self.services = services
        self.who = who
        self.session = session

    def render(self, template: str, code: int = 200, **context: Any) -> Response:
        return templates.TemplateResponse(
            self.request,
            template,
            {
                "who": self.who,
                "csrf": self.session.csrf_token,
                "nav": template.split(".")[0],
                **context,
            },
            status_code=code,
        )

    async def form(self) -> dict[str, list[str]]:
        """The posted form, after its CSRF token is checked."""
        body = (await self.request.body()).decode("utf-8", "replace")
        fields = parse_qs(body, keep_blank_values=True)
        try:
            self.services.sessions.check_csrf(self.session, first(fields, "csrf") or None)
        except Unauthenticated as exc:
            raise Forbidden(exc.message) from None
        return fields


async def page(request: Request, services: ServicesDep) -> Page:
    found = await services.sessions.resume(request.cookies.get(COOKIE))
    if found is None:
        raise _SignIn
    return Page(request, services, *found)


PageDep = Depends(page)


def redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=303)


def first(fields: dict[str, list[str]], name: str, default: str = "") -> str:
    return (fields.get(name) or [default])[0]


async def render_error(request: Request, status: int, message: str) -> Response:
    if status == 401 and request.method == "GET":
        return redirect("/signin")
    return templates.TemplateResponse(
        request,
        "error.html",
        {"status": status, "message": message, "who": None, "nav": ""},
        status_code=status,
    )


async def _to_sign_in(_request: Request, _exc: Exception) -> Response:
    return redirect("/signin")


def install(app: FastAPI) -> None:
    """Send a browser with no live session to the sign-in page."""
    app.add_exception_handler(_SignIn, _to_sign_in)
