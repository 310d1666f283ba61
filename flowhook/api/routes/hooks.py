"""Inbound hooks: managed with a key; the public URL takes POSTs from anyone holding it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, Strict
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import (
    FLOW_ID_DOC,
    JSON_INTEGER,
    PRINTABLE,
    PagingDep,
    error_responses,
    page_response,
    ts,
)
from flowhook.api.responses import ORJSONResponse
from flowhook.service.signals import MAX_NAME
from flowhook.store.hooks import Hook

router = APIRouter(tags=["hooks"])

_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 429, 503)


_VERIFY_DOC: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "title": "HmacVerify",
            "required": ["type"],
            "properties": {
                "type": {"const": "hmac"},
                "header": {"type": ["string", "null"], "description": "Default X-Signature."},
                "encoding": {"enum": ["hex", "base64"], "description": "Default hex."},
                "secret": {"type": ["string", "null"], "description": "Made when not given."},
            },
        },
        {
            "type": "object",
            "title": "StandardVerify",
            "required": ["type"],
            "properties": {
                "type": {"const": "standard"},
                "header": {"type": ["string", "null"]},
                "secret": {
                    "type": ["string", "null"],
                    "pattern": "^(whsec_([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?)?$",
                    "description": "whsec_ and base64; made when not given.",
                },
            },
        },
        {"type": "object", "maxProperties": 0, "description": "{}: no verification."},
        {"type": "null", "description": "No verification."},
    ]
}
_ONE_TARGET: dict[str, Any] = {
    "oneOf": [
        {
            "required": ["flow_id"],
            "properties": {"flow_id": {"type": "string"}, "signal": {"type": "null"}},
        },
        {
            "required": ["signal"],
            "properties": {"signal": {"type": "string"}, "flow_id": {"type": "null"}},
        },
    ]
}
"""Exactly one of ``flow_id`` and ``signal`` (the other absent or null)."""


class HookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_ONE_TARGET)
    flow_id: str | None = Field(
        default=None,
        description="Each accepted arrival starts a run of this flow.",
        json_schema_extra=FLOW_ID_DOC,
    )
    signal: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME,
        description="Instead of flow_id: each accepted arrival sends this signal, with the "
        "arrival's body as its data.",
        examples=["payment.captured"],
        json_schema_extra={"pattern": PRINTABLE},
    )
    verify: dict[str, Any] | None = Field(
        default=None,
        description='{"type": "hmac", "header": "X-Signature", "encoding": "hex"|"base64", "secret"?} '
        'or {"type": "standard", "secret"?: "whsec_…"}; a secret is made when none is given.',
        json_schema_extra=_VERIFY_DOC,
    )
    dedup_header: str | None = Field(
        default=None, max_length=100, description="A provider's delivery id header."
    )
    rate_limit: Annotated[int, Strict(), Field(ge=1, le=100_000), JSON_INTEGER] = Field(
        default=600, description="Arrivals a minute."
    )


def hook_url(request: Request, hook_id: str) -> str:
    base = request.app.state.services.settings.public_url or str(request.base_url)
    return f"{base.rstrip('/')}/api/v1/hooks/{hook_id}"


def hook_record(request: Request, hook: Hook, *, with_secret: bool = False) -> dict[str, Any]:
    verify = None
    if hook.verify:
        verify = {k: v for k, v in hook.verify.items() if k != "secret" or with_secret}
    return {
        "id": hook.id,
        "url": hook_url(request, hook.id),
        "flow_id": hook.flow_id,
        "signal": hook.signal,
        "verify": verify,
        "dedup_header": hook.dedup_header,
        "rate_limit": hook.rate_limit,
        "created_at": ts(hook.created_at),
    }


@router.post("/hooks", status_code=201, summary="Create an inbound hook", responses=_ERRORS)
async def create_hook(
    body: HookCreate, request: Request, services: ServicesDep, who: CallerDep
) -> Response:
    hook = await services.hooks.create(who, **dict(body))  # every field is a keyword of create
    return ORJSONResponse(hook_record(request, hook, with_secret=True), status_code=201)


@router.get("/hooks", summary="List inbound hooks", responses=_ERRORS)
async def list_hooks(
    request: Request,
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
) -> Response:
    page = await services.hooks.list(who, **paging)
    return page_response(page, lambda h: hook_record(request, h))


@router.get("/hooks/{hook_id}", summary="Read an inbound hook", responses=_ERRORS)
async def get_hook(
    hook_id: str, request: Request, services: ServicesDep, who: CallerDep
) -> Response:
    return ORJSONResponse(hook_record(request, await services.hooks.get(who, hook_id)))


@router.delete(
    "/hooks/{hook_id}", status_code=204, summary="Delete an inbound hook", responses=_ERRORS
)
async def delete_hook(hook_id: str, services: ServicesDep, who: CallerDep) -> Response:
    await services.hooks.delete(who, hook_id)
    return Response(status_code=204)


@router.post(
    "/hooks/{hook_id}/rotate", summary="Move the hook to a new URL (and secret)", responses=_ERRORS
)
async def rotate_hook(
    hook_id: str, request: Request, services: ServicesDep, who: CallerDep
) -> Response:
    hook = await services.hooks.rotate(who, hook_id)
    return ORJSONResponse(hook_record(request, hook, with_secret=True))


def _header(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": {"type": "string"},
            "description": description}  # fmt: skip


_SIGNATURE_HEADERS = [
    _header("X-Signature", "HMAC of the body (hmac hooks; the header name is the hook's)."),
    _header("webhook-id", "Standard Webhooks: the delivery id; a repeat answers 200."),
    _header("webhook-timestamp", "Standard Webhooks: seconds since 1970, within 5 minutes."),
    _header("webhook-signature", "Standard Webhooks: v1,<base64 HMAC>, space-separated."),
]


@router.post(
    "/hooks/{hook_id}",
    status_code=202,
    summary="Public: deliver to an inbound hook (no API key)",
    description='JSON becomes the run\'s payload, a form an object, anything else {"body": text}; '
    "on a hook created with `signal`, it becomes that signal's data instead, and the answer is "
    '`{"signal_id", "signal", "matched", "duplicate"}`. '
    "A delivery id seen before answers 200 with the first run (or signal) and `duplicate: true`.",
    responses=_ERRORS,
    openapi_extra={"parameters": _SIGNATURE_HEADERS},
)
async def receive(hook_id: str, request: Request, services: ServicesDep) -> Response:
    body = await request.body()
    arrival = await services.hooks.receive(
        hook_id, body, request.headers.get("content-type", ""), request.headers
    )
    answer: dict[str, Any]
    if arrival.sent is not None:
        answer = {
            "signal_id": arrival.sent.signal.id,
            "signal": arrival.sent.signal.name,
            "matched": arrival.sent.matched,
            "duplicate": arrival.duplicate,
        }
    else:
        answer = {"run_id": arrival.run_id, "status": "queued", "duplicate": arrival.duplicate}
    return ORJSONResponse(answer, status_code=200 if arrival.duplicate else 202)
