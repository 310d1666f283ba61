"""Settings → Secrets: the step secrets' names and when each was set, a form that adds one
or sets a new value, and delete. A value goes in and is never shown back, not even in the
form after a refusal."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import FlowhookError
from flowhook.web.pages import Page, PageDep, first, redirect

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


async def _page(
    p: Page, *, notice: str | None = None, error: str | None = None, name: str = "",
    status: int = 200,
) -> Response:  # fmt: skip
    found = await p.services.secrets.list(p.who)
    return p.render("secrets.html", status, secrets=found, notice=notice, error=error, name=name)


@router.get("/settings/secrets")
async def secrets(p: Page = PageDep) -> Response:
    done = p.request.query_params.get("saved") or ""
    gone = p.request.query_params.get("deleted") or ""
    notice = f"Saved {done}." if done else f"Deleted {gone}." if gone else None
    return await _page(p, notice=notice)


@router.post("/settings/secrets")
async def secrets_set(p: Page = PageDep) -> Response:
    """Add the secret, or give one that exists a new value."""
    fields = await p.form()
    name, value = first(fields, "name").strip(), first(fields, "value")
    try:
        held = {s.name for s in await p.services.secrets.list(p.who)}
        if name in held:
            await p.services.secrets.replace(p.who, name, value)
        else:
            await p.services.secrets.create(p.who, name, value)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, name=name, status=400)
    return redirect(f"/settings/secrets?saved={name}")


@router.post("/settings/secrets/{name}/delete")
async def secrets_delete(name: str, p: Page = PageDep) -> Response:
    await p.form()  # the CSRF check
    try:
        await p.services.secrets.delete(p.who, name)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, status=404)
    return redirect(f"/settings/secrets?deleted={name}")
