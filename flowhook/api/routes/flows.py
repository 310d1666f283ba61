"""Flows: create, list, read, new version, archive (DESIGN.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import (
    JSON_NUMBER,
    FlowList,
    FlowRecord,
    PagingDep,
    error_responses,
    flow_record,
    page_response,
    ts,
)
from flowhook.api.responses import ORJSONResponse
from flowhook.store.models import MAX_FLOW_VERSION

router = APIRouter(tags=["flows"])


class FlowCheck(BaseModel):
    valid: bool
    definition: dict[str, Any] = Field(description="The definition as it would be saved.")


_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)
_DEFINITION = Body(
    description="A flow definition; its JSON Schema is at /api/v1/schemas/flow.json.",
    examples=[
        {
            "name": "Hello",
            "steps": [{"id": "greet", "type": "transform", "output": {"hi": "{{ payload.name }}"}}],
        }
    ],
)


@router.post(
    "/flows",
    status_code=201,
    summary="Create a flow",
    responses={201: {"model": FlowRecord}, **_ERRORS},
)
async def create_flow(
    services: ServicesDep, who: CallerDep, definition: dict[str, Any] = _DEFINITION
) -> Response:
    flow = await services.flows.create(who, definition)
    return ORJSONResponse(flow_record(flow), status_code=201)


@router.get("/flows", summary="List flows", responses={200: {"model": FlowList}, **_ERRORS})
async def list_flows(
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
    slug: str | None = Query(
        None,
        pattern="^[a-z0-9-]{1,64}$",
        description="Only the flow whose current version has this `slug`.",
    ),
) -> Response:
    page = await services.flows.list(who, **paging, slug=slug)
    return page_response(page, flow_record)


@router.post(
    "/flows/validate",
    summary="Check a flow definition without saving it",
    description="200 with the definition as it would be saved, or the 400 that saving it "
    "would answer (every problem at once). `flowhook flows apply` checks every file first.",
    responses={200: {"model": FlowCheck}, **_ERRORS},
)
async def validate_flow(
    services: ServicesDep, who: CallerDep, definition: dict[str, Any] = _DEFINITION
) -> Response:
    checked = await services.flows.validate(definition, who)
    return ORJSONResponse({"valid": True, "definition": checked})


@router.get(
    "/flows/{flow_id}",
    summary="Read a flow (its current version, or ?version=N)",
    responses={200: {"model": FlowRecord}, **_ERRORS},
)
async def get_flow(
    flow_id: str,
    services: ServicesDep,
    who: CallerDep,
    version: int | None = Query(None, ge=1, le=MAX_FLOW_VERSION),
) -> Response:
    return ORJSONResponse(flow_record(await services.flows.get(who, flow_id, version)))


@router.put(
    "/flows/{flow_id}",
    summary="Save a new version of a flow",
    responses={200: {"model": FlowRecord}, **_ERRORS},
)
async def update_flow(
    flow_id: str, services: ServicesDep, who: CallerDep, definition: dict[str, Any] = _DEFINITION
) -> Response:
    return ORJSONResponse(flow_record(await services.flows.update(who, flow_id, definition)))


@router.delete(
    "/flows/{flow_id}",
    status_code=204,
    summary="Archive a flow; executing it then answers 404",
    responses=_ERRORS,
)
async def archive_flow(flow_id: str, services: ServicesDep, who: CallerDep) -> Response:
    await services.flows.archive(who, flow_id)
    return Response(status_code=204)


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rate_per_second: Annotated[float, Field(gt=0, le=100_000), JSON_NUMBER] | None = Field(
        default=None,
        description="Let the held runs go at most this many a second, oldest first "
        "(default 1000: they take their turn beside other flows' runs).",
    )


@router.post(
    "/flows/{flow_id}/pause",
    summary="Pause a flow",
    description="The flow still accepts executes (202 `queued`) and its schedules still "
    "fire, but its queued runs wait (`waiting_for.reason` `paused`) until it is resumed; "
    "runs a worker has started go on.",
    responses={200: {"model": FlowRecord}, **_ERRORS},
)
async def pause_flow(flow_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(flow_record(await services.flows.pause(who, flow_id)))


@router.post(
    "/flows/{flow_id}/resume",
    summary="Resume a paused flow",
    description="The runs it held start oldest first, paced by `rate_per_second`.",
    responses={200: {"model": FlowRecord}, **_ERRORS},
)
async def resume_flow(
    flow_id: str, services: ServicesDep, who: CallerDep, body: ResumeRequest | None = None
) -> Response:
    rate = None if body is None else body.rate_per_second
    return ORJSONResponse(flow_record(await services.flows.resume(who, flow_id, rate)))


@router.get(
    "/flows/{flow_id}/versions", summary="A flow's versions, newest first", responses=_ERRORS
)
async def flow_versions(flow_id: str, services: ServicesDep, who: CallerDep) -> Response:
    versions = await services.flows.versions(who, flow_id)
    return ORJSONResponse(
        {
            "data": [
                {"version": v["version"], "created_at": ts(v["created_at"])} for v in versions
            ],
            "next_cursor": None,
        }
    )
