"""A run's event stream (``GET /flows/runs/{run_id}/stream``) for the sync and async clients:
the stored events of the run, then each new one, until its terminal event.

A connection that drops before that event is opened again with ``Last-Event-ID`` set to the
last event delivered, so the server sends only the events after it; ids already delivered
are skipped besides, so no event comes twice. Reconnections are bounded (``max_retries`` in a
row without anything received), waiting longer after each; then :class:`StreamError`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from flowhook.client._core import Call, parse_error
from flowhook.client._errors import APIError, StreamError
from flowhook.client._sse import ServerSentEvent, SSEDecoder

__all__ = ["TERMINAL_EVENTS", "Resume", "StreamEvent", "async_events", "sync_events"]

TERMINAL_EVENTS = frozenset({"flow.completed", "flow.failed", "flow.cancelled"})
"""The events that end a run, and with it the run's stream."""

RETRYABLE = frozenset({429, 500, 502, 503, 504})
"""Answers to a reconnection worth another try: a proxy or server restarting, or (429) the
dropped connection still counted against the key until the server notices it is gone."""


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a run's stream: ``id`` (``evt_…``), ``event`` (``flow.step_completed`` …)
    and ``data``, the event's envelope (``event``, ``flow_id``, ``run_id``, ``timestamp``,
    ``payload``) as the webhooks carry it; ``raw`` is that envelope's JSON as sent."""

    id: str
    event: str
    data: dict[str, Any]
    raw: str = field(repr=False)

    @property
    def payload(self) -> dict[str, Any]:
        payload = self.data.get("payload")
        return payload if isinstance(payload, dict) else {}

    @property
    def run_id(self) -> str | None:
        return self.data.get("run_id")

    @property
    def timestamp(self) -> str | None:
        return self.data.get("timestamp")

    @property
    def terminal(self) -> bool:
        """The run's last event: completed, failed or cancelled."""
        return self.event in TERMINAL_EVENTS


STAYED_UP = 30.0
"""Seconds a connection lasts, when it worked: two heartbeats."""


class Resume:
    """What a stream keeps from one connection to the next: the last event id, the ids
    delivered, the server's ``retry:`` and the drops in a row."""

    def __init__(
        self,
        run_id: str,
        *,
        last_event_id: str | None,
        max_retries: int,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        self.run_id = run_id
        self.last_event_id = last_event_id
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.drops = 0
        self.opened = False  # a connection was answered 200 once: drops are retried from then
        self._seen: set[str] = set()
        self._since = 0.0  # when the current connection was answered

    def call(self) -> Call:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        return Call("GET", f"/flows/runs/{self.run_id}/stream", headers=headers)

    def answered(self, response: httpx.Response) -> APIError | None:
        """The error of a non-2xx answer (its body read), or ``None`` when it streams."""
        if response.status_code < 400:
            if "text/event-stream" not in response.headers.get("content-type", ""):
                return APIError(
                    response.status_code,
                    "not_a_stream",
                    f"expected text/event-stream, got {response.headers.get('content-type')!r}",
                )
            self.opened = True
            self._since = time.monotonic()
            return None
        return parse_error(response)

    def fatal(self, error: APIError) -> bool:
        """Raise it now (the first connection, or an answer no retry changes)?"""
        return not self.opened or error.status not in RETRYABLE

    def feed(self, decoder: SSEDecoder, chunk: bytes) -> list[StreamEvent]:
        """The new events ``chunk`` completes (the server's ``retry:`` taken on the way)."""
        messages = decoder.feed(chunk)
        if decoder.retry is not None:
            self.backoff = decoder.retry / 1000
        return [e for e in map(self.take, messages) if e is not None]

    def take(self, message: ServerSentEvent) -> StreamEvent | None:
        """The event a message carries, or ``None`` for one delivered before."""
        if message.id is not None and message.id in self._seen:
            return None
        try:
            data = json.loads(message.data)
        except ValueError as exc:
            raise StreamError(
                self.run_id, self.last_event_id, f"event {message.id} is not JSON: {exc}"
            ) from exc
        if not isinstance(data, dict):
            raise StreamError(
                self.run_id, self.last_event_id, f"event {message.id} is not a JSON object"
            )
        if message.id is not None:
            self._seen.add(message.id)
            self.last_event_id = message.id
        self.drops = 0  # something new came through: the connection worked
        return StreamEvent(message.id or "", message.event, data, message.data)

    def dropped(self, reason: str) -> float:
        """Seconds to wait before connecting again; :class:`StreamError` past the limit. A
        connection that stayed up a while (heartbeats came) worked: drops count anew."""
        if self._since and time.monotonic() - self._since >= STAYED_UP:
            self.drops = 0
        self._since = 0.0
        self.drops += 1
        if self.drops > self.max_retries:
            raise StreamError(
                self.run_id,
                self.last_event_id,
                f"the stream dropped {self.drops} times in a row before the run's end"
                f" (last: {reason})",
            )
        return min(self.backoff * 2.0 ** (self.drops - 1), self.max_backoff)


def _timeout(http_timeout: httpx.Timeout, read_timeout: float) -> httpx.Timeout:
    """The client's timeouts, but reads wait ``read_timeout`` s: a quiet stream sends only a
    heartbeat every 15 s, and a read cut short would reconnect for nothing."""
    return httpx.Timeout(
        read=read_timeout,
        connect=http_timeout.connect,
        write=http_timeout.write,
        pool=http_timeout.pool,
    )


ENDED = "the server closed the stream before the run's end"


def sync_events(http: httpx.Client, state: Resume, read_timeout: float) -> Iterator[StreamEvent]:
    timeout = _timeout(http.timeout, read_timeout)
    while True:
        call = state.call()
        try:
            with http.stream(call.method, call.path, headers=call.headers, timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                if (error := state.answered(r)) is not None:
                    if state.fatal(error):
                        raise error
                    reason = str(error)
                else:
                    decoder = SSEDecoder()
                    for chunk in r.iter_bytes():
                        for event in state.feed(decoder, chunk):
                            yield event
                            if event.terminal:
                                return
                    reason = ENDED
        except httpx.TransportError as exc:
            if not state.opened:
                raise
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        time.sleep(state.dropped(reason))


async def async_events(
    http: httpx.AsyncClient, state: Resume, read_timeout: float
) -> AsyncIterator[StreamEvent]:
    timeout = _timeout(http.timeout, read_timeout)
    while True:
        call = state.call()
        try:
            async with http.stream(
                call.method, call.path, headers=call.headers, timeout=timeout
            ) as r:
                if r.status_code >= 400:
                    await r.aread()
                if (error := state.answered(r)) is not None:
                    if state.fatal(error):
                        raise error
                    reason = str(error)
                else:
                    decoder = SSEDecoder()
                    async for chunk in r.aiter_bytes():
                        for event in state.feed(decoder, chunk):
                            yield event
                            if event.terminal:
                                return
                    reason = ENDED
        except httpx.TransportError as exc:
            if not state.opened:
                raise
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        await asyncio.sleep(state.dropped(reason))
