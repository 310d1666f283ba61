"""Cron schedules (trigger ``schedule``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import FLOW_ID_DOC, PagingDep, error_responses, page_response, ts
from flowhook.api.responses import ORJSONResponse
from flowhook.store.schedules import Schedule

router = APIRouter(tags=["schedules"])
_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)


class ScheduleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flow_id: str = Field(json_schema_extra=FLOW_ID_DOC)
    cron: str = Field(
        max_length=120,
        json_schema_extra={"minLength": 1},
        description="Five fields (minute hour day month weekday), or six with seconds last. "
        "It must fire, and its ticks be at least FLOWHOOK_MIN_SCHEDULE_SECONDS (60) apart.",
    )
    timezone: str = Field(
        default="UTC",
        max_length=64,
        json_schema_extra={"minLength": 1},
        description="An IANA time zone; ticks follow its daylight saving.",
    )
    payload: dict[str, Any] = Field(default_factory=dict)
    enabled: bool = Field(default=True, strict=True)


class SchedulePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # min_length enforced (an empty cron was taken for "unchanged" and answered 200), and
    # stated at the top of the schema as well as inside its anyOf
    cron: str | None = Field(
        default=None, min_length=1, max_length=120, json_schema_extra={"minLength": 1}
    )
    timezone: str | None = Field(
        default=None, min_length=1, max_length=64, json_schema_extra={"minLength": 1}
    )
    payload: dict[str, Any] | None = None
    enabled: bool | None = Field(default=None, strict=True)


def record(s: Schedule) -> dict[str, Any]:
    return {
        "id": s.id, "flow_id": s.flow_id, "cron": s.cron, "timezone": s.timezone, "payload": s.payload,
        "enabled": s.enabled, "next_run_at": ts(s.next_run_at) if s.enabled else None,
        "created_at": ts(s.created_at), "updated_at": ts(s.updated_at),
    }  # fmt: skip


@router.post("/schedules", status_code=201, summary="Create a schedule", responses=_ERRORS)
async def create(body: ScheduleCreate, services: ServicesDep, who: CallerDep) -> Response:
    s = await services.schedules.create(who, **dict(body))  # every field is a keyword of create
    return ORJSONResponse(record(s), status_code=201)


@router.get("/schedules", summary="List schedules", responses=_ERRORS)
async def list_(
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
) -> Response:
    page = await services.schedules.list(who, **paging)
    return page_response(page, record)


@router.get("/schedules/{schedule_id}", summary="Read a schedule", responses=_ERRORS)
async def get(schedule_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(record(await services.schedules.get(who, schedule_id)))


@router.patch("/schedules/{schedule_id}", summary="Change a schedule", responses=_ERRORS)
async def patch(
    schedule_id: str, body: SchedulePatch, services: ServicesDep, who: CallerDep
) -> Response:
    return ORJSONResponse(
        record(
            await services.schedules.update(who, schedule_id, body.model_dump(exclude_unset=True))
        )
    )


@router.delete(
    "/schedules/{schedule_id}", status_code=204, summary="Delete a schedule", responses=_ERRORS
)
async def delete(schedule_id: str, services: ServicesDep, who: CallerDep) -> Response:
    await services.schedules.delete(who, schedule_id)
    return Response(status_code=204)
