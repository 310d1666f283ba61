"""Runs, their steps, and the run queue.

The queue is the ``runs`` table: a run is claimable while its status is queued or running and
``available_at`` has passed. A claim sets ``lease_owner`` and moves ``available_at`` to the end
of the lease, so a run whose worker dies becomes claimable again when its lease runs out,
and the claim query needs no separate lease test. Heartbeats push both forward. Claims take
runs in the order they fell due (``due_at``: queued, or woken from a delay or a backoff),
which neither moves, so a run whose worker died goes before the runs that fell due after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import and_, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store import events as events_store
from flowhook.store.models import Event, Mode, Run, RunStatus, RunStep, StepStatus, sources_of
from flowhook.store.tables import run_steps, runs

__all__ = [
    "NOTIFY_CHANNEL",
    "LeaseLost",
    "insert_run",
    "insert_runs",
    "find_by_idempotency_key",
    "release_idempotency_key",
    "get_run",
    "get_run_by_id",
    "list_runs",
    "claim_runs",
    "extend_leases",
    "save_progress",
    "Progress",
    "apply_progress",
    "cancel_unleased",
    "request_cancel",
    "next_due",
    "cancel_requested_among",
    "count_older_in_flight",
    "defer",
    "hand_back",
    "queue_depth",
]

NOTIFY_CHANNEL = "flowhook_runs"


class LeaseLost(Exception):
    """The guarded update matched nothing: the lease moved on, or a cancel was requested."""


_RUN_COLUMNS = [c for c in runs.c if c.name not in ("idempotency_key", "request_hash")]

_CLAIMABLE = text("runs.status IN ('queued', 'running')")
"""Written out, not bound: SQLite uses the partial index ix_runs_claimable only when a query
states its condition literally (with ``IN (?, ?)`` it scanned every run: a claim took 1.5 ms
at 8,000 runs and kept growing), and so do PostgreSQL's generic plans."""


def _run(row: Any) -> Run:
    return Run(
        run_id=row.run_id,
        workspace_id=row.workspace_id,
        mode=Mode(row.mode),
        flow_id=row.flow_id,
        flow_version=row.flow_version,
        trigger=row.trigger,
        status=RunStatus(row.status),
        payload=row.payload,
        queued_at=row.queued_at,
        output=row.output,
        error=row.error,
        steps_executed=row.steps_executed,
        next_step=row.next_step,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_ms=row.duration_ms,
        claims=row.claims,
        cancel_requested_at=row.cancel_requested_at,
    )


def _step(row: Any) -> RunStep:
    return RunStep(
        idx=row.idx,
        step_id=row.step_id,
        type=row.type,
        status=StepStatus(row.status),
        attempts=row.attempts,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_ms=row.duration_ms,
        output=row.output,
        error=row.error,
        interrupted=tuple(row.interrupted or ()),
    )


async def insert_run(
    conn: AsyncConnection,
    run: Run,
    *,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    payload: orjson.Fragment | None = None,
) -> None:
    """Write a queued run; it is its own queue entry. Wakes workers at commit. ``payload``:
    the run's payload already encoded (default: ``run.payload``, encoded here)."""
    await insert_runs(
        conn,
        [(run, idempotency_key, request_hash)],
        payloads=None if payload is None else [payload],
    )


async def insert_runs(
    conn: AsyncConnection,
    batch: Sequence[tuple[Run, str | None, str | None]],
    *,
    payloads: Sequence[orjson.Fragment] | None = None,
) -> None:
    """Write many queued runs in one statement: (run, idempotency key, request hash) each;
    ``payloads``, when given, are their payloads already encoded, in the same order (written
    as they are, not encoded a second time)."""
    if not batch:
        return
    if payloads is not None and len(payloads) != len(batch):
        raise ValueError("one encoded payload per run")
    await bulk.insert(
        conn,
        runs,
        [
            {
                "run_id": run.run_id,
                "workspace_id": run.workspace_id,
                "mode": str(run.mode),
                "flow_id": run.flow_id,
                "flow_version": run.flow_version,
                "trigger": run.trigger,
                "status": str(run.status),
                "payload": run.payload if payloads is None else payloads[i],
                "queued_at": run.queued_at,
                "available_at": run.queued_at,
                "due_at": run.queued_at,
                "idempotency_key": key,
                "request_hash": digest,
            }
            for i, (run, key, digest) in enumerate(batch)
        ],
    )
    conn.info.setdefault("wake", set()).add("runs")
    if conn.dialect.name == "postgresql":
        await conn.execute(text(f"NOTIFY {NOTIFY_CHANNEL}"))


async def find_by_idempotency_key(
    conn: AsyncConnection, workspace_id: str, mode: Mode, key: str
) -> tuple[Run, str] | None:
    q = select(*_RUN_COLUMNS, runs.c.request_hash).where(
        runs.c.workspace_id == workspace_id,
        runs.c.mode == str(mode),
        runs.c.idempotency_key == key,
    )
    row = (await conn.execute(q)).first()
    return (_run(row), row.request_hash) if row else None


async def release_idempotency_key(conn: AsyncConnection, run_id: str) -> None:
    """Forget an expired key so a new request may use it."""
    await conn.execute(
        update(runs).where(runs.c.run_id == run_id).values(idempotency_key=None, request_hash=None)
    )


async def _steps_of(conn: AsyncConnection, run_id: str) -> list[RunStep]:
    q = select(run_steps).where(run_steps.c.run_id == run_id).order_by(run_steps.c.idx)
    return [_step(r) for r in (await conn.execute(q)).all()]


async def get_run(conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str) -> Run | None:
    """The run with its steps, if the workspace and mode own it."""
    q = select(*_RUN_COLUMNS).where(
        runs.c.run_id == run_id,
        runs.c.workspace_id == workspace_id,
        runs.c.mode == str(mode),
    )
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    run = _run(row)
    run.steps = await _steps_of(conn, run_id)
    return run


async def get_run_by_id(conn: AsyncConnection, run_id: str) -> Run | None:
    """The run with its steps, whoever owns it (for the engine)."""
    row = (await conn.execute(select(*_RUN_COLUMNS).where(runs.c.run_id == run_id))).first()
    if row is None:
        return None
    run = _run(row)
    run.steps = await _steps_of(conn, run_id)
    return run


async def list_runs(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    *,
    limit: int,
    after: str | None = None,
    flow_id: str | None = None,
    status: RunStatus | None = None,
) -> list[Run]:
    """Newest first, without steps; ``after`` is the last run id of the page before."""
    q = (
        select(*_RUN_COLUMNS)
        .where(runs.c.workspace_id == workspace_id, runs.c.mode == str(mode))
        .order_by(runs.c.run_id.desc())
        .limit(limit)
    )
    if after is not None:
        q = q.where(runs.c.run_id < after)
    if flow_id is not None:
        q = q.where(runs.c.flow_id == flow_id)
    if status is not None:
        q = q.where(runs.c.status == str(status))
    return [_run(r) for r in (await conn.execute(q)).all()]


async def claim_runs(
    conn: AsyncConnection, *, owner: str, now: datetime, lease_until: datetime, limit: int
) -> list[Run]:
    """Claim up to ``limit`` due runs for ``owner`` under a lease ending at ``lease_until``.

    Runs are taken in the order they fell due (``due_at``), which claims and heartbeats do
    not move: a run whose worker died is taken in its place once its lease ends, instead of
    behind every run queued meanwhile (``available_at`` is the lease's end by then). The
    index on ``due_at`` is read in order; the runs under a live lease at its head are
    passed over (at most the runs held now).

    PostgreSQL skips rows other workers hold (``FOR UPDATE SKIP LOCKED``); SQLite has one
    writer, so the same statement inside its write transaction is enough.
    """
    due = (
        select(runs.c.run_id)
        .where(_CLAIMABLE, runs.c.due_at <= now, runs.c.available_at <= now)
        .order_by(runs.c.due_at)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    else:
        due = due.with_hint(runs, "INDEXED BY ix_runs_due_at", "sqlite")
    stmt = (
        update(runs)
        .where(runs.c.run_id.in_(due.scalar_subquery()))
        .values(
            lease_owner=owner,
            lease_expires_at=lease_until,
            available_at=lease_until,
            claims=runs.c.claims + 1,
        )
        .returning(*_RUN_COLUMNS)
    )
    claimed = [_run(r) for r in (await conn.execute(stmt)).all()]
    claimed.sort(key=lambda r: r.queued_at)
    return claimed


def _held(conn: AsyncConnection, owner: str, run_ids: Sequence[str]) -> Any:
    """Which of ``run_ids`` ``owner`` holds and has not ended, for a many-row UPDATE's WHERE.

    The lock order rule: a transaction that locks many ``runs`` rows locks them in
    ``run_id`` order (:func:`apply_progress` reads its rows ``ORDER BY run_id FOR UPDATE``).
    A plain ``UPDATE … WHERE run_id IN (…)`` locks rows in whatever order its plan visits
    them (a seq or bitmap scan: the heap's order), so a heartbeat met a group write on the
    same rows in the opposite order and PostgreSQL killed one of them (deadlock). On
    PostgreSQL the rows are therefore locked first, sorted, in the subquery; the UPDATE only
    touches rows it already holds. Same statement, no extra round trip. SQLite has one
    writer and takes the plain IN list.
    """
    ids = list(run_ids)
    if conn.dialect.name != "postgresql":
        return and_(runs.c.run_id.in_(ids), runs.c.lease_owner == owner, _CLAIMABLE)
    ordered = (
        select(runs.c.run_id)
        .where(runs.c.run_id.in_(ids), runs.c.lease_owner == owner, _CLAIMABLE)
        .order_by(runs.c.run_id)
        .with_for_update()
    )
    return runs.c.run_id.in_(ordered.scalar_subquery())


async def extend_leases(
    conn: AsyncConnection, *, owner: str, run_ids: Sequence[str], until: datetime
) -> int:
    """Heartbeat: push forward the leases ``owner`` still holds on ``run_ids`` (rows locked
    in ``run_id`` order, see :func:`_held`)."""
    if not run_ids:
        return 0
    result = await conn.execute(
        update(runs)
        .where(_held(conn, owner, run_ids))
        .values(lease_expires_at=until, available_at=until)
    )
    return int(result.rowcount)


async def _guarded_update(
    conn: AsyncConnection,
    run_id: str,
    *,
    owner: str,
    status: RunStatus,
    values: dict[str, Any],
    honour_cancel: bool,
) -> bool:
    guard = and_(
        runs.c.run_id == run_id, runs.c.lease_owner == owner, runs.c.status.in_(_sources(status))
    )
    if honour_cancel:
        guard = and_(guard, runs.c.cancel_requested_at.is_(None))
    if status.terminal:
        values = {**values, "lease_owner": None, "lease_expires_at": None}
    result = await conn.execute(update(runs).where(guard).values(status=str(status), **values))
    return bool(result.rowcount == 1)


async def _upsert_steps(conn: AsyncConnection, rows: Sequence[tuple[str, RunStep]]) -> None:
    await bulk.insert(
        conn,
        run_steps,
        [
            {
                "run_id": run_id,
                "idx": s.idx,
                "step_id": s.step_id,
                "type": s.type,
                "status": str(s.status),
                "attempts": s.attempts,
                "started_at": s.started_at,
                "finished_at": s.finished_at,
                "duration_ms": s.duration_ms,
                "output": s.output,
                "error": s.error,
                "interrupted": list(s.interrupted) or None,
            }
            for run_id, s in rows
        ],
        update_on_conflict=("run_id", "idx"),
    )


async def save_progress(
    conn: AsyncConnection,
    run_id: str,
    *,
    owner: str,
    status: RunStatus,
    values: dict[str, Any],
    steps: Sequence[RunStep] = (),
    honour_cancel: bool = True,
) -> None:
    """Move a leased run to ``status`` with ``values`` and record ``steps``; raises
    :class:`LeaseLost` (rolling back the transaction) when the guard fails."""
    if not await _guarded_update(
        conn, run_id, owner=owner, status=status, values=values, honour_cancel=honour_cancel
    ):
        raise LeaseLost(run_id)
    await _upsert_steps(conn, [(run_id, s) for s in steps])


@dataclass(frozen=True, slots=True)
class Progress:
    """One run's writes: status changes (status, values, whether a cancel request blocks
    them), step rows and events, applied together or not at all."""

    run_id: str
    changes: tuple[tuple[RunStatus, dict[str, Any], bool], ...]
    steps: Sequence[RunStep] = ()
    events: Sequence[Event] = ()


def _sources(status: RunStatus) -> list[str]:
    if status is RunStatus.RUNNING:  # starting (from queued) or recording progress
        return [str(RunStatus.QUEUED), str(RunStatus.RUNNING)]
    return sources_of(status)


async def apply_progress(
    conn: AsyncConnection, items: Sequence[Progress], *, owner: str
) -> list[bool]:
    """Apply many runs' writes in one transaction (group commit). An item whose guard fails
    (lease lost, cancel requested, a move its status does not allow) writes nothing and
    answers ``False``; the others go on.

    A fixed number of statements whatever the batch size: one read of the guarded columns of
    every run (locked on PostgreSQL, so the guards hold until commit; SQLite's write
    transaction already excludes every other writer), one UPDATE per shape of changes
    (executemany), and one statement each for the events, their deliveries and the steps.
    A run appears at most once in ``items``: the executor awaits each of its writes.
    """
    if not items:
        return []
    guarded = select(runs.c.run_id, runs.c.status, runs.c.cancel_requested_at).where(
        runs.c.run_id.in_([item.run_id for item in items]), runs.c.lease_owner == owner
    )
    if conn.dialect.name == "postgresql":
        guarded = guarded.order_by(runs.c.run_id).with_for_update()
    current = {r.run_id: (r.status, r.cancel_requested_at) for r in await conn.execute(guarded)}
    results: list[bool] = []
    updates: dict[tuple[str, ...], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    steps: list[tuple[str, RunStep]] = []
    events: list[Event] = []
    for item in items:
        state = current.get(item.run_id)
        values: dict[str, Any] = {}
        ok = state is not None
        if state is not None:
            status, cancel_requested = state
            for target, changed, honour_cancel in item.changes:
                if status not in _sources(target) or (
                    honour_cancel and cancel_requested is not None
                ):
                    ok = False
                    break
                values.update(changed)
                values["status"] = status = str(target)
                if target.terminal:
                    values["lease_owner"] = values["lease_expires_at"] = None
        results.append(ok)
        if not ok:
            continue
        if item.changes:
            updates.setdefault(tuple(sorted(values)), []).append((values, {"run_id": item.run_id}))
        steps.extend((item.run_id, s) for s in item.steps)
        events.extend(item.events)
    for rows in updates.values():
        await bulk.update(conn, runs, rows)
    await events_store.insert_events(conn, events)
    await _upsert_steps(conn, steps)
    return results


async def cancel_unleased(
    conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str, now: datetime
) -> bool:
    """Cancel a run no worker holds (queued, or sleeping in a delay or a retry backoff);
    ``False`` when a worker holds it or it has ended."""
    result = await conn.execute(
        update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.workspace_id == workspace_id,
            runs.c.mode == str(mode),
            runs.c.status.in_([str(RunStatus.QUEUED), str(RunStatus.RUNNING)]),
            runs.c.lease_owner.is_(None),
        )
        .values(status=str(RunStatus.CANCELLED), finished_at=now, cancel_requested_at=now)
    )
    return result.rowcount == 1


async def request_cancel(
    conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str, now: datetime
) -> bool:
    """Flag a run a worker holds; the worker ends it ``cancelled`` at its next write."""
    result = await conn.execute(
        update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.workspace_id == workspace_id,
            runs.c.mode == str(mode),
            runs.c.status.in_([str(RunStatus.QUEUED), str(RunStatus.RUNNING)]),
            runs.c.cancel_requested_at.is_(None),
        )
        .values(cancel_requested_at=now)
    )
    return result.rowcount == 1


async def next_due(conn: AsyncConnection) -> datetime | None:
    """When the next queued or sleeping run becomes claimable."""
    q = select(func.min(runs.c.available_at)).where(_CLAIMABLE)
    value = (await conn.execute(q)).scalar_one_or_none()
    if value is None:
        return None
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def cancel_requested_among(conn: AsyncConnection, run_ids: Sequence[str]) -> list[str]:
    """Which of ``run_ids`` someone asked to cancel."""
    if not run_ids:
        return []
    q = select(runs.c.run_id).where(
        runs.c.run_id.in_(list(run_ids)), runs.c.cancel_requested_at.is_not(None)
    )
    return list((await conn.execute(q)).scalars())


async def count_older_in_flight(conn: AsyncConnection, run: Run, now: datetime) -> int:
    """Runs of ``run``'s flow older than it that a worker holds now (for the flow's
    ``concurrency`` cap: the oldest runs go first, so the cap never starves them all)."""
    q = (
        select(func.count())
        .select_from(runs)
        .where(
            runs.c.flow_id == run.flow_id,
            runs.c.run_id < run.run_id,
            runs.c.status.in_([str(RunStatus.QUEUED), str(RunStatus.RUNNING)]),
            runs.c.lease_owner.is_not(None),
            runs.c.lease_expires_at > now,
        )
    )
    return int((await conn.execute(q)).scalar_one())


async def defer(conn: AsyncConnection, run_id: str, *, owner: str, until: datetime) -> None:
    """Hand a claimed run back untouched until ``until``; the claim does not count as lost."""
    result = await conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id, runs.c.lease_owner == owner)
        .values(
            available_at=until,
            due_at=until,
            lease_owner=None,
            lease_expires_at=None,
            claims=func.max(runs.c.claims - 1, 0)
            if conn.dialect.name == "sqlite"
            else func.greatest(runs.c.claims - 1, 0),
        )
    )
    if result.rowcount != 1:
        raise LeaseLost(run_id)


async def hand_back(
    conn: AsyncConnection,
    *,
    owner: str,
    run_ids: Sequence[str],
    now: datetime,
    count_claim: bool = False,
) -> int:
    """Give runs this process holds back at once, so another worker takes them without
    waiting for the lease to run out (rows locked in ``run_id`` order, see :func:`_held`).

    On shutdown the claim does not count as lost. With ``count_claim`` (a run released
    because its write failed) it does: a run whose writes keep failing ends ``worker_lost``
    after ``max_claims`` instead of going round for ever."""
    if not run_ids:
        return 0
    claims = runs.c.claims if count_claim else runs.c.claims - 1
    result = await conn.execute(
        update(runs)
        .where(_held(conn, owner, run_ids))
        .values(lease_owner=None, lease_expires_at=None, available_at=now, claims=claims)
    )
    return int(result.rowcount)


async def queue_depth(conn: AsyncConnection) -> tuple[int, datetime | None]:
    """How many runs are queued, and when the oldest of them was."""
    q = select(func.count(), func.min(runs.c.queued_at)).where(
        runs.c.status == str(RunStatus.QUEUED)
    )
    count, oldest = (await conn.execute(q)).one()
    if oldest is not None and oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    return int(count), oldest
