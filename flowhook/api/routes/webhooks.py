"""Webhook endpoints, deliveries and events (DESIGN.md "HTTP API")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import (
    ID_SUFFIX,
    JSON_NUMBER,
    PagingDep,
    error_responses,
    page_response,
    ts,
)
from flowhook.api.responses import ORJSONResponse
from flowhook.service.webhooks import SUBSCRIBABLE
from flowhook.store.models import Delivery, Endpoint, Event
from flowhook.store.types import HELD

router = APIRouter(tags=["webhooks"])

_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)


class EndpointFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flow_ids: list[str] = Field(
        max_length=100,
        description="Only events of these flows (wf_…) reach the endpoint.",
        json_schema_extra={"items": {"type": "string", "pattern": f"^wf_{ID_SUFFIX}$"}},
    )


_URL_DOC: dict[str, Any] = {"minLength": 1, "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#]"}
"""http:// or https:// and a host; the target guard then refuses private addresses (unless
FLOWHOOK_ALLOW_PRIVATE_TARGETS) and, for live keys, plain http."""
_EVENTS_DOC: dict[str, Any] = {
    "minItems": 1,
    "items": {"type": "string", "enum": list(SUBSCRIBABLE)},
}

_RATE = "At most this many deliveries a second, across every process (null: no limit)."
_ORDERING = "`fifo`: one delivery in flight, in event order; a failing one holds the rest."


class EndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        max_length=2048,
        description="Where to POST events (https:// for live keys).",
        json_schema_extra=_URL_DOC,
    )
    events: list[str] = Field(
        description="Event names to send: those of SPEC §6, plus flow.cancelled and "
        "flow.approval_requested.",
        json_schema_extra=_EVENTS_DOC,
    )
    description: str = Field(default="", max_length=1000)
    enabled: bool = Field(default=True, strict=True)
    rate_limit: Annotated[float, Field(gt=0, le=10000), JSON_NUMBER] | None = Field(
        default=None, description=_RATE
    )
    ordering: Literal["fifo"] | None = Field(default=None, description=_ORDERING)
    filter: EndpointFilter | None = None


class EndpointPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(default=None, max_length=2048, json_schema_extra=_URL_DOC)
    events: list[str] | None = Field(default=None, json_schema_extra=_EVENTS_DOC)
    description: str | None = Field(default=None, max_length=1000)
    enabled: bool | None = Field(default=None, strict=True)
    rate_limit: Annotated[float, Field(gt=0, le=10000), JSON_NUMBER] | None = Field(
        default=None, description=_RATE
    )
    ordering: Literal["fifo"] | None = Field(default=None, description=_ORDERING)
    filter: EndpointFilter | None = Field(default=None, description="null: every flow.")


class RotateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_seconds: Annotated[float, Field(ge=0, le=2592000), JSON_NUMBER] | None = Field(
        default=None,
        description="How long the old secret keeps signing (default 24 h).",
    )


class RecoverRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    since: AwareDatetime
    until: AwareDatetime | None = None
    cursor: str | None = Field(
        default=None,
        description="next_cursor of the previous answer, to continue.",
        json_schema_extra={"pattern": f"^(dlv_{ID_SUFFIX})?$"},
    )


def endpoint_record(ep: Endpoint, *, with_secret: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": ep.id,
        "url": ep.url,
        "events": ep.events,
        "description": ep.description,
        "enabled": ep.enabled,
        "disabled_reason": ep.disabled_reason,
        "failing_since": ts(ep.failing_since),
        "rate_limit": ep.rate_limit,
        "ordering": ep.ordering,
        "filter": None if ep.filter_flow_ids is None else {"flow_ids": ep.filter_flow_ids},
        "paused": ep.paused_at is not None,
        "paused_at": ts(ep.paused_at),
        "created_at": ts(ep.created_at),
        "updated_at": ts(ep.updated_at),
    }
    if with_secret:
        body["secret"] = ep.secret
    return body


def _held(waiting_for: dict[str, Any]) -> dict[str, Any]:
    """Why a delivery is held (``paused`` with ``since``, or ``fifo`` with ``delivery_id``,
    the one ahead of it), its time as the API writes times."""
    return {k: ts(v) if isinstance(v, datetime) else v for k, v in waiting_for.items()}


def delivery_record(d: Delivery) -> dict[str, Any]:
    held = d.waiting_for
    return {
        "id": d.id,
        "event_id": d.event_id,
        "event": d.event_type,
        "endpoint_id": d.endpoint_id,
        "run_id": d.run_id,
        "status": str(d.status),
        "attempts": d.attempts,
        "next_attempt_at": (
            ts(d.next_attempt_at)
            if str(d.status) == "pending" and held is None and d.next_attempt_at < HELD
            else None
        ),
        "waiting_for": None if held is None else _held(held),
        "last_status_code": d.last_status_code,
        "last_error": d.last_error,
        "replay_of": d.replay_of,
        "created_at": ts(d.created_at),
        "finished_at": ts(d.finished_at),
    }


def event_record(e: Event) -> dict[str, Any]:
    return {
        "id": e.id,
        "event": e.type,
        "flow_id": e.flow_id,
        "run_id": e.run_id,
        "created_at": ts(e.created_at),
        "body": orjson.Fragment(e.body),
    }


@router.post(
    "/webhooks/endpoints", status_code=201, summary="Register an endpoint", responses=_ERRORS
)
async def create_endpoint(body: EndpointCreate, services: ServicesDep, who: CallerDep) -> Response:
    fields = dict(body)  # fields = its keywords
    fields["filter"] = None if body.filter is None else body.filter.flow_ids
    ep = await services.webhooks.create_endpoint(who, **fields)
    return ORJSONResponse(endpoint_record(ep, with_secret=True), status_code=201)


@router.get("/webhooks/endpoints", summary="List endpoints", responses=_ERRORS)
async def list_endpoints(
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
) -> Response:
    page = await services.webhooks.list_endpoints(who, **paging)
    return page_response(page, endpoint_record)


@router.get("/webhooks/endpoints/{endpoint_id}", summary="Read an endpoint", responses=_ERRORS)
async def get_endpoint(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(endpoint_record(await services.webhooks.get_endpoint(who, endpoint_id)))


@router.patch("/webhooks/endpoints/{endpoint_id}", summary="Change an endpoint", responses=_ERRORS)
async def update_endpoint(
    endpoint_id: str, body: EndpointPatch, services: ServicesDep, who: CallerDep
) -> Response:
    before = await services.webhooks.get_endpoint(who, endpoint_id)
    ep = await services.webhooks.update_endpoint(
        who, endpoint_id, body.model_dump(exclude_unset=True)
    )
    record = endpoint_record(ep)
    if not before.enabled and ep.enabled:
        failed = await services.webhooks.failed_count(who, ep)
        record["recovery"] = {
            "failed_deliveries": failed,
            "how": f'POST /api/v1/webhooks/endpoints/{ep.id}/recover with {{"since": …}}',
        }
    return ORJSONResponse(record)


@router.delete(
    "/webhooks/endpoints/{endpoint_id}",
    status_code=204,
    summary="Delete an endpoint",
    responses=_ERRORS,
)
async def delete_endpoint(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    await services.webhooks.delete_endpoint(who, endpoint_id)
    return Response(status_code=204)


def _secret_body(ep: Endpoint) -> dict[str, Any]:
    return {
        "secret": ep.secret,
        "previous_secret": ep.previous_secret,
        "previous_secret_expires_at": ts(ep.previous_secret_expires_at),
    }


@router.get(
    "/webhooks/endpoints/{endpoint_id}/secret",
    summary="Reveal the signing secret",
    responses=_ERRORS,
)
async def get_secret(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(_secret_body(await services.webhooks.get_endpoint(who, endpoint_id)))


@router.post(
    "/webhooks/endpoints/{endpoint_id}/pause",
    summary="Pause an endpoint",
    description="Its deliveries wait, attempted by no one and using no attempts, until it is "
    "resumed: the pending ones and those queued meanwhile (each says `waiting_for.reason` "
    "`paused`). An attempt already under way finishes. Pausing a paused endpoint changes "
    "nothing.",
    responses=_ERRORS,
)
async def pause_endpoint(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(endpoint_record(await services.webhooks.pause_endpoint(who, endpoint_id)))


@router.post(
    "/webhooks/endpoints/{endpoint_id}/resume",
    summary="Resume a paused endpoint",
    description="The deliveries it held are sent oldest first (a retry keeps its time).",
    responses=_ERRORS,
)
async def resume_endpoint(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    ep = await services.webhooks.resume_endpoint(who, endpoint_id)
    return ORJSONResponse(endpoint_record(ep))


@router.post(
    "/webhooks/endpoints/{endpoint_id}/rotate-secret",
    summary="Rotate the signing secret (the old one signs too during the grace period)",
    responses=_ERRORS,
)
async def rotate_secret(
    endpoint_id: str, services: ServicesDep, who: CallerDep, body: RotateRequest | None = None
) -> Response:
    grace = body.grace_seconds if body else None
    return ORJSONResponse(
        _secret_body(await services.webhooks.rotate_secret(who, endpoint_id, grace))
    )


@router.post(
    "/webhooks/endpoints/{endpoint_id}/promote-secret",
    summary="End a rotation's grace period now",
    responses=_ERRORS,
)
async def promote_secret(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(_secret_body(await services.webhooks.promote_secret(who, endpoint_id)))


@router.post(
    "/webhooks/endpoints/{endpoint_id}/test",
    status_code=202,
    summary="Send a test event",
    responses=_ERRORS,
)
async def send_test(endpoint_id: str, services: ServicesDep, who: CallerDep) -> Response:
    event = await services.webhooks.send_test(who, endpoint_id)
    return ORJSONResponse(event_record(event), status_code=202)


@router.post(
    "/webhooks/endpoints/{endpoint_id}/recover",
    status_code=202,
    summary="Replay the endpoint's failed deliveries in a time window",
    responses=_ERRORS,
)
async def recover(
    endpoint_id: str, body: RecoverRequest, services: ServicesDep, who: CallerDep
) -> Response:
    done = await services.webhooks.recover(
        who, endpoint_id, body.since, body.until, cursor=body.cursor
    )
    return ORJSONResponse(
        {
            "replayed": [delivery_record(d) for d in done.replayed],
            "skipped": done.skipped,
            "next_cursor": done.next_cursor,
        },
        status_code=202,
    )


@router.get("/webhooks/deliveries", summary="List deliveries, newest first", responses=_ERRORS)
async def list_deliveries(
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
    status: str | None = Query(None, min_length=1, description="pending, succeeded or failed"),
    endpoint_id: str | None = None,
    event: str | None = None,
    run_id: str | None = None,
) -> Response:
    page = await services.webhooks.list_deliveries(
        who,
        **paging,
        status=status,
        endpoint_id=endpoint_id,
        event=event,
        run_id=run_id,
    )
    return page_response(page, delivery_record)


@router.get(
    "/webhooks/deliveries/{delivery_id}", summary="A delivery with every attempt", responses=_ERRORS
)
async def get_delivery(delivery_id: str, services: ServicesDep, who: CallerDep) -> Response:
    delivery, event = await services.webhooks.get_delivery(who, delivery_id)
    record = delivery_record(delivery)
    record["attempt_log"] = [
        {
            "number": a.number,
            "started_at": ts(a.started_at),
            "finished_at": ts(a.finished_at),
            "duration_ms": a.duration_ms,
            "address": a.address,
            "status_code": a.status_code,
            "response_excerpt": a.response_excerpt,
            "error_class": a.error_class,
            "error_detail": a.error_detail,
            "next_attempt_at": ts(a.next_attempt_at),
        }
        for a in delivery.attempt_log
    ]
    record["body"] = orjson.Fragment(event.body) if event else None
    return ORJSONResponse(record)


@router.post(
    "/webhooks/deliveries/{delivery_id}/replay",
    status_code=202,
    summary="Send the same event again to the same endpoint",
    responses=_ERRORS,
)
async def replay(delivery_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(
        delivery_record(await services.webhooks.replay(who, delivery_id)), status_code=202
    )


@router.get("/events", summary="List events, newest first", responses=_ERRORS, tags=["events"])
async def list_events(
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
    event: str | None = None,
    run_id: str | None = None,
) -> Response:
    page = await services.webhooks.list_events(who, **paging, event=event, run_id=run_id)
    return page_response(page, event_record)


@router.get(
    "/events/{event_id}",
    summary="One event with its exact body",
    responses=_ERRORS,
    tags=["events"],
)
async def get_event(event_id: str, services: ServicesDep, who: CallerDep) -> Response:
    return ORJSONResponse(event_record(await services.webhooks.get_event(who, event_id)))
