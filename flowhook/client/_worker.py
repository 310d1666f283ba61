"""``Worker``: runs a team's own functions as the ``task`` steps of their flows, in the team's
own processes, over the worker protocol (docs/workers.md): ``POST /api/v1/tasks/batch``
reports the attempts it finished and claims more in one request, ``heartbeat`` keeps what it
holds.

    from flowhook import Worker, NonRetryableError

    worker = Worker("http://127.0.0.1:8080", "sk_test_…", concurrency=32)

    @worker.task("payments.charge")
    async def charge(input, ctx):
        if input["amount"] <= 0:
            raise NonRetryableError("amount must be positive")
        return {"charge_id": await stripe_charge(input, idempotency_key=ctx.task_id)}

    worker.run()  # until SIGTERM or SIGINT: then it claims no more, finishes, exits 0

A task runs at least once: a worker that dies holding one loses it when its lease ends and
another takes it as the next attempt, so a function with effects outside deduplicates on
``ctx.task_id`` (the same on every attempt). Each task is heartbeated while it runs; a run
cancelled meanwhile sets ``ctx.cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from flowhook.client._core import api_base, check
from flowhook.client._errors import APIError, FlowhookClientError

__all__ = ["Worker", "TaskContext", "NonRetryableError", "TaskFunction"]

log = logging.getLogger("flowhook.worker")

MAX_CLAIM = 100
"""The most tasks one claim may ask for (the server's limit)."""
CLAIM_WAIT = 20.0
"""Seconds a claim waits for a task before it answers none (a long poll)."""


class NonRetryableError(Exception):
    """Raised by a task function: the task fails at once, whatever its step's ``retry``
    says (any other exception fails the attempt, and ``retry`` decides)."""


@dataclass(slots=True)
class TaskContext:
    """What a task function knows of the task it runs."""

    task_id: str
    """The task's id: the same on every attempt (deduplicate on it)."""
    task: str
    attempt: int
    run_id: str
    flow_id: str
    step_id: str
    traceparent: str | None = None
    lease_expires_at: str | None = None
    heartbeat_seconds: float = 30.0
    """How long a lease lasts without a heartbeat (the step's ``heartbeat_seconds``)."""
    _cancelled: bool = field(default=False, repr=False)

    @property
    def cancelled(self) -> bool:
        """The run was cancelled, or this attempt no longer holds the task: what it returns
        will not be recorded."""
        return self._cancelled


TaskFunction = Callable[[Any, TaskContext], Any]
"""``async def f(input, ctx)`` or ``def f(input, ctx)`` (run in a thread), returning the
step's output (JSON)."""


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _seconds_left(lease: str | None, now: float) -> float:
    """Seconds until ``lease`` (an ISO time the server gave), from wall-clock ``now``."""
    if not lease:
        return 10.0
    until = datetime.fromisoformat(lease.replace("Z", "+00:00")).timestamp()
    return until - now


@dataclass(frozen=True, slots=True)
class _End:
    """A finished attempt, as ``POST /tasks/batch`` takes it."""

    task_id: str
    attempt: int
    result: dict[str, Any]

    @property
    def body(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "attempt": self.attempt, **self.result}


class Worker:
    """Claims the tasks of the names it has functions for, ``concurrency`` at a time, runs
    each, heartbeats it while it runs and reports its output or its error."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        concurrency: int = 10,
        worker_id: str | None = None,
        timeout: float = 30.0,
        claim_wait: float = CLAIM_WAIT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.base_url = base_url
        self.concurrency = concurrency
        self.worker_id = worker_id or _default_worker_id()
        self._api_key = api_key
        self._timeout = timeout
        self._claim_wait = claim_wait
        self._transport = transport
        self._functions: dict[str, TaskFunction] = {}
        self._running: dict[str, tuple[TaskContext, asyncio.Task[None]]] = {}
        self._stopping: asyncio.Event | None = None  # made in the running loop
        self._ends: list[_End] = []
        """Attempts finished and not yet reported (sent with the next batch)."""
        self._ended: asyncio.Event | None = None
        self._closing = False
        self.completed = 0
        """Tasks this worker finished (completed or failed), for its logs and tests."""

    def task(self, name: str) -> Callable[[TaskFunction], TaskFunction]:
        """Register the decorated function as the code of the tasks named ``name``."""

        def register(fn: TaskFunction) -> TaskFunction:
            if name in self._functions:
                raise ValueError(f"task {name!r} already has a function")
            self._functions[name] = fn
            return fn

        return register

    @property
    def tasks(self) -> list[str]:
        return sorted(self._functions)

    def run(self) -> None:
        """Run until SIGTERM or SIGINT: then claim no more, finish the tasks held, return."""
        asyncio.run(self.serve())

    def stop(self) -> None:
        """Claim no more; :meth:`serve` returns once the tasks held are finished."""
        if self._stopping is not None:
            self._stopping.set()

    async def serve(self, *, handle_signals: bool = True) -> None:
        """The worker's loop, in the running event loop (``run`` without ``asyncio.run``)."""
        if not self._functions:
            raise FlowhookClientError("the worker has no task functions: use @worker.task(name)")
        self._stopping = asyncio.Event()
        self._ended = asyncio.Event()
        self._closing = False
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        limits = httpx.Limits(max_connections=self.concurrency + 4)
        headers = {"Authorization": f"Bearer {self._api_key}", "User-Agent": "flowhook-worker"}
        async with httpx.AsyncClient(
            base_url=api_base(self.base_url), headers=headers, timeout=self._timeout,
            limits=limits, transport=self._transport,
        ) as http:  # fmt: skip
            beats = asyncio.create_task(self._heartbeats(http), name="flowhook-heartbeats")
            reports = asyncio.create_task(self._reports(http), name="flowhook-reports")
            try:
                await self._claims(http)
                while self._running:  # drain: finish what is held
                    await asyncio.gather(
                        *(t for _, t in list(self._running.values())), return_exceptions=True
                    )
                self._closing = True  # then report the last ends
                self._ended.set()
                await reports
            finally:
                for task in (beats, reports):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                if handle_signals:
                    for sig in (signal.SIGTERM, signal.SIGINT):
                        loop.remove_signal_handler(sig)

    async def _claims(self, http: httpx.AsyncClient) -> None:
        assert self._stopping is not None
        room = asyncio.Semaphore(self.concurrency)
        failures = 0
        while not self._stopping.is_set():
            await room.acquire()
            await asyncio.sleep(0)  # the tasks just started that finish at once free room too
            free = 1
            while free < min(MAX_CLAIM, self.concurrency) and not room.locked():
                await room.acquire()
                free += 1
            try:
                claimed = await self._claim(http, free)
                failures = 0
            except (httpx.HTTPError, APIError) as exc:
                claimed = []
                failures += 1
                log.warning("claim failed (%s); trying again", exc)
                await self._pause(min(30.0, 0.5 * 2 ** min(failures, 6)))
            for task in claimed:
                self._start(http, task, room)
            for _ in range(free - len(claimed)):
                room.release()

    async def _claim(self, http: httpx.AsyncClient, free: int) -> list[dict[str, Any]]:
        """Up to ``free`` tasks, reporting the ends waiting to be sent on the way; a long
        poll that a stop cuts short (a task claimed by a cut request is offered again when
        its lease ends; its ends are sent again, which the server answers the same)."""
        assert self._stopping is not None
        ends = self._take_ends()
        request = asyncio.ensure_future(self._batch(http, ends, free, self._claim_wait))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({request, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not request.done():
                request.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError, APIError):
                    await request
        if request.cancelled():
            self._give_back(ends)
            return []
        try:
            return request.result()
        except BaseException:
            self._give_back(ends)
            raise

    async def _batch(
        self, http: httpx.AsyncClient, ends: list[_End], free: int, wait: float
    ) -> list[dict[str, Any]]:
        """One ``POST /tasks/batch``: record ``ends``, then claim up to ``free`` tasks."""
        body = {"worker_id": self.worker_id, "tasks": self.tasks, "max": free,
                "wait_seconds": wait if free else 0, "ends": [e.body for e in ends]}  # fmt: skip
        answer = check(await http.post("/tasks/batch", json=body, timeout=wait + self._timeout))
        for end, said in zip(ends, answer.get("ends", []), strict=False):
            self._answered(end, said)
        return list(answer.get("tasks", []))

    def _answered(self, end: _End, said: dict[str, Any]) -> None:
        if said.get("status") == "refused":
            error = said.get("error") or {}
            if error.get("code") == 409:
                log.info("task %s attempt %d no longer holds the task", end.task_id, end.attempt)
            else:
                log.error("task %s: %s", end.task_id, error.get("message"))
        self.completed += 1

    def _take_ends(self) -> list[_End]:
        ends, self._ends = self._ends[:MAX_CLAIM], self._ends[MAX_CLAIM:]
        return ends

    def _give_back(self, ends: list[_End]) -> None:
        """Ends whose report may not have arrived: sent again (answered the same)."""
        if ends:
            self._ends[:0] = ends
            assert self._ended is not None
            self._ended.set()

    async def _reports(self, http: httpx.AsyncClient) -> None:
        """Report ends as they come (the claim sends them too when it can, but it may be
        waiting for tasks), one request at a time; on close, until none is left."""
        assert self._ended is not None
        failures = 0
        while True:
            if not self._ends:
                if self._closing:
                    return
                self._ended.clear()
                await self._ended.wait()
                continue
            ends = self._take_ends()
            try:
                await self._batch(http, ends, 0, 0)
                failures = 0
            except (httpx.HTTPError, APIError) as exc:
                failures += 1
                if failures > 6 or (isinstance(exc, APIError) and exc.status < 500):
                    log.error(
                        "%d task ends could not be reported (%s); they will be offered again",
                        len(ends), exc,
                    )  # fmt: skip
                    failures = 0
                    continue
                log.warning("reporting %d task ends failed (%s); trying again", len(ends), exc)
                self._give_back(ends)
                await asyncio.sleep(min(5.0, 0.2 * 2**failures))

    async def _pause(self, seconds: float) -> None:
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _start(
        self, http: httpx.AsyncClient, task: dict[str, Any], room: asyncio.Semaphore
    ) -> None:
        ctx = TaskContext(
            task_id=task["task_id"], task=task["task"], attempt=task["attempt"],
            run_id=task.get("run_id", ""), flow_id=task.get("flow_id", ""),
            step_id=task.get("step_id", ""), traceparent=task.get("traceparent"),
            lease_expires_at=task.get("lease_expires_at"),
            heartbeat_seconds=float(task.get("heartbeat_seconds", 30)),
        )  # fmt: skip

        async def work() -> None:
            try:
                await self._run_one(ctx, task.get("input"))
            finally:
                self._running.pop(ctx.task_id, None)
                room.release()

        self._running[ctx.task_id] = (ctx, asyncio.create_task(work(), name=ctx.task_id))

    async def _run_one(self, ctx: TaskContext, value: Any) -> None:
        fn = self._functions.get(ctx.task)
        try:
            if fn is None:
                raise NonRetryableError(f"this worker has no function for task {ctx.task!r}")
            if inspect.iscoroutinefunction(fn):
                output = await fn(value, ctx)
            else:
                output = await asyncio.to_thread(fn, value, ctx)
                if inspect.isawaitable(output):
                    output = await output
            end = _End(ctx.task_id, ctx.attempt, {"output": output})
        except Exception as exc:  # noqa: BLE001 - the function's failure is the task's
            retryable = not isinstance(exc, NonRetryableError)
            error = {"message": str(exc) or type(exc).__name__, "type": type(exc).__name__}
            end = _End(ctx.task_id, ctx.attempt, {"error": error, "retryable": retryable})
        self._ends.append(end)
        assert self._ended is not None
        self._ended.set()

    async def _heartbeats(self, http: httpx.AsyncClient) -> None:
        """Heartbeat every task held once a third of its lease has passed."""
        while True:
            now = time.time()
            due = [
                (ctx, task) for ctx, task in list(self._running.values())
                if _seconds_left(ctx.lease_expires_at, now) < ctx.heartbeat_seconds * 2 / 3
            ]  # fmt: skip
            await asyncio.gather(*(self._beat(http, ctx) for ctx, _ in due), return_exceptions=True)
            await asyncio.sleep(0.5)

    async def _beat(self, http: httpx.AsyncClient, ctx: TaskContext) -> None:
        try:
            response = await http.post(
                f"/tasks/{ctx.task_id}/heartbeat", json={"attempt": ctx.attempt}
            )
        except httpx.HTTPError as exc:
            log.warning("task %s: heartbeat failed (%s)", ctx.task_id, exc)
            return
        if response.status_code == 409:
            ctx._cancelled = True
            return
        if response.status_code < 400:
            body = response.json()
            ctx.lease_expires_at = body.get("lease_expires_at", ctx.lease_expires_at)
            if body.get("cancel_requested"):
                ctx._cancelled = True
