"""The pages behind an approval's links (``/approvals/<secret>``): anyone holding the link may
decide, so no key, session or form token is asked. A GET only shows what is asked and a
button (mail scanners and link previews fetch links); the POST of that button decides."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from starlette.responses import Response

from flowhook.errors import Conflict
from flowhook.serving.deps import ServicesDep
from flowhook.web.pages import templates

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


def _page(request: Request, code: int = 200, **context: object) -> Response:
    return templates.TemplateResponse(
        request,
        "approval.html",
        {"who": None, "nav": "", "notice": None, "error": None, **context},
        status_code=code,
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )


@router.get("/approvals/{token}")
async def show(token: str, request: Request, services: ServicesDep) -> Response:
    view = await services.approvals.view_link(token)
    if view is None:
        return _page(request, 404, view=None, decided=None)
    return _page(request, view=view, decided=None)


@router.post("/approvals/{token}")
async def decide(token: str, request: Request, services: ServicesDep) -> Response:
    body = (await request.body()).decode("utf-8", "replace")
    comment = (parse_qs(body).get("comment") or [""])[0]
    try:
        decided = await services.approvals.decide_by_link(token, comment)
    except Conflict as exc:
        view = await services.approvals.view_link(token)
        if view is None:  # pragma: no cover - a link that decided once still exists
            return _page(request, 409, view=None, decided=None, error=exc.message)
        return _page(request, 409, view=view, decided=None)
    view = await services.approvals.view_link(token)
    return _page(request, view=view, decided=decided)
