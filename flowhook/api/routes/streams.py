"""Live streams of events as Server-Sent Events: a run's (DESIGN.md "Watching and tracing
runs"), and a workspace and mode's. The hub that feeds them is :mod:`flowhook.service.streams`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import error_responses
from flowhook.service import Principal, Services
from flowhook.service.streams import (
    EventHub,
    Subscription,
    check_event_filter,
    check_last_event_id,
    run_messages,
    scope_messages,
)
from flowhook.store.db import Database

__all__ = ["router", "EventStreamResponse", "open_run_stream", "hub_of", "running_hub"]

router = APIRouter(tags=["streams"])

log = logging.getLogger("flowhook.streams")

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


STALLED = contextvars.ContextVar("flowhook_stream_stalled", default=False)
"""Set in a stream's request when its client stopped reading and the stream was dropped."""


class _Stalled(Exception):
    pass


class _QuietStalled(logging.Filter):
    """uvicorn says "ASGI callable returned without completing response" at error level for a
    stream dropped because its client stopped reading; that is expected, and said at info."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not STALLED.get()


logging.getLogger("uvicorn.error").addFilter(_QuietStalled())


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` whose subscription is released however the response ends
    (sent in full, client gone, server stopping), even if its body never started. A client
    whose connection takes no bytes for ``write_timeout`` seconds is dropped (its connection
    closed): what the stream holds for it is then let go."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        hub: EventHub,
        sub: Subscription,
        write_timeout: float = 30.0,
    ) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            # Connection: close, so a stream that ends (its run's end, a client fallen behind,
            # the server stopping) closes its connection too.
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "close"},
        )
        self._hub = hub
        self._sub = sub
        self._write_timeout = write_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded(message: Message) -> None:
            try:
                async with asyncio.timeout(self._write_timeout):
                    await send(message)
            except TimeoutError:
                raise _Stalled from None

        try:
            await super().__call__(scope, receive, bounded)
        except* _Stalled:  # returned unfinished: the server closes the connection
            STALLED.set(True)
            log.info(
                "event streams: a client read nothing for %g s; its stream is closed",
                self._write_timeout,
            )
        finally:
            self._hub.unsubscribe(self._sub)


@contextlib.asynccontextmanager
async def running_hub(db: Database, services: Services) -> AsyncIterator[EventHub]:
    """The process's hub, from the app's start to its end; a revoked key or an ended
    session closes its streams. Under uvicorn, SIGTERM or SIGINT ends every open stream at
    once: uvicorn waits for open responses before it shuts the app down, and a stream never
    finishes by itself."""
    settings = services.settings
    hub = EventHub(
        db,
        poll_interval=settings.stream_poll_interval,
        queue_size=settings.stream_queue,
        max_per_key=settings.max_streams_per_key,
        recheck_every=settings.stream_heartbeat,
        clock=services.clock,
    )
    services.keys.on_credentials_ended(hub.credentials_ended)
    await hub.start()
    services.runs.hub = hub  # long polls wake on their run's events
    try:
        with _closed_on_exit_signal(hub):
            yield hub
    finally:
        services.runs.hub = None
        await hub.stop()


@contextlib.contextmanager
def _closed_on_exit_signal(hub: EventHub) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    chained: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous) or getattr(previous, "__name__", "") != "handle_exit":
            continue  # not uvicorn's (an app driven by tests): leave it alone
        chained[sig] = previous
        signal.signal(sig, _closing(loop, hub, previous))
    try:
        yield
    finally:
        for caught, previous in chained.items():
            with contextlib.suppress(ValueError):
                signal.signal(caught, previous)


def _closing(
    loop: asyncio.AbstractEventLoop, hub: EventHub, previous: Callable[[int, Any], Any]
) -> Callable[[int, FrameType | None], None]:
    def handler(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(hub.close)
        previous(sig, frame)

    return handler


def hub_of(request: Request) -> EventHub:
    hub: EventHub = request.app.state.hub
    return hub


async def open_run_stream(
    request: Request,
    services: Services,
    who: Principal,
    run_id: str,
    last_event_id: str | None,
    session: str | None = None,
) -> EventStreamResponse:
    """The run's stream for ``who`` (404 for a run another workspace or mode owns); the
    API's route and the run page's (``session``: its session's hash) both answer with it."""
    after = check_last_event_id(last_event_id)
    await services.runs.get(who, run_id, nested=False)
    hub = hub_of(request)
    sub = hub.subscribe(who, run_id=run_id, after=after, session=session)
    heartbeat = services.settings.stream_heartbeat
    body = run_messages(hub, services.db, sub, after=after, heartbeat=heartbeat)
    return EventStreamResponse(body, hub, sub, services.settings.stream_write_timeout)


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
