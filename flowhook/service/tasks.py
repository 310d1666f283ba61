"""The worker protocol: workers in the team's own code claim the tasks of ``task`` steps (a
long poll), heartbeat them, and complete or fail them (docs/workers.md)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from flowhook.clock import Clock
from flowhook.errors import Conflict, FlowhookError, InvalidInput
from flowhook.group_commit import GroupCommit
from flowhook.ids import is_id
from flowhook.service.auth import Principal
from flowhook.service.jsonvalues import encode_json
from flowhook.service.lookup import missing
from flowhook.store import tasks as tasks_store
from flowhook.store.db import Connection, Database
from flowhook.store.tasks import QueueDepth, Task, WorkerSeen
from flowhook.store.wakeup import Broadcast, PgListener, Wakeup

__all__ = [
    "TaskService",
    "End",
    "Ended",
    "Refused",
    "MAX_CLAIM",
    "MAX_WAIT",
    "TASK_NAME",
    "WORKERS_SEEN",
]

MAX_CLAIM = 100
MAX_WAIT = 60.0
TASK_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
WORKER_ID = re.compile(r"[\x21-\x7e]{1,200}")
"""A worker's id: 1–200 printable ASCII characters, no spaces."""
WORKERS_SEEN = timedelta(seconds=60)
"""``GET /workers`` lists the workers seen within this."""
_SEEN_EVERY = 5.0
"""A worker's ``last_seen_at`` is written at most this often (seconds) by each process."""
_RECHECK = 1.0
"""A waiting claim looks again at least this often: a task queued again after a retry's
backoff is ready by the clock, which wakes nobody."""


@dataclass(frozen=True, slots=True)
class Ended:
    """The answer to a complete or fail: the same again for the same call."""

    task_id: str
    status: str
    attempt: int

    def body(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "status": self.status, "attempt": self.attempt}


class TaskService:
    def __init__(self, db: Database, clock: Clock, runs: Wakeup, *, max_output_bytes: int) -> None:
        self._db = db
        self._clock = clock
        self._runs = runs
        ready = db.wakeups.get("tasks")
        self._ready = ready if isinstance(ready, Broadcast) else Broadcast()
        self._max_output = max_output_bytes
        self._seen: dict[tuple[str, str, str], float] = {}
        self._listener: PgListener | None = None
        self._ends: GroupCommit[_End, Ended] = GroupCommit(self._commit_ends)

    async def start(self) -> None:
        """Hear the tasks other processes queue (PostgreSQL's ``NOTIFY``; on SQLite the
        engine process beside this one tells it, :mod:`flowhook.peer`)."""
        dsn = self._db.listen_dsn
        if dsn is not None:
            self._listener = PgListener(dsn, {tasks_store.TASKS_CHANNEL: self._ready})
            await self._listener.start()

    async def stop(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None

    # -- claim ---------------------------------------------------------------------------

    async def claim(
        self,
        who: Principal,
        worker_id: str,
        names: list[str],
        limit: int,
        wait: float,
        *,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[Task]:
        """Up to ``limit`` tasks of ``names`` for ``worker_id``: as soon as one is ready
        (made ready by any process), else none once ``wait`` seconds have passed or the
        worker has ``gone`` (it hung up: what a claim took for it would wait for its lease
        to run out, so the poll stops claiming)."""
        _check_claim(worker_id, names, limit, wait)
        return await self._poll(who, worker_id, names, limit, wait, gone)

    async def _poll(
        self,
        who: Principal,
        worker_id: str,
        names: list[str],
        limit: int,
        wait: float,
        gone: Callable[[], Awaitable[bool]] | None,
        woken: asyncio.Event | None = None,
    ) -> list[Task]:
        """Claim until something is found or ``wait`` has passed; ``woken``: the caller has
        just looked (taking this waiter before it did), so the first look is a wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            if woken is None:
                woken = self._ready.waiter()  # before the look: a task queued after it wakes us
                found = await self._claim_once(who, worker_id, names, limit)
                if found:
                    return found
            left = deadline - loop.time()
            if left <= 0:
                return []
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(left, _RECHECK))
            woken = None
            if gone is not None and await gone():
                return []

    async def batch(
        self,
        who: Principal,
        worker_id: str,
        names: list[str],
        ends: Sequence[End],
        limit: int,
        wait: float,
        *,
        gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> tuple[list[Ended | Refused], list[Task]]:
        """End the attempts of ``ends`` and claim up to ``limit`` tasks, in one write: each
        end's answer (what ``complete`` or ``fail`` would have answered, or why it was
        refused, refusing nothing else), then the tasks claimed, waiting as ``claim`` does
        when none is ready (the ends are committed before the wait)."""
        _check_claim(worker_id, names, max(limit, 1), wait)
        if len(ends) > MAX_CLAIM:
            raise InvalidInput(f"ends may hold at most {MAX_CLAIM} items", field="ends")
        checked = [self._checked(who, end) for end in ends]
        found: list[Task] = []
        answers: list[Ended | Refused] = []
        woken: asyncio.Event | None = None
        if checked:
            woken = self._ready.waiter()  # before the write's look
            now = self._clock.now()
            seen = self._due_seen(who, worker_id) if limit else False

            async def write(conn: Connection) -> list[Ended | Refused]:
                nonlocal found
                writing = [end for end in checked if isinstance(end, _End)]
                ended = iter(await _end_all(conn, writing, now))
                done = [end if isinstance(end, Refused) else _answer(end, next(ended))
                        for end in checked]  # fmt: skip
                if limit:
                    found = await _claim_in(conn, who, worker_id, names, limit, now, seen=seen)
                return done

            answers = await self._db.retrying(write)
            self._runs.notify()
            answers = [
                _output_refused(end, answer) if isinstance(end, _BadOutput) else answer
                for end, answer in zip(checked, answers, strict=True)
            ]
        if limit and not found:
            found = await self._poll(who, worker_id, names, limit, wait, gone, woken)
        return answers, found

    def _checked(self, who: Principal, end: End) -> _End | Refused:
        """``end`` as it will be written, or refused before the write (an unknown id, a bad
        error); an output that cannot be stored fails the attempt, as ``complete`` does."""
        try:
            _check_id(end.task_id)
            if end.error is not None:
                _check_error(end.error)
                return _End(who, end.task_id, end.attempt, None, end.error, end.retryable)
        except FlowhookError as exc:
            return Refused(end.task_id, end.attempt, exc)
        problem = self._output_problem(end.output)
        if problem is not None:
            return _BadOutput(who, end.task_id, end.attempt, None,
                              {"type": "output", "message": problem}, True)  # fmt: skip
        return _End(who, end.task_id, end.attempt, end.output, None, False)

    async def _claim_once(
        self, who: Principal, worker_id: str, names: list[str], limit: int
    ) -> list[Task]:
        now = self._clock.now()
        seen = self._due_seen(who, worker_id)
        async with self._db.transaction() as conn:
            return await _claim_in(conn, who, worker_id, names, limit, now, seen=seen)

    def _due_seen(self, who: Principal, worker_id: str) -> bool:
        """Whether this process should write that ``worker_id`` was seen (at most every few
        seconds)."""
        key = (who.workspace_id, str(who.mode), worker_id)
        now = time.monotonic()
        if self._seen.get(key, 0.0) > now:
            return False
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen[key] = now + _SEEN_EVERY
        return True

    # -- heartbeat, complete, fail -------------------------------------------------------

    async def heartbeat(self, who: Principal, task_id: str, attempt: int) -> tuple[datetime, bool]:
        """Push the attempt's lease on: when it ends now, and whether the run was
        cancelled (the worker should stop)."""
        _check_id(task_id)
        now = self._clock.now()
        async with self._db.transaction() as conn:
            task = await tasks_store.get(conn, who.workspace_id, who.mode, task_id)
            if task is None:
                raise missing("task", task_id)
            if task.status != "running" or task.attempt != attempt:
                raise _no_longer(task_id, attempt, task)
            cancelled = await tasks_store.heartbeat(conn, task, now)
            if task.worker_id is not None and self._due_seen(who, task.worker_id):
                # a worker busy with long tasks claims nothing meanwhile: it is still seen
                await tasks_store.touch_worker(
                    conn, who.workspace_id, who.mode, task.worker_id, now
                )
        assert task.lease_expires_at is not None
        return task.lease_expires_at, cancelled

    async def complete(self, who: Principal, task_id: str, attempt: int, output: Any) -> Ended:
        """The attempt's output becomes the step's (the run wakes); the same call again gets
        the same answer. An output that cannot be stored fails the attempt, and the worker
        is told why."""
        return await self._end(self._checked(who, End(task_id, attempt, output)))

    async def fail(
        self, who: Principal, task_id: str, attempt: int, error: dict[str, Any], retryable: bool
    ) -> Ended:
        """The attempt failed; the step's ``retry`` decides whether another follows, unless
        ``retryable`` is false."""
        return await self._end(self._checked(who, End(task_id, attempt, None, error, retryable)))

    async def _end(self, end: _End | Refused) -> Ended:
        """End the attempt (in a write shared with the other ends arriving meanwhile)."""
        if isinstance(end, Refused):
            raise end.error
        ended = await self._ends.submit(end)
        self._runs.notify()
        if isinstance(end, _BadOutput):
            raise _output_refused(end, ended).error
        return ended

    async def _commit_ends(self, batch: Sequence[_End]) -> list[Ended | BaseException]:
        """Group commit: the ends that arrived while the last transaction ran, in one. An end
        that is refused (another attempt holds its task, its run ended) writes nothing and
        gets its error; the others are committed."""
        now = self._clock.now()

        async def write(conn: Connection) -> list[Ended | BaseException]:
            return list(await _end_all(conn, batch, now))

        return await self._db.retrying(write)

    def _output_problem(self, output: Any) -> str | None:
        try:
            encoded = encode_json(output, "output")
        except InvalidInput as exc:
            return str(exc)
        size = len(orjson.dumps(encoded))
        if size > self._max_output:
            return (
                f"output is {size} bytes, more than {self._max_output} "
                "(FLOWHOOK_MAX_STEP_OUTPUT_BYTES)"
            )
        return None

    # -- reads ---------------------------------------------------------------------------

    async def workers(self, who: Principal) -> list[WorkerSeen]:
        since = self._clock.now() - WORKERS_SEEN
        async with self._db.read() as conn:
            return await tasks_store.workers_seen(conn, who.workspace_id, who.mode, since)

    async def of_run(self, who: Principal, run_id: str) -> list[Task]:
        """The tasks of a run of the caller's (its branches' and items' too)."""
        async with self._db.read() as conn:
            return await tasks_store.of_run(conn, who.workspace_id, who.mode, run_id)

    async def queues(self, who: Principal) -> list[QueueDepth]:
        async with self._db.read() as conn:
            return await tasks_store.queues(conn, who.workspace_id, who.mode)


@dataclass(frozen=True, slots=True)
class End:
    """One attempt's end in a batch: its ``output``, or its ``error`` (``retryable``)."""

    task_id: str
    attempt: int
    output: Any = None
    error: dict[str, Any] | None = None
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class Refused:
    """An end of a batch that was not recorded, and why: the error the single call
    (``complete``, ``fail``) would have raised."""

    task_id: str
    attempt: int
    error: FlowhookError


@dataclass(frozen=True, slots=True)
class _End:
    who: Principal
    task_id: str
    attempt: int
    output: Any
    error: dict[str, Any] | None
    retryable: bool


async def _claim_in(
    conn: Connection,
    who: Principal,
    worker_id: str,
    names: list[str],
    limit: int,
    now: datetime,
    *,
    seen: bool,
) -> list[Task]:
    """Claim in ``conn``'s transaction; ``seen``: write that the worker was seen too."""
    found = await tasks_store.claim(conn, who.workspace_id, who.mode, names, worker_id, limit, now)
    if seen:
        await tasks_store.worker_seen(conn, who.workspace_id, who.mode, worker_id, names, now)
    return found


class _BadOutput(_End):
    """A completion whose output cannot be stored: the attempt fails (type ``output``) and
    the worker is told why (400)."""


def _answer(end: _End, answer: Ended | FlowhookError) -> Ended | Refused:
    if isinstance(answer, FlowhookError):
        return Refused(end.task_id, end.attempt, answer)
    return answer


def _output_refused(end: _End, answer: Ended | Refused) -> Refused:
    if isinstance(answer, Refused):
        return answer
    assert end.error is not None
    return Refused(end.task_id, end.attempt, InvalidInput(end.error["message"], field="output"))


async def _end_all(
    conn: Connection, ends: Sequence[_End], now: datetime
) -> list[Ended | FlowhookError]:
    """End the attempts of ``ends`` in a few statements whatever their number: each its
    answer, or the error of one that is refused (another attempt holds its task, its run
    ended), which writes nothing and refuses nothing else."""
    held = await tasks_store.ending(conn, [end.task_id for end in ends])
    finished: dict[str, Task] = {}
    answers = [_decide(end, held, finished) for end in ends]
    await tasks_store.finish_all(conn, list(finished.values()), now)
    return answers


def _decide(
    end: _End, held: dict[str, tuple[Task, bool]], finished: dict[str, Task]
) -> Ended | FlowhookError:
    """What ``end`` does to its task (read in ``held``): the task as it will be written is
    put in ``finished`` (and changed in ``held``, so a second end of it in the same batch
    is answered as a repeat would be)."""
    status = "failed" if end.error is not None else "completed"
    found = held.get(end.task_id)
    if found is None or (found[0].workspace_id, found[0].mode) != (
        end.who.workspace_id,
        end.who.mode,
    ):
        return missing("task", end.task_id)
    task, going = found
    if task.attempt == end.attempt and _same_end(task, status, end.output, end.error):
        return Ended(end.task_id, status, end.attempt)  # the same call again
    if task.status != "running" or task.attempt != end.attempt:
        return _no_longer(end.task_id, end.attempt, task)
    if not going:
        return Conflict(
            f"the run of task {end.task_id!r} was cancelled or has ended; "
            "the attempt's result is not recorded"
        )
    task.status, task.output, task.error = status, end.output, end.error
    task.retryable = end.retryable
    finished[task.task_id] = task
    return Ended(end.task_id, status, end.attempt)


def _same_end(task: Task, status: str, output: Any, error: dict[str, Any] | None) -> bool:
    """Whether the task already ended as this call would end it (a retried call)."""
    if status == "completed":
        return task.status == "completed" and task.output == output
    return task.status == "failed" and task.error == error


def _no_longer(task_id: str, attempt: int, task: Task) -> Conflict:
    if task.attempt == attempt and task.status in ("completed", "failed"):
        why = f"it {task.status} already, with another result"
    else:
        why = f"it is {task.status}, at attempt {task.attempt}"
    return Conflict(f"attempt {attempt} no longer holds task {task_id!r}: {why}")


def _check_id(task_id: str) -> None:
    if not is_id(task_id, "tsk"):
        raise missing("task", task_id)


def _check_claim(worker_id: str, names: list[str], limit: int, wait: float) -> None:
    if not WORKER_ID.fullmatch(worker_id):
        raise InvalidInput(
            "worker_id must be 1 to 200 printable characters, without spaces", field="worker_id"
        )
    if not names or len(names) > 100:
        raise InvalidInput("tasks must name 1 to 100 task names", field="tasks")
    for name in names:
        if not TASK_NAME.fullmatch(name):
            raise InvalidInput(
                f"tasks holds {name!r}, which is not a task name (1 to 200 of A-Z a-z 0-9 _ . : -)",
                field="tasks",
            )
    if not 1 <= limit <= MAX_CLAIM:
        raise InvalidInput(f"max must be from 1 to {MAX_CLAIM}", field="max")
    if not 0 <= wait <= MAX_WAIT:
        raise InvalidInput(f"wait_seconds must be from 0 to {MAX_WAIT:g}", field="wait_seconds")


def _check_error(error: dict[str, Any]) -> None:
    message = error.get("message")
    if not isinstance(message, str) or not message:
        raise InvalidInput("error.message must be a non-empty string", field="error.message")
    if len(message) > 4000:
        raise InvalidInput("error.message must be at most 4000 characters", field="error.message")
    kind = error.get("type")
    if kind is not None and (not isinstance(kind, str) or not 1 <= len(kind) <= 200):
        raise InvalidInput("error.type must be 1 to 200 characters", field="error.type")
    extra = set(error) - {"message", "type"}
    if extra:
        raise InvalidInput(f"error has unknown fields: {', '.join(sorted(extra))}", field="error")
