"""A run's live stream, shared by the API's route and the run page's: the Server-Sent Events
response, the process's hub from the app's start to its end, and opening one run's stream.
The hub itself is :mod:`flowhook.service.streams`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from flowhook.service import Principal, Services
from flowhook.service.streams import EventHub, Subscription, check_last_event_id, run_messages
from flowhook.store.db import Database

__all__ = ["STALLED", "EventStreamResponse", "open_run_stream", "hub_of", "running_hub"]

log = logging.getLogger("flowhook.streams")


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
