"""Flow control in the store: concurrency slots per key, throttle reservations, debounced
runs, and runs held back until their turn.

**Concurrency.** A run of a flow with ``concurrency`` takes a *slot* of its key when a
worker admits it (``concurrency_slot`` is set in the write that starts it) and holds it
until it ends, through any wait, delay or sub-flow: "one sync per customer at a time" means
the second does not start while the first is ``running``. A run that finds every slot taken
is *held*: ``held = 'concurrency'``, due never (:data:`~flowhook.store.types.HELD`), no
lease, no worker, in no index a claim reads. A run that ends gives its slot to the oldest
held run of its key (the highest priority first) in the same write, and that run becomes due
at once, already holding the slot. Admission and the end are serialised per flow and key (a
transaction-level advisory lock where the backend needs one, taken before any ``runs`` row),
so a held run is never left behind a free slot: either the admission sees the end, or the
end sees the held run. Counting slots reads ``ix_runs_slots``, giving them away
``ix_runs_held``: a busy key costs its own rows, never a scan of the queue, and never delays
another key or flow.

**Throttle.** An admitted run reserves its start: at once while fewer than ``limit`` starts
were reserved for its key within a period, else one period after the ``limit``-th latest
(:func:`~flowhook.definition.control.throttle_start`). A run whose start is later sleeps
until then (``held = 'throttle'``), woken once by its due time: no polling. Woken, it
starts only if fewer than ``limit`` runs of its key really started within the last period
(a started run's ``throttle_at`` is its start): a run that started late never lets the next
window hold more than ``limit`` starts; a run it crowds reserves the next free start.

**Debounce.** An execute of a debounced flow joins the run of its key that has not been
claimed yet (same ``run_id``; the run takes its payload and starts ``period_seconds`` later,
no later than ``max_wait_seconds`` after the first), or queues a new one. The join is one
guarded UPDATE: once a worker claimed the run, the next execute starts another.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.driver import driver_of
from flowhook.store.guards import ACTIVE_RUN, held_is
from flowhook.store.models import Held, Run, RunStatus
from flowhook.store.runs import NOTIFY_CHANNEL, RUN_COLUMNS
from flowhook.store.tables import runs
from flowhook.store.types import HELD
from flowhook.store.wakeup import wake_at_commit

__all__ = [
    "CONCURRENCY",
    "THROTTLE",
    "DEBOUNCE",
    "lock",
    "lock_key",
    "slots_taken",
    "slot_holders",
    "hold",
    "give_slots",
    "free_slot",
    "free_slots",
    "reserved_starts",
    "joinable",
    "join",
    "held_counts",
    "active_counts",
]

CONCURRENCY = Held.CONCURRENCY
THROTTLE = Held.THROTTLE
DEBOUNCE = Held.DEBOUNCE
_ACTIVE = text(ACTIVE_RUN)


def lock_key(kind: str, flow_id: str, key: str) -> str:
    """The key :func:`lock` locks, to sort by among a group write's locks."""
    return f"control:{kind}:{flow_id}:{key}"


async def lock(conn: AsyncConnection, kind: str, flow_id: str, key: str) -> None:
    """Serialise the admissions and ends of one flow and key (in the write transaction that
    does either; before any ``runs`` row is locked)."""
    await driver_of(conn).lock(conn, f"flowhook.{lock_key(kind, flow_id, key)}")


async def _notify(conn: AsyncConnection) -> None:
    await wake_at_commit(conn, "runs", NOTIFY_CHANNEL)


async def slots_taken(conn: AsyncConnection, flow_id: str, key: str) -> tuple[int, bool]:
    """How many runs of the flow hold a slot of ``key``, and whether any run waits for one
    (one statement, two index probes). Call after :func:`lock`."""
    taken = (
        select(func.count())
        .select_from(runs)
        .where(
            runs.c.flow_id == flow_id,
            runs.c.concurrency_slot == key,
            text("runs.concurrency_slot IS NOT NULL"),
        )
        .scalar_subquery()
    )
    waiting = (
        select(runs.c.run_id)
        .where(
            runs.c.flow_id == flow_id,
            runs.c.concurrency_key == key,
            text(held_is(Held.CONCURRENCY, "runs")),
            runs.c.status == str(RunStatus.QUEUED),
        )
        .exists()
    )
    row = (await conn.execute(select(taken, waiting))).one()
    return int(row[0]), bool(row[1])


async def slot_holders(conn: AsyncConnection, flow_id: str, key: str, limit: int = 20) -> list[str]:
    """The runs of the flow holding a slot of ``key`` (at most ``limit``, oldest first):
    what a held run waits on."""
    q = (
        select(runs.c.run_id)
        .where(
            runs.c.flow_id == flow_id,
            runs.c.concurrency_slot == key,
            text("runs.concurrency_slot IS NOT NULL"),
        )
        .order_by(runs.c.run_id)
        .limit(limit)
    )
    return [str(r) for r in (await conn.execute(q)).scalars()]


async def hold(
    conn: AsyncConnection,
    run_id: str,
    *,
    owner: str,
    reason: str,
    until: datetime | None = None,
    values: dict[str, Any] | None = None,
) -> bool:
    """Hand a claimed run back held for ``reason``: until a slot is given to it (``until``
    ``None``) or until ``until`` (a throttle's reserved start). The claim does not count as
    lost. ``False`` when ``owner`` no longer holds it."""
    due = HELD if until is None else until
    claims = driver_of(conn).greatest(runs.c.claims - 1, 0)
    result = await conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id, runs.c.lease_owner == owner, _ACTIVE)
        .values(
            held=reason,
            available_at=due,
            due_at=due,
            lease_owner=None,
            lease_expires_at=None,
            claims=claims,
            **(values or {}),
        )
    )
    if until is not None:
        await _notify(conn)  # the next due time moved: sleeping schedulers look again
    return result.rowcount == 1


async def give_slots(
    conn: AsyncConnection, flow_id: str, key: str, count: int, now: datetime
) -> int:
    """Give up to ``count`` free slots of ``key`` to its held runs, highest priority and then
    oldest first; they become due at once. Call after :func:`lock`."""
    if count <= 0:
        return 0
    oldest = (
        select(runs.c.run_id)
        .where(
            runs.c.flow_id == flow_id,
            runs.c.concurrency_key == key,
            text(held_is(Held.CONCURRENCY, "runs")),
            runs.c.status == str(RunStatus.QUEUED),
        )
        .order_by(runs.c.priority.desc(), runs.c.run_id)
        .limit(count)
    )
    # read first, then write by id: an ``IN (SELECT … LIMIT n)`` may be planned as a join
    # that reads the subquery again per row and moves more than ``n`` rows on PostgreSQL
    ids = list((await conn.execute(oldest)).scalars())
    if not ids:
        return 0
    result = await conn.execute(
        update(runs)
        .where(runs.c.run_id.in_(ids), text(held_is(Held.CONCURRENCY, "runs")))
        .values(concurrency_slot=key, held=None, available_at=now, due_at=now)
    )
    if result.rowcount:
        await _notify(conn)
    return int(result.rowcount)


async def free_slot(conn: AsyncConnection, flow_id: str, key: str, now: datetime) -> None:
    """A run holding a slot of ``key`` ended (its write clears ``concurrency_slot``): the
    slot goes to the next held run. Call after :func:`lock`, in the ending transaction."""
    await give_slots(conn, flow_id, key, 1, now)


async def free_slots(conn: AsyncConnection, ended: Iterable[Run], now: datetime) -> None:
    """Runs ended outside a worker's write (a cancel): clear their slots and give each to the
    next held run of its key (locks taken in key order; a cancel's rows are locked already,
    so a crossing write may deadlock, which PostgreSQL breaks and the write retries)."""
    keys = sorted(
        {(r.flow_id, r.concurrency_slot) for r in ended if r.concurrency_slot is not None}
    )
    ids = [r.run_id for r in ended if r.concurrency_slot is not None]
    if not ids:
        return
    await conn.execute(update(runs).where(runs.c.run_id.in_(ids)).values(concurrency_slot=None))
    for flow_id, key in keys:
        await lock(conn, CONCURRENCY, flow_id, key)
        await give_slots(conn, flow_id, key, sum(
            1 for r in ended if (r.flow_id, r.concurrency_slot) == (flow_id, key)
        ), now)  # fmt: skip


async def reserved_starts(
    conn: AsyncConnection,
    flow_id: str,
    key: str,
    limit: int,
    *,
    started_since: datetime | None = None,
) -> list[datetime]:
    """The latest ``limit`` starts a throttle reserved for ``key``, latest first; with
    ``started_since``, only those of runs that really started after it (a started run's
    ``throttle_at`` is its start). Call after :func:`lock`."""
    q = select(runs.c.throttle_at).where(
        runs.c.flow_id == flow_id,
        runs.c.throttle_key == key,
        text("runs.throttle_at IS NOT NULL"),
    )
    if started_since is not None:
        q = q.where(runs.c.throttle_at > started_since, runs.c.started_at.is_not(None))
    q = q.order_by(runs.c.throttle_at.desc()).limit(limit)
    return list((await conn.execute(q)).scalars())


async def joinable(conn: AsyncConnection, flow_id: str, key: str) -> Run | None:
    """The debounced run of ``key`` no worker has claimed yet, if any. Call after
    :func:`lock`."""
    q = (
        select(*RUN_COLUMNS)
        .where(
            runs.c.flow_id == flow_id,
            runs.c.debounce_key == key,
            text(held_is(Held.DEBOUNCE, "runs")),
            runs.c.lease_owner.is_(None),
            runs.c.status == str(RunStatus.QUEUED),
        )
        .order_by(runs.c.run_id.desc())
        .limit(1)
    )
    row = (await conn.execute(q)).first()
    return Run.from_row(row) if row else None


async def join(conn: AsyncConnection, run_id: str, payload: orjson.Fragment, due: datetime) -> bool:
    """An execute joins a debounced run: its payload replaces the run's and the run starts at
    ``due``; ``False`` when a worker claimed it meanwhile."""
    result = await conn.execute(
        update(runs)
        .where(
            runs.c.run_id == run_id,
            text(held_is(Held.DEBOUNCE, "runs")),
            runs.c.lease_owner.is_(None),
            runs.c.status == str(RunStatus.QUEUED),
        )
        .values(payload=payload, available_at=due, due_at=due)
    )
    if result.rowcount == 1:
        await _notify(conn)
        return True
    return False


async def held_counts(conn: AsyncConnection) -> dict[str, int]:
    """How many queued runs flow control holds back now, by reason."""
    q = (
        select(runs.c.held, func.count())
        .where(runs.c.held.is_not(None), runs.c.status == str(RunStatus.QUEUED))
        .group_by(runs.c.held)
    )
    found = {str(reason): int(n) for reason, n in (await conn.execute(q)).all()}
    return {reason: found.get(reason, 0) for reason in (CONCURRENCY, THROTTLE, DEBOUNCE)}


async def active_counts(
    conn: AsyncConnection, workspace_ids: Sequence[str]
) -> dict[tuple[str, str], int]:
    """Queued and running top-level runs per (workspace, mode) of ``workspace_ids`` (the cap
    on a workspace's unfinished runs, ``service/active.py``): ``ix_runs_overview``'s rows."""
    if not workspace_ids:
        return {}
    q = (
        select(runs.c.workspace_id, runs.c.mode, func.count())
        .where(
            runs.c.workspace_id.in_(list(workspace_ids)),
            text("runs.root_run_id IS NULL"),  # ix_runs_overview's rows: no parts
            runs.c.status.in_(("queued", "running")),
        )
        .group_by(runs.c.workspace_id, runs.c.mode)
    )
    return {(w, str(m)): int(n) for w, m, n in (await conn.execute(q)).all()}
