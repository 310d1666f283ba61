"""Settings → Keys: the workspace's API keys (label, mode, prefix, created, last used,
revoked), a form that makes a key in the session's mode and shows it once, and revoke.

A sandbox session makes and revokes sandbox keys only, and a live session live keys: the
page never lets a key reach past its own mode."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from flowhook.errors import FlowhookError
from flowhook.service.auth import MAX_LABEL, CreatedKey
from flowhook.web.pages import Page, PageDep, first, redirect

__all__ = ["router"]

router = APIRouter(include_in_schema=False)


async def _page(
    p: Page, *, notice: str | None = None, error: str | None = None, label: str = "",
    created: CreatedKey | None = None, status: int = 200,
) -> Response:  # fmt: skip
    keys = await p.services.keys.list_for(p.who)
    response = p.render(
        "keys.html", status, keys=keys, notice=notice, error=error, label=label, created=created,
        max_label=MAX_LABEL,
    )  # fmt: skip
    if created is not None:  # the only time the key is ever shown: keep it out of caches
        response.headers["Cache-Control"] = "no-store"
    return response


@router.get("/settings/keys")
async def keys(p: Page = PageDep) -> Response:
    gone = p.request.query_params.get("revoked") or ""
    shown = {k.id: k for k in await p.services.keys.list_for(p.who)}
    key = shown.get(gone)
    named = f'"{key.label}" ({key.id})' if key and key.label else gone
    notice = f"Revoked {named}: it is refused from now on." if key and key.revoked_at else None
    return await _page(p, notice=notice)


@router.post("/settings/keys")
async def key_create(p: Page = PageDep) -> Response:
    """A new key in the session's mode; the answer is the page with the key shown once."""
    fields = await p.form()
    label = first(fields, "label")
    try:
        created = await p.services.keys.create_for(p.who, label)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, label=label, status=400)
    return await _page(p, created=created)


@router.post("/settings/keys/{key_id}/revoke")
async def key_revoke(key_id: str, p: Page = PageDep) -> Response:
    await p.form()  # the CSRF check
    try:
        await p.services.keys.revoke_for(p.who, key_id)
    except FlowhookError as exc:
        return await _page(p, error=exc.message, status=404)
    if key_id == p.who.key_id:  # the session stood on this key: it has ended
        return redirect("/signin")
    return redirect(f"/settings/keys?revoked={key_id}")
