"""Health, readiness, and the published JSON Schema."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from flowhook.api.deps import ServicesDep
from flowhook.api.responses import ORJSONResponse, error_response
from flowhook.definition import FLOW_SCHEMA
from flowhook.errors import StoreUnavailable
from flowhook.service.metrics import refresh_gauges, scrape_allowed

router = APIRouter(tags=["system"])


@router.get("/healthz", summary="The process is up, and the database's use of its disk budget")
async def healthz(services: ServicesDep) -> Response:
    # "disk" is read at most every few seconds and never fails the answer: a store that does
    # not answer leaves database_bytes and over_budget null (readiness is /readyz's)
    disk = await services.disk.status()
    return ORJSONResponse({"status": "ok", "disk": disk.as_json()})


@router.get("/readyz", summary="The store is reachable (503 when it is not)")
async def readyz(services: ServicesDep) -> Response:
    try:
        await services.db.ping()
    except StoreUnavailable as exc:
        return error_response(503, exc.message, exc.code, {"Retry-After": "1"})
    return ORJSONResponse({"status": "ok"})


class SchemaJSONResponse(ORJSONResponse):
    media_type = "application/schema+json"


@router.get(
    "/api/v1/schemas/flow.json",
    summary="JSON Schema of a flow definition",
    response_class=SchemaJSONResponse,
    responses={200: {"content": {"application/schema+json": {"schema": {"type": "object"}}}}},
)
async def flow_schema() -> Response:
    return SchemaJSONResponse(FLOW_SCHEMA)


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
async def metrics(request: Request, services: ServicesDep) -> Response:
    if not scrape_allowed(services.settings, request.headers.get("authorization")):
        return error_response(
            401,
            "send Authorization: Bearer <FLOWHOOK_METRICS_TOKEN> to read the metrics",
            "unauthenticated",
            {"WWW-Authenticate": "Bearer"},
        )
    hub = getattr(request.app.state, "hub", None)
    await refresh_gauges(services, streams_open=hub.open_streams if hub is not None else 0)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
