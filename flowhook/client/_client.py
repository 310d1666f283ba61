"""``Client`` (sync) and ``AsyncClient``: the same methods over httpx's twins."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from flowhook.client import _calls as calls
from flowhook.client._core import Call, Run, RunAccepted, api_base, check
from flowhook.client._errors import WaitTimeout
from flowhook.client._stream import Resume, StreamEvent, async_events, sync_events

__all__ = ["Client", "AsyncClient"]

USER_AGENT = "flowhook-python"
STREAM_READ_TIMEOUT = 60.0
"""Seconds a stream's read may wait: four heartbeats (the server sends one every 15 s)."""


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT}


MAX_LONG_POLL = 60.0
"""The longest ``?wait=`` the server takes."""


def _long_poll(deadline: float, read_timeout: float | None) -> float | None:
    """How long the next long poll may ask the server to hold the answer: what is left of
    the wait, within the server's limit and the client's read timeout; ``None`` when the
    wait is over."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    limit = MAX_LONG_POLL if read_timeout is None else max(0.1, read_timeout - 2.0)
    return max(0.01, min(left, limit, MAX_LONG_POLL))


def _rest(asked: float, interval: float, deadline: float) -> float:
    """A server that answered a long poll at once (an older one, without it) is asked again
    only after ``interval`` s."""
    return max(0.0, min(interval - (time.monotonic() - asked), deadline - time.monotonic()))


class Client:
    """A Flowhook API client. ``base_url`` is the server's root or its ``/api/v1`` URL."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=api_base(base_url),
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> Any:
        return check(self._http.request(call.method, call.path, **call.request_kwargs()))

    def execute(
        self,
        flow_id: str,
        payload: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunAccepted:
        """Start a run (SPEC §4.1); the same ``idempotency_key`` and payload give the same run."""
        return RunAccepted(**self._send(calls.execute(flow_id, payload, idempotency_key)))

    def get_run(self, run_id: str, wait: float | None = None) -> Run:
        """The run; with ``wait``, long-poll: answer as soon as it ends, or after ``wait`` s."""
        return Run.from_json(self._send(calls.get_run(run_id, wait)))

    def wait(self, run_id: str, interval: float = 2.0, max_attempts: int = 30) -> Run:
        """The run once it is completed, failed or cancelled, within ``interval`` ×
        ``max_attempts`` seconds (SPEC §4.2's polling budget); :class:`WaitTimeout` otherwise.
        It long-polls: the server answers as soon as the run ends, so one request usually
        does; a server that answers at once is asked again every ``interval`` s."""
        deadline = time.monotonic() + interval * max_attempts
        run = self.get_run(run_id)
        while not run.terminal:
            poll = _long_poll(deadline, self._http.timeout.read)
            if poll is None:
                raise WaitTimeout(run_id, max_attempts, run.status)
            asked = time.monotonic()
            run = self.get_run(run_id, wait=poll)
            if not run.terminal:
                time.sleep(_rest(asked, interval, deadline))
        return run

    def stream(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        max_retries: int = 5,
        read_timeout: float = STREAM_READ_TIMEOUT,
    ) -> Iterator[StreamEvent]:
        """The run's events as they happen: those so far, then each new one, ending after
        its terminal event (``flow.completed``, ``flow.failed`` or ``flow.cancelled``).
        ``last_event_id``: start after that event. A dropped connection is opened again
        after the last event delivered (``max_retries`` times in a row at most, waiting
        longer each time), then :class:`StreamError`; no event comes twice."""
        state = Resume(run_id, last_event_id=last_event_id, max_retries=max_retries)
        return sync_events(self._http, state, read_timeout)

    def list_runs(
        self,
        *,
        flow_id: str | None = None,
        status: str | None = None,
        limit: int = 20,
        cursor: str | None = None,
    ) -> list[Run]:
        return [
            Run.from_json(r)
            for r in self._send(calls.list_runs(flow_id, status, limit, cursor))["data"]
        ]

    def cancel(self, run_id: str) -> Run:
        return Run.from_json(self._send(calls.cancel(run_id)))

    def rerun(
        self,
        run_id: str,
        *,
        from_step: str | None = None,
        flow_version: int | str | None = None,
        payload: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunAccepted:
        """Rerun a finished run: a new run whose steps before ``from_step`` (default: the
        first with no result) are reused, not run again; ``flow_version`` a number or
        ``"latest"`` (default: the run's own), ``payload`` the new payload (default: its own)."""
        call = calls.rerun(run_id, from_step, flow_version, payload, idempotency_key)
        return RunAccepted(**self._send(call))

    def approve(self, run_id: str, step_id: str, comment: str | None = None) -> dict[str, Any]:
        """Approve a run's ``approval`` step (409 once it is decided)."""
        return dict(self._send(calls.decide(run_id, step_id, True, comment)))

    def reject(self, run_id: str, step_id: str, comment: str | None = None) -> dict[str, Any]:
        """Reject a run's ``approval`` step (409 once it is decided)."""
        return dict(self._send(calls.decide(run_id, step_id, False, comment)))

    def send_signal(
        self,
        name: str,
        data: dict[str, Any] | None = None,
        *,
        id: str | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """Send a signal: to every run waiting for ``name`` whose ``match`` fields ``data``
        holds, or with ``run_id`` to that run only. ``id``: your id for it (the same again is
        the same signal). Answers ``{"id", "name", "matched", "run_id", "created_at"}``."""
        return dict(self._send(calls.send_signal(name, data, id, run_id)))

    def create_flow(self, definition: dict[str, Any]) -> dict[str, Any]:
        return dict(self._send(calls.create_flow(definition)))

    def update_flow(self, flow_id: str, definition: dict[str, Any]) -> dict[str, Any]:
        return dict(self._send(calls.update_flow(flow_id, definition)))

    def get_flow(self, flow_id: str) -> dict[str, Any]:
        return dict(self._send(calls.get_flow(flow_id)))

    def list_flows(
        self, *, limit: int = 100, cursor: str | None = None, slug: str | None = None
    ) -> list[dict[str, Any]]:
        return list(self._send(calls.list_flows(limit, cursor, slug))["data"])

    def flow_by_slug(self, slug: str) -> dict[str, Any] | None:
        """The flow whose current version has ``slug``, or ``None``."""
        found = self.list_flows(limit=1, slug=slug)
        return found[0] if found else None

    def validate_flow(self, definition: dict[str, Any]) -> dict[str, Any]:
        """The definition as it would be saved; raises :class:`APIError` (400, with every
        problem) as saving it would."""
        return dict(self._send(calls.validate_flow(definition))["definition"])

    def create_endpoint(
        self,
        url: str,
        events: list[str],
        description: str = "",
        *,
        rate_limit: float | None = None,
        fifo: bool = False,
        flow_ids: list[str] | None = None,
    ) -> dict[str, Any]:
        """Register a webhook endpoint; the answer carries its ``secret`` (shown once).
        ``rate_limit``: deliveries a second; ``fifo``: one in flight, in event order;
        ``flow_ids``: only events of these flows."""
        call = calls.create_endpoint(
            url, events, description, rate_limit=rate_limit, fifo=fifo, flow_ids=flow_ids
        )
        return dict(self._send(call))

    def list_endpoints(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return list(self._send(calls.list_endpoints(limit))["data"])

    def list_deliveries(
        self, *, status: str | None = None, limit: int = 20
    ) -> list[dict[str, Any]]:
        return list(self._send(calls.list_deliveries(status, limit))["data"])

    def replay_delivery(self, delivery_id: str) -> dict[str, Any]:
        return dict(self._send(calls.replay_delivery(delivery_id)))

    def create_hook(
        self,
        flow_id: str | None = None,
        verify: dict[str, Any] | None = None,
        *,
        signal: str | None = None,
    ) -> dict[str, Any]:
        """An inbound hook: a public URL whose POSTs start runs of ``flow_id``, or (with
        ``signal`` instead) send that signal with the body as its data."""
        return dict(self._send(calls.create_hook(flow_id, verify, signal)))

    def create_schedule(
        self, flow_id: str, cron: str, timezone: str = "UTC", payload: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return dict(self._send(calls.create_schedule(flow_id, cron, timezone, payload)))

    def list_schedules(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return list(self._send(calls.list_schedules(limit))["data"])

    def workers(self) -> dict[str, Any]:
        """``{"workers": [...], "queues": [...]}``: the workers seen in the last 60 s (their
        tasks, when last seen, how many tasks each holds) and each task name's queue."""
        return dict(self._send(calls.workers()))

    def flow_versions(self, flow_id: str) -> list[dict[str, Any]]:
        """A flow's versions, newest first: ``{"version", "created_at"}`` each."""
        return list(self._send(calls.flow_versions(flow_id))["data"])

    def delete_flow(self, flow_id: str) -> None:
        """Archive a flow: executing it answers 404 afterwards; its runs are kept."""
        self._send(calls.delete_flow(flow_id))

    def pause_flow(self, flow_id: str) -> dict[str, Any]:
        """Pause a flow: it still accepts executes; its queued runs wait for its resume."""
        return dict(self._send(calls.pause_flow(flow_id)))

    def resume_flow(self, flow_id: str, rate_per_second: float | None = None) -> dict[str, Any]:
        """Resume a flow: the runs it held start oldest first, at most ``rate_per_second``."""
        return dict(self._send(calls.resume_flow(flow_id, rate_per_second)))

    def pause_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        """Pause an endpoint: its deliveries wait, using no attempts, for its resume."""
        return dict(self._send(calls.pause_endpoint(endpoint_id)))

    def resume_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        """Resume an endpoint: the deliveries it held are sent oldest first."""
        return dict(self._send(calls.resume_endpoint(endpoint_id)))

    def get_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        return dict(self._send(calls.get_endpoint(endpoint_id)))

    def delete_endpoint(self, endpoint_id: str) -> None:
        self._send(calls.delete_endpoint(endpoint_id))

    def test_endpoint(self, endpoint_id: str) -> dict[str, Any]:
        """Send the endpoint a ``webhook.test`` event; answers the event (its delivery follows)."""
        return dict(self._send(calls.test_endpoint(endpoint_id)))

    def list_hooks(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return list(self._send(calls.list_hooks(limit))["data"])

    def get_hook(self, hook_id: str) -> dict[str, Any]:
        return dict(self._send(calls.get_hook(hook_id)))

    def rotate_hook(self, hook_id: str) -> dict[str, Any]:
        """Move the hook to a new URL (and a new secret, for a verified one); the old URL
        answers 404 at once. The answer carries the new secret (shown once)."""
        return dict(self._send(calls.rotate_hook(hook_id)))

    def delete_hook(self, hook_id: str) -> None:
        self._send(calls.delete_hook(hook_id))

    def update_schedule(self, schedule_id: str, **changes: Any) -> dict[str, Any]:
        """Change a schedule: ``enabled``, ``cron``, ``timezone``, ``payload``."""
        return dict(self._send(calls.update_schedule(schedule_id, changes)))

    def delete_schedule(self, schedule_id: str) -> None:
        self._send(calls.delete_schedule(schedule_id))


class AsyncClient:
    """:class:`Client` for asyncio: the same methods, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=api_base(base_url),
            headers=_headers(api_key),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> Any:
        return check(await self._http.request(call.method, call.path, **call.request_kwargs()))

    async def execute(
        self,
        flow_id: str,
        payload: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunAccepted:
        return RunAccepted(**await self._send(calls.execute(flow_id, payload, idempotency_key)))

    async def get_run(self, run_id: str, wait: float | None = None) -> Run:
        """The run; with ``wait``, long-poll: answer as soon as it ends, or after ``wait`` s."""
        return Run.from_json(await self._send(calls.get_run(run_id, wait)))

    async def wait(self, run_id: str, interval: float = 2.0, max_attempts: int = 30) -> Run:
        """As :meth:`Client.wait`: long-polled, within ``interval`` × ``max_attempts`` s."""
        deadline = time.monotonic() + interval * max_attempts
        run = await self.get_run(run_id)
        while not run.terminal:
            poll = _long_poll(deadline, self._http.timeout.read)
            if poll is None:
                raise WaitTimeout(run_id, max_attempts, run.status)
            asked = time.monotonic()
            run = await self.get_run(run_id, wait=poll)
            if not run.terminal:
                await asyncio.sleep(_rest(asked, interval, deadline))
        return run

    def stream(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        max_retries: int = 5,
        read_timeout: float = STREAM_READ_TIMEOUT,
    ) -> AsyncIterator[StreamEvent]:
        """:meth:`Client.stream` for asyncio: ``async for event in client.stream(run_id)``."""
        state = Resume(run_id, last_event_id=last_event_id, max_retries=max_retries)
        return async_events(self._http, state, read_timeout)

    async def list_runs(
        self,
        *,
        flow_id: str | None = None,
        status: str | None = None,
        limit: int = 20,
        cursor: str | None = None,
    ) -> list[Run]:
        body = await self._send(calls.list_runs(flow_id, status, limit, cursor))
        return [Run.from_json(r) for r in body["data"]]

    async def cancel(self, run_id: str) -> Run:
        return Run.from_json(await self._send(calls.cancel(run_id)))

    async def rerun(
        self,
        run_id: str,
        *,
        from_step: str | None = None,
        flow_version: int | str | None = None,
        payload: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunAccepted:
        call = calls.rerun(run_id, from_step, flow_version, payload, idempotency_key)
        return RunAccepted(**await self._send(call))

    async def approve(
        self, run_id: str, step_id: str, comment: str | None = None
    ) -> dict[str, Any]:
        return dict(await self._send(calls.decide(run_id, step_id, True, comment)))

    async def reject(self, run_id: str, step_id: str, comment: str | None = None) -> dict[str, Any]:
        return dict(await self._send(calls.decide(run_id, step_id, False, comment)))

    async def send_signal(
        self,
        name: str,
        data: dict[str, Any] | None = None,
        *,
        id: str | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        return dict(await self._send(calls.send_signal(name, data, id, run_id)))

    async def create_flow(self, definition: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._send(calls.create_flow(definition)))

    async def create_endpoint(
        self,
        url: str,
        events: list[str],
        description: str = "",
        *,
        rate_limit: float | None = None,
        fifo: bool = False,
        flow_ids: list[str] | None = None,
    ) -> dict[str, Any]:
        call = calls.create_endpoint(
            url, events, description, rate_limit=rate_limit, fifo=fifo, flow_ids=flow_ids
        )
        return dict(await self._send(call))

    async def list_deliveries(
        self, *, status: str | None = None, limit: int = 20
    ) -> list[dict[str, Any]]:
        return list((await self._send(calls.list_deliveries(status, limit)))["data"])
