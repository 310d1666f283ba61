"""``Worker``: runs a team's own functions as the ``task`` steps of their flows, in the team's
own processes, over the worker protocol (``POST /api/v1/tasks/claim``, ``heartbeat``,
``complete``, ``fail``; docs/workers.md).

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
            try:
                await self._claims(http)
                while self._running:  # drain: finish what is held
                    await asyncio.gather(
                        *(t for _, t in list(self._running.values())), return_exceptions=True
                    )
            finally:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats
                if handle_signals:
                    for sig in (signal.SIGTERM, signal.SIGINT):
                        loop.remove_signal_handler(sig)

    async def _claims(self, http: httpx.AsyncClient) -> None:
        assert self._stopping is not None
        room = asyncio.Semaphore(self.concurrency)
        failures = 0
        while not self._stopping.is_set():
            await room.acquire()
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
        """Up to ``free`` tasks; a long poll that a stop cuts short (a task claimed by a cut
        request is offered again when its lease ends)."""
        assert self._stopping is not None
        body = {"worker_id": self.worker_id, "tasks": self.tasks, "max": free,
                "wait_seconds": self._claim_wait}  # fmt: skip
        request = asyncio.ensure_future(http.post("/tasks/claim", json=body,
                                                  timeout=self._claim_wait + self._timeout))  # fmt: skip
        stopping = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({request, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not request.done():
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await request
            return []
        answer = check(request.result())
        return list(answer.get("tasks", []))

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
                await self._run_one(http, ctx, task.get("input"))
            finally:
                self._running.pop(ctx.task_id, None)
                room.release()

        self._running[ctx.task_id] = (ctx, asyncio.create_task(work(), name=ctx.task_id))

    async def _run_one(self, http: httpx.AsyncClient, ctx: TaskContext, value: Any) -> None:
        fn = self._functions.get(ctx.task)
        path = f"/tasks/{ctx.task_id}"
        try:
            if fn is None:
                raise NonRetryableError(f"this worker has no function for task {ctx.task!r}")
            if inspect.iscoroutinefunction(fn):
                output = await fn(value, ctx)
            else:
                output = await asyncio.to_thread(fn, value, ctx)
                if inspect.isawaitable(output):
                    output = await output
            report: dict[str, Any] = {"attempt": ctx.attempt, "output": output}
            call = f"{path}/complete"
        except Exception as exc:  # noqa: BLE001 - the function's failure is the task's
            retryable = not isinstance(exc, NonRetryableError)
            error = {"message": str(exc) or type(exc).__name__, "type": type(exc).__name__}
            report = {"attempt": ctx.attempt, "error": error, "retryable": retryable}
            call = f"{path}/fail"
        await self._report(http, call, report, ctx)

    async def _report(
        self, http: httpx.AsyncClient, call: str, body: dict[str, Any], ctx: TaskContext
    ) -> None:
        """Send a task's end, again after a network failure (the server answers a repeat
        the same); a 409 means the attempt no longer holds the task: nothing to do."""
        for attempt in range(6):
            try:
                response = await http.post(call, json=body)
            except httpx.HTTPError as exc:
                log.warning("task %s: reporting its end failed (%s)", ctx.task_id, exc)
                await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
                continue
            if response.status_code == 409:
                log.info("task %s attempt %d no longer holds the task", ctx.task_id, ctx.attempt)
            elif response.status_code >= 500:
                await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
                continue
            elif response.status_code >= 400:
                log.error("task %s: %s", ctx.task_id, response.text[:500])
            self.completed += 1
            return
        log.error("task %s: its end could not be reported; it will be offered again", ctx.task_id)

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
