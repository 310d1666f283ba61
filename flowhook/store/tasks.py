"""Tasks: the work of ``task`` steps, done by workers in the team's own code.

A ``task`` step queues one row (``queued``) in the write that puts its run to sleep. A
worker's claim takes it (``running``: its attempt number moves on, it is held by the worker
until ``lease_expires_at``, which each heartbeat pushes on by ``heartbeat_seconds``), and
the worker completes it (``completed``, its output) or fails it (``failed``, its error);
either wakes the run, whose step decides (flowhook.engine.steps.task): the output, a retry
(``queued`` again after the step's backoff, as the next attempt), or the step's failure. A
lease that runs out puts the task back in reach of every claim: it is taken again as the next
attempt, the one cut short listed in ``interrupted``. Each move is guarded by the status
and the attempt in the statement, so an attempt that no longer holds its task changes
nothing. A task of a run that ended (cancelled, timed out) is never offered again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Integer, and_, bindparam, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.driver import driver_of
from flowhook.store.guards import ACTIVE_RUN
from flowhook.store.models import Mode
from flowhook.store.runs import NOTIFY_CHANNEL as RUNS_CHANNEL
from flowhook.store.tables import runs, tasks, workers
from flowhook.store.wakeup import wake_at_commit

__all__ = [
    "Task",
    "TASKS_CHANNEL",
    "QueueDepth",
    "WorkerSeen",
    "insert",
    "claim",
    "heartbeat",
    "get",
    "ending",
    "finish_all",
    "for_step",
    "retry",
    "time_out",
    "worker_seen",
    "touch_worker",
    "workers_seen",
    "queues",
    "why_waiting",
    "of_run",
]

TASKS_CHANNEL = "flowhook_tasks"
"""PostgreSQL's channel for a task made ready: the claims waiting in any process wake."""

QUEUED, RUNNING, COMPLETED, FAILED = "queued", "running", "completed", "failed"


@dataclass(slots=True)
class Task:
    task_id: str
    workspace_id: str
    mode: Mode
    task: str
    run_id: str
    idx: int
    root_run_id: str
    flow_id: str
    step_id: str
    input: Any
    status: str
    attempt: int
    available_at: datetime
    heartbeat_seconds: float
    created_at: datetime
    interrupted: list[int] = field(default_factory=list)
    worker_id: str | None = None
    lease_expires_at: datetime | None = None
    attempt_deadline: datetime | None = None
    timeout_seconds: float | None = None
    retryable: bool = False
    output: Any = None
    error: dict[str, Any] | None = None
    traceparent: str | None = None
    claimed_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Task:
        return cls.from_values(dict(row._mapping))

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> Task:
        values["mode"] = Mode(values["mode"])
        values["interrupted"] = values.get("interrupted") or []
        return cls(**values)


async def insert(conn: AsyncConnection, task: Task) -> None:
    """Queue ``task`` (in the write that puts its run to sleep); claims wake at commit."""
    row = {c.name: getattr(task, c.name) for c in tasks.c}
    row["mode"] = str(task.mode)
    row["interrupted"] = task.interrupted or None
    row["heartbeat_seconds"] = float(task.heartbeat_seconds)
    if task.timeout_seconds is not None:
        row["timeout_seconds"] = float(task.timeout_seconds)
    await bulk.insert(conn, tasks, [row])  # a statement built once, not per task
    await wake_at_commit(conn, "tasks", TASKS_CHANNEL)


async def claim(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    names: Sequence[str],
    worker_id: str,
    limit: int,
    now: datetime,
) -> list[Task]:
    """Up to ``limit`` tasks of ``names`` for ``worker_id``: first those whose lease ran out
    (taken again as the next attempt, the one cut short listed as interrupted), then the
    ready ones, oldest first. Only tasks of runs still going are offered."""
    params = {"workspace_id": workspace_id, "mode": str(mode), "names": list(names), "now": now}
    lapsed = _claimable(RUNNING, driver_of(conn).one_writer)
    found = [Task.from_row(r) for r in (await conn.execute(lapsed, {**params, "n": limit})).all()]
    if len(found) < limit:
        ready = _claimable(QUEUED, driver_of(conn).one_writer)
        rows = (await conn.execute(ready, {**params, "n": limit - len(found)})).all()
        found += [Task.from_row(r) for r in rows]
    if not found:
        return []
    moves: list[dict[str, Any]] = []
    deadlines: list[dict[str, Any]] = []
    for task in found:
        if task.status == RUNNING:  # its worker stopped heartbeating
            task.interrupted = [*task.interrupted, task.attempt]
        task.status, task.attempt, task.worker_id = RUNNING, task.attempt + 1, worker_id
        task.claimed_at = now
        task.lease_expires_at = now + timedelta(seconds=task.heartbeat_seconds)
        task.attempt_deadline = (
            None if task.timeout_seconds is None else now + timedelta(seconds=task.timeout_seconds)
        )
        moves.append({
            "b_id": task.task_id, "b_attempt": task.attempt, "b_worker": worker_id,
            "b_lease": task.lease_expires_at, "b_deadline": task.attempt_deadline,
            "b_interrupted": task.interrupted or None, "b_now": now,
        })  # fmt: skip
        if task.attempt_deadline is not None:
            deadlines.append({"b_run": task.run_id, "b_at": task.attempt_deadline})
    await conn.execute(_CLAIMED, moves)
    if deadlines:  # the run wakes when the attempt's time is up, to end it
        await conn.execute(_WAKE_AT, deadlines)
    return found


_b = bindparam


@cache
def _claimable(status: str, one_writer: bool) -> Any:
    """A claim's tasks of the names bound, ``running`` ones whose lease ran out or ``queued``
    ones due, oldest first, at most ``n``; of runs still going (a subquery, not a join: the
    claim locks tasks only, never their runs, and skips those another claim holds where more
    than one writes). Built once per kind, its values bound."""
    going = (
        select(runs.c.run_id)
        .where(
            runs.c.run_id == tasks.c.run_id, text(ACTIVE_RUN), runs.c.cancel_requested_at.is_(None)
        )
        .exists()
    )
    now = _b("now", type_=tasks.c.available_at.type)
    due = tasks.c.lease_expires_at if status == RUNNING else tasks.c.available_at
    q = (
        select(tasks)
        .where(
            tasks.c.workspace_id == _b("workspace_id", type_=tasks.c.workspace_id.type),
            tasks.c.mode == _b("mode", type_=tasks.c.mode.type),
            tasks.c.task.in_(_b("names", expanding=True, type_=tasks.c.task.type)),
            going,
            tasks.c.status == status,
            due <= now,
        )
        .order_by(due)
        .limit(_b("n", type_=Integer))
    )
    return q if one_writer else q.with_for_update(skip_locked=True)


_CLAIMED = (
    update(tasks)
    .where(tasks.c.task_id == _b("b_id"))
    .values(
        status=RUNNING,
        attempt=_b("b_attempt"),
        worker_id=_b("b_worker"),
        lease_expires_at=_b("b_lease"),
        attempt_deadline=_b("b_deadline"),
        interrupted=_b("b_interrupted"),
        claimed_at=_b("b_now"),
    )
)
_WAKE_AT = (
    update(runs)
    .where(
        runs.c.run_id == _b("b_run"),
        text(ACTIVE_RUN),
        runs.c.lease_owner.is_(None),
        runs.c.available_at > _b("b_at"),
    )
    .values(available_at=_b("b_at"), due_at=_b("b_at"))
)


async def _locked(
    conn: AsyncConnection, workspace_id: str, mode: Mode, task_id: str
) -> Task | None:
    """The workspace's task ``task_id``, locked on PostgreSQL (SQLite has one writer)."""
    q = select(tasks).where(
        tasks.c.task_id == task_id,
        tasks.c.workspace_id == workspace_id,
        tasks.c.mode == str(mode),
    )
    row = (await conn.execute(driver_of(conn).locking(q))).first()
    return None if row is None else Task.from_row(row)


async def _run_going(conn: AsyncConnection, run_id: str) -> bool:
    q = select(runs.c.run_id).where(
        runs.c.run_id == run_id, text(ACTIVE_RUN), runs.c.cancel_requested_at.is_(None)
    )
    return (await conn.execute(q)).first() is not None


async def heartbeat(conn: AsyncConnection, task: Task, now: datetime) -> bool:
    """Push on the lease of the attempt holding ``task`` (read with :func:`get`); whether its
    run was cancelled meanwhile (or has ended)."""
    task.lease_expires_at = now + timedelta(seconds=task.heartbeat_seconds)
    await conn.execute(
        update(tasks)
        .where(
            tasks.c.task_id == task.task_id,
            tasks.c.status == RUNNING,
            tasks.c.attempt == task.attempt,
        )
        .values(lease_expires_at=task.lease_expires_at)
    )
    return not await _run_going(conn, task.run_id)


async def get(conn: AsyncConnection, workspace_id: str, mode: Mode, task_id: str) -> Task | None:
    """The workspace's task ``task_id`` (locked on PostgreSQL: its attempt is ending)."""
    return await _locked(conn, workspace_id, mode, task_id)


async def ending(conn: AsyncConnection, task_ids: Sequence[str]) -> dict[str, tuple[Task, bool]]:
    """The tasks of ``task_ids`` whose attempts are ending (locked on PostgreSQL, in id
    order), each with whether its run is still going: one read for a batch of ends."""
    found: dict[str, tuple[Task, bool]] = {}
    if not task_ids:
        return found
    driver = driver_of(conn)
    q = _ending(driver.one_writer)
    rows = (await conn.execute(q, {"ids": sorted(set(task_ids))})).all()
    for row in rows:
        values = dict(row._mapping)
        going = bool(values.pop("going"))
        task = Task.from_values(values)
        found[task.task_id] = (task, going)
    return found


@cache
def _ending(one_writer: bool) -> Any:
    going = (
        select(runs.c.run_id)
        .where(
            runs.c.run_id == tasks.c.run_id, text(ACTIVE_RUN), runs.c.cancel_requested_at.is_(None)
        )
        .exists()
        .label("going")
    )
    q = (
        select(tasks, going)
        .where(tasks.c.task_id.in_(_b("ids", expanding=True, type_=tasks.c.task_id.type)))
        .order_by(tasks.c.task_id)
    )
    return q if one_writer else q.with_for_update(of=tasks)


async def finish_all(conn: AsyncConnection, ended: Sequence[Task], now: datetime) -> None:
    """Record the ends of ``ended`` (read with :func:`ending`, each still held by its
    attempt, its run going, its ``status``, ``output``, ``error`` and ``retryable`` set to
    the end) in two statements whatever their number, and wake their runs."""
    if not ended:
        return
    await conn.execute(
        _FINISHED,
        [
            {"b_id": t.task_id, "b_attempt": t.attempt, "b_status": t.status,
             "b_output": t.output, "b_error": t.error, "b_retryable": t.retryable,
             "b_now": now}
            for t in ended
        ],
    )  # fmt: skip
    woken = sorted({t.run_id for t in ended})
    await conn.execute(_WAKE_NOW, [{"b_run": run_id, "b_now": now} for run_id in woken])
    await wake_at_commit(conn, "runs", RUNS_CHANNEL)


_FINISHED = (
    update(tasks)
    .where(
        tasks.c.task_id == _b("b_id"),
        tasks.c.status == RUNNING,
        tasks.c.attempt == _b("b_attempt"),
    )
    .values(
        status=_b("b_status"),
        output=_b("b_output", type_=tasks.c.output.type),
        error=_b("b_error", type_=tasks.c.error.type),
        retryable=_b("b_retryable"),
        finished_at=_b("b_now"),
        lease_expires_at=None,
    )
)
_WAKE_NOW = (
    update(runs)
    .where(runs.c.run_id == _b("b_run"), text(ACTIVE_RUN), runs.c.lease_owner.is_(None))
    .values(available_at=_b("b_now"), due_at=_b("b_now"))
)


async def for_step(
    conn: AsyncConnection, run_id: str, idx: int, *, lock: bool = True
) -> Task | None:
    """The task of step ``idx`` of run row ``run_id``; ``lock``: locked where another writer
    could move it meanwhile (the engine decides what becomes of it)."""
    q = select(tasks).where(tasks.c.run_id == run_id, tasks.c.idx == idx)
    row = (await conn.execute(driver_of(conn).locking(q) if lock else q)).first()
    return None if row is None else Task.from_row(row)


async def time_out(conn: AsyncConnection, task: Task, now: datetime, message: str) -> bool:
    """Fail the running attempt whose time is up (type ``timeout``, retryable)."""
    error = {"type": "timeout", "message": message}
    done = await conn.execute(
        update(tasks)
        .where(
            tasks.c.task_id == task.task_id,
            tasks.c.status == RUNNING,
            tasks.c.attempt == task.attempt,
        )
        .values(status=FAILED, error=error, retryable=True, finished_at=now, lease_expires_at=None)
    )
    if done.rowcount == 1:
        task.status, task.error, task.retryable, task.finished_at = FAILED, error, True, now
    return bool(done.rowcount == 1)


async def retry(conn: AsyncConnection, task: Task, at: datetime) -> None:
    """Queue a failed task again, claimable from ``at`` (its next claim is the next attempt)."""
    await conn.execute(
        update(tasks)
        .where(tasks.c.task_id == task.task_id, tasks.c.status == FAILED)
        .values(
            status=QUEUED,
            available_at=at,
            worker_id=None,
            attempt_deadline=None,
            finished_at=None,
        )
    )
    await wake_at_commit(conn, "tasks", TASKS_CHANNEL)


# -- who works, and what waits ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSeen:
    worker_id: str
    tasks: list[str]
    last_seen_at: datetime
    in_flight: int


@dataclass(frozen=True, slots=True)
class QueueDepth:
    task: str
    waiting: int
    oldest_at: datetime | None
    running: int


async def worker_seen(
    conn: AsyncConnection, workspace_id: str, mode: Mode, worker_id: str, names: Sequence[str],
    now: datetime,
) -> None:  # fmt: skip
    """Remember that ``worker_id`` claimed tasks of ``names`` at ``now``."""
    stmt = driver_of(conn).upsert(workers).values(
        worker_id=worker_id, workspace_id=workspace_id, mode=str(mode), tasks=sorted(names),
        last_seen_at=now,
    )  # fmt: skip
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["worker_id", "workspace_id", "mode"],
            set_={"tasks": stmt.excluded.tasks, "last_seen_at": stmt.excluded.last_seen_at},
        )
    )


async def touch_worker(
    conn: AsyncConnection, workspace_id: str, mode: Mode, worker_id: str, now: datetime
) -> None:
    """``worker_id`` is still at work (it heartbeated)."""
    await conn.execute(
        update(workers)
        .where(
            workers.c.worker_id == worker_id,
            workers.c.workspace_id == workspace_id,
            workers.c.mode == str(mode),
        )
        .values(last_seen_at=now)
    )


async def workers_seen(
    conn: AsyncConnection, workspace_id: str, mode: Mode, since: datetime
) -> list[WorkerSeen]:
    """The workers that claimed since ``since``, with the tasks each holds now."""
    held = (
        select(tasks.c.worker_id, func.count().label("n"))
        .where(
            tasks.c.workspace_id == workspace_id,
            tasks.c.mode == str(mode),
            tasks.c.status == RUNNING,
        )
        .group_by(tasks.c.worker_id)
        .subquery()
    )
    q = (
        select(workers.c.worker_id, workers.c.tasks, workers.c.last_seen_at, held.c.n)
        .outerjoin(held, held.c.worker_id == workers.c.worker_id)
        .where(
            workers.c.workspace_id == workspace_id,
            workers.c.mode == str(mode),
            workers.c.last_seen_at >= since,
        )
        .order_by(workers.c.last_seen_at.desc())
    )
    return [
        WorkerSeen(r.worker_id, list(r.tasks), r.last_seen_at, int(r.n or 0))
        for r in (await conn.execute(q)).all()
    ]


async def queues(conn: AsyncConnection, workspace_id: str, mode: Mode) -> list[QueueDepth]:
    """Each task name's tasks waiting (of runs still going) and running, and the oldest
    waiting one's time."""
    going = and_(runs.c.run_id == tasks.c.run_id, text(ACTIVE_RUN))
    q = (
        select(
            tasks.c.task,
            func.count().filter(tasks.c.status == QUEUED).label("waiting"),
            func.min(tasks.c.available_at).filter(tasks.c.status == QUEUED).label("oldest"),
            func.count().filter(tasks.c.status == RUNNING).label("running"),
        )
        .join(runs, going)
        .where(
            tasks.c.workspace_id == workspace_id,
            tasks.c.mode == str(mode),
            tasks.c.status.in_((QUEUED, RUNNING)),
        )
        .group_by(tasks.c.task)
        .order_by(tasks.c.task)
    )
    return [
        QueueDepth(r.task, int(r.waiting), r.oldest, int(r.running))
        for r in (await conn.execute(q)).all()
    ]


async def why_waiting(
    conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str, idx: int, since: datetime
) -> dict[str, Any] | None:
    """Why run ``run_id`` sleeps in its ``task`` step ``idx``: the worker holding the task, or
    that no worker serving its name was seen since ``since``; ``None`` when it has no task."""
    row = (
        await conn.execute(select(tasks).where(tasks.c.run_id == run_id, tasks.c.idx == idx))
    ).first()
    if row is None:
        return None
    task = Task.from_row(row)
    why: dict[str, Any] = {"reason": "task", "task": task.task, "task_id": task.task_id}
    if task.status == RUNNING:
        return {**why, "attempt": task.attempt, "worker_id": task.worker_id}
    seen = await workers_seen(conn, workspace_id, mode, since)
    serving = any(task.task in w.tasks for w in seen)
    return {**why, "worker_id": None, "no_worker": not serving, "until": task.available_at}


async def of_run(conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str) -> list[Task]:
    """The tasks of run ``run_id`` and of its branches and items, oldest first."""
    q = (
        select(tasks)
        .where(
            tasks.c.root_run_id == run_id,
            tasks.c.workspace_id == workspace_id,
            tasks.c.mode == str(mode),
        )
        .order_by(tasks.c.created_at)
    )
    return [Task.from_row(r) for r in (await conn.execute(q)).all()]
