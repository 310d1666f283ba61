"""Live streams of events as Server-Sent Events: a run's (DESIGN.md "Watching and tracing
runs"), and a workspace and mode's. The response and the hub's life are
:mod:`flowhook.serving.streams` (the run page streams too); the hub that feeds them is
:mod:`flowhook.service.streams`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import StreamingResponse

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import error_responses
from flowhook.service.streams import check_event_filter, check_last_event_id, scope_messages
from flowhook.serving.streams import EventStreamResponse, hub_of, open_run_stream

__all__ = ["router"]

router = APIRouter(tags=["streams"])

_ERRORS = error_responses(400, 401, 404, 429, 503)

_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: each message `id: <event id>`, `event: <event "
        "name>`, `data: <the event's envelope, as webhooks carry it>`; comment lines keep an "
        "idle stream open.",
        "content": {"text/event-stream": {}},
    },
    **_ERRORS,
}

LastEventId = Annotated[
    str | None,
    Header(alias="Last-Event-ID", description="Resume after this event id (evt_…)."),
]


@router.get(
    "/flows/runs/{run_id}/stream",
    summary="Follow a run's events live (Server-Sent Events)",
    description="The run's events so far, then each new one as it is committed; the stream "
    "ends after the run's terminal event (`flow.completed`, `flow.failed` or "
    "`flow.cancelled`). `Last-Event-ID` resumes after that event.",
    response_class=StreamingResponse,
    responses=_STREAM_DOC,
)
async def run_stream(
    run_id: str,
    request: Request,
    services: ServicesDep,
    who: CallerDep,
    last_event_id: LastEventId = None,
) -> EventStreamResponse:
    return await open_run_stream(request, services, who, run_id, last_event_id)


@router.get(
    "/events/stream",
    summary="Follow the workspace's events live (Server-Sent Events)",
    description="Each event of the key's workspace and mode as it is committed (only those "
    "of `flow_id`, of type `event`, when given); it does not end. `Last-Event-ID` first "
    "sends the events after that one.",
    response_class=StreamingResponse,
    responses=_STREAM_DOC,
)
async def events_stream(
    request: Request,
    services: ServicesDep,
    who: CallerDep,
    flow_id: Annotated[str | None, Query(description="Only this flow's events.")] = None,
    event: Annotated[str | None, Query(description="Only events of this type.")] = None,
    last_event_id: LastEventId = None,
) -> EventStreamResponse:
    after = check_last_event_id(last_event_id)
    event_type = check_event_filter(event)
    hub = hub_of(request)
    sub = hub.subscribe(who, flow_id=flow_id or None, event_type=event_type, after=after)
    heartbeat = services.settings.stream_heartbeat
    body = scope_messages(hub, services.db, sub, after=after, heartbeat=heartbeat)
    return EventStreamResponse(body, hub, sub, services.settings.stream_write_timeout)
