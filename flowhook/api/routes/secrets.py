"""Step secrets: ``{{ secrets.NAME }}`` in an http step's url, headers and body. Values go
in and are never given back: the list shows names and times."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import error_responses, ts
from flowhook.api.responses import ORJSONResponse
from flowhook.service.step_secrets import MAX_VALUE_CHARS, SecretInfo

router = APIRouter(tags=["secrets"])
_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)
NAME_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"
_VALUE_DOC = "The secret itself: sent by http steps, never shown back nor stored in a run."


class SecretCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=64,
        description="Upper case, digits and _, a letter first; read as {{ secrets.NAME }}.",
    )
    value: str = Field(min_length=1, max_length=MAX_VALUE_CHARS, description=_VALUE_DOC)


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str = Field(min_length=1, max_length=MAX_VALUE_CHARS, description=_VALUE_DOC)


def record(s: SecretInfo) -> dict[str, Any]:
    return {"name": s.name, "created_at": ts(s.created_at), "updated_at": ts(s.updated_at)}


@router.post("/secrets", status_code=201, summary="Create a step secret", responses=_ERRORS)
async def create(body: SecretCreate, services: ServicesDep, who: CallerDep) -> Response:
    found = await services.secrets.create(who, body.name, body.value)
    return ORJSONResponse(record(found), status_code=201)


@router.get("/secrets", summary="List step secrets (names, never values)", responses=_ERRORS)
async def list_(services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse({"data": [record(s) for s in await services.secrets.list(who)]})


@router.put("/secrets/{name}", summary="Replace a step secret's value", responses=_ERRORS)
async def put(name: str, body: SecretPut, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(record(await services.secrets.replace(who, name, body.value)))


@router.delete("/secrets/{name}", status_code=204, summary="Delete a step secret",
               responses=_ERRORS)  # fmt: skip
async def delete(name: str, services: ServicesDep, who: CallerDep) -> Response:
    await services.secrets.delete(who, name)
    return Response(status_code=204)
