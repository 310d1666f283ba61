"""Signing in with an API key (landing on the overview, :mod:`flowhook.web.overview`) and
out again."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from starlette.responses import Response

from flowhook.errors import Unauthenticated
from flowhook.service.sessions import SESSION_HOURS
from flowhook.serving.deps import ServicesDep
from flowhook.web.pages import (
    COOKIE,
    LANDING,
    Page,
    PageDep,
    first,
    redirect,
    render_error,
    templates,
)
from flowhook.web.security import foreign_origin, secure_cookie

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


@router.get("/")
async def home(request: Request, services: ServicesDep) -> Response:
    found = await services.sessions.resume(request.cookies.get(COOKIE))
    return redirect(LANDING if found else "/signin")


@router.get("/signin")
async def signin_form(request: Request) -> Response:
    return templates.TemplateResponse(
        request, "signin.html", {"who": None, "nav": "", "error": None}
    )


@router.post("/signin")
async def signin(request: Request, services: ServicesDep) -> Response:
    refused = foreign_origin(request, services.settings.public_url)
    if refused is not None:  # login CSRF: another site must not sign a browser in
        return await render_error(
            request,
            403,
            f"Sign-in refused: {refused}. Open this site's sign-in page and sign in there.",
        )
    fields = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = first(fields, "api_key").strip()
    try:
        token, _session = await services.sessions.sign_in(key)
    except Unauthenticated:
        return templates.TemplateResponse(
            request,
            "signin.html",
            {
                "who": None,
                "nav": "",
                "error": "That key is not valid: paste a sandbox (sk_test_…) or live (sk_live_…) key.",
            },
            status_code=401,
        )
    response = redirect(LANDING)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="lax",
        secure=secure_cookie(request, services.settings),
        max_age=SESSION_HOURS * 3600,
    )
    return response


@router.post("/signout")
async def signout(p: Page = PageDep) -> Response:
    await p.form()
    await p.services.sessions.sign_out(p.request.cookies.get(COOKIE))
    response = redirect("/signin")
    response.delete_cookie(COOKIE)
    return response
