"""Runs, their steps, and the run queue.

The queue is the ``runs`` table: a run is claimable while its status is queued or running and
``available_at`` has passed. A claim sets ``lease_owner`` and moves ``available_at`` to the end
of the lease, so a run whose worker dies becomes claimable again when its lease runs out,
and the claim query needs no separate lease test. Heartbeats push both forward. Each
workspace and mode is a queue of its own, and claims take turns across them (:class:`Turns`);
within a queue they take runs by ``priority``, then in the order they fell due (``due_at``:
queued, or woken from a delay or a backoff), which neither moves, so a run whose worker died
goes before the runs that fell due after it.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any, NamedTuple

import orjson
from sqlalchemy import (
    Integer,
    Select,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
    true,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store import events as events_store
from flowhook.store.deliveries import Handoff
from flowhook.store.driver import Attached, driver_named, driver_of
from flowhook.store.guards import ACTIVE_RUN, run_move
from flowhook.store.models import Event, Mode, Run, RunStatus, RunStep, StepStatus
from flowhook.store.rows import owned, page
from flowhook.store.tables import run_steps, runs

__all__ = [
    "steps_of",
    "NOTIFY_CHANNEL",
    "RUN_COLUMNS",
    "LeaseLost",
    "insert_run",
    "insert_runs",
    "insert_steps",
    "find_by_idempotency_keys",
    "release_idempotency_key",
    "get_run",
    "get_run_by_id",
    "list_runs",
    "claim_runs",
    "Turns",
    "TURN_SPACES",
    "extend_leases",
    "StatusChange",
    "Progress",
    "apply_progress",
    "cancel_unleased",
    "request_cancel",
    "next_due",
    "cancel_requested_among",
    "hand_back",
    "queue_depth",
]

NOTIFY_CHANNEL = "flowhook_runs"


class LeaseLost(Exception):
    """The guarded update matched nothing: the lease moved on, a cancel was requested, or
    the run's status does not allow the move (another process moved it first)."""


RUN_COLUMNS = [
    c for c in runs.c if c.name not in ("idempotency_key", "request_hash", "tree_run_id")
]
"""What a read of a run takes. Not ``tree_run_id``: written for the tree's cancel (its index),
read back from the run's ``scope`` (:attr:`Run.tree`)."""
_RUN_NAMES = tuple(c.name for c in RUN_COLUMNS)

_CLAIMABLE = text(ACTIVE_RUN)
"""Queued or running: what the queue holds (written out, see :mod:`flowhook.store.guards`)."""
_QUEUE_ORDER = (runs.c.workspace_id, runs.c.mode, runs.c.priority.desc(), runs.c.due_at)
"""``ix_runs_queue``'s order: each workspace and mode's queue, highest priority, then due first."""


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
    alone: bool = False,
) -> None:
    """Write many queued runs: (run, idempotency key, request hash) each; ``payloads``, when
    given, are their payloads already encoded, in the same order (written as they are, not
    encoded a second time). One statement per column set (:meth:`Run.to_row`); on
    PostgreSQL the last one also sends the workers' ``NOTIFY``, so runs of one column set
    are one statement, atomic on its own. ``alone``: ``conn`` is in autocommit (the API's
    accept), so the runs must be one statement: runs of two column sets raise
    :class:`ValueError` before anything is written."""
    if not batch:
        return
    if payloads is not None and len(payloads) != len(batch):
        raise ValueError("one encoded payload per run")
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for i, (run, key, digest) in enumerate(batch):
        row = run.to_row(None if payloads is None else payloads[i])
        row["idempotency_key"] = key
        row["request_hash"] = digest
        shapes.setdefault(tuple(row), []).append(row)
    if alone and len(shapes) > 1:  # each statement would commit on its own
        raise ValueError("runs of more than one column set cannot be written as one statement")
    *first, last = shapes.values()  # one statement per column set
    for rows in first:
        await bulk.insert(conn, runs, rows)
    # the last one and the workers' NOTIFY: one statement, where other processes are told
    await bulk.insert(conn, runs, last, channel=NOTIFY_CHANNEL)
    conn.info.setdefault("wake", set()).add("runs")


@cache
def _by_idempotency_keys(dialect: str) -> Any:
    """The runs some Idempotency-Keys started in one workspace's mode: one statement, built
    once, whatever the number of keys (one prepared text where the driver takes the keys as
    one array, :meth:`~flowhook.store.driver.Driver.one_of`). ``IS NOT NULL`` names the
    unique index's own condition, so either planner sees that the partial index answers it."""
    key = runs.c.idempotency_key
    return select(*RUN_COLUMNS, key, runs.c.request_hash).where(
        runs.c.workspace_id == bindparam("workspace_id"),
        runs.c.mode == bindparam("mode"),
        key.is_not(None),
        driver_named(dialect).one_of(key, "keys"),
    )


async def find_by_idempotency_keys(
    conn: AsyncConnection, workspace_id: str, mode: Mode, keys: Collection[str]
) -> dict[str, tuple[Run, str]]:
    """The runs that ``keys`` started in the workspace's ``mode``, with their requests'
    hashes, by key (a key no run holds is left out). A batch of accepts reads its keys in
    this one statement: read one by one, through a statement built per key, they were a
    large share of the API process's time under load, all of it spent holding SQLite's
    write lock (bench/README.md, "Idempotency-Keys read once per batch")."""
    if not keys:
        return {}
    params = {"workspace_id": workspace_id, "mode": str(mode), "keys": list(keys)}
    rows = await conn.execute(_by_idempotency_keys(conn.dialect.name), params)
    return {row.idempotency_key: (Run.from_row(row), row.request_hash) for row in rows}


async def release_idempotency_key(conn: AsyncConnection, run_id: str) -> None:
    """Forget an expired key so a new request may use it."""
    await conn.execute(
        update(runs).where(runs.c.run_id == run_id).values(idempotency_key=None, request_hash=None)
    )


@cache
def _steps_statement() -> Any:
    """A run's step records, in order: built once, its run id bound."""
    run_id = bindparam("run_id", type_=run_steps.c.run_id.type)
    return select(run_steps).where(run_steps.c.run_id == run_id).order_by(run_steps.c.idx)


def asleep_in(workspace_id: str, mode: Mode, step_type: str | tuple[str, ...]) -> Select[Any]:
    """The runs people see (``root_run_id`` of a part, else the run) that are running and
    asleep in a step of ``step_type`` (their own, or one of a part's), each once."""
    shown = func.coalesce(runs.c.root_run_id, runs.c.run_id)
    return (
        select(shown.label("run_id"))
        .select_from(runs.join(run_steps, run_steps.c.run_id == runs.c.run_id))
        .where(
            runs.c.workspace_id == workspace_id,
            runs.c.mode == mode.value,
            runs.c.status == RunStatus.RUNNING.value,
            run_steps.c.status == StepStatus.WAITING.value,
            run_steps.c.type.in_((step_type,) if isinstance(step_type, str) else step_type),
        )
        .distinct()
    )


async def sleeping_steps(conn: AsyncConnection, run_ids: Sequence[str]) -> dict[str, RunStep]:
    """The step each of ``run_ids`` sleeps in (waiting, or retrying after a failed attempt),
    for those that sleep: a list's runs, in one read."""
    if not run_ids:
        return {}
    q = select(run_steps).where(
        run_steps.c.run_id.in_(sorted(run_ids)),
        run_steps.c.status.in_([str(StepStatus.WAITING), str(StepStatus.RETRYING)]),
    )
    return {r.run_id: RunStep.from_row(r) for r in (await conn.execute(q)).all()}


async def _steps_of(conn: AsyncConnection, run_id: str) -> list[RunStep]:
    rows = (await conn.execute(_steps_statement(), {"run_id": run_id})).all()
    return [RunStep.from_row(r) for r in rows]


async def steps_of(conn: AsyncConnection, run_id: str) -> list[RunStep]:
    """A run's step records, in order (the engine resuming a run it claimed: it has the run)."""
    return await _steps_of(conn, run_id)


@cache
def _owned_run_statement() -> Any:
    """A run, if the workspace and mode own it: what every read of a run (and each turn of a
    long poll) asks, built once with bound values."""
    return select(*RUN_COLUMNS).where(
        runs.c.run_id == bindparam("run_id", type_=runs.c.run_id.type),
        runs.c.workspace_id == bindparam("workspace_id", type_=runs.c.workspace_id.type),
        runs.c.mode == bindparam("mode", type_=runs.c.mode.type),
    )


async def get_run(conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str) -> Run | None:
    """The run with its steps, if the workspace and mode own it."""
    params = {"run_id": run_id, "workspace_id": workspace_id, "mode": mode.value}
    row = (await conn.execute(_owned_run_statement(), params)).first()
    if row is None:
        return None
    run = Run.from_row(row)
    run.steps = await _steps_of(conn, run_id)
    return run


async def get_run_by_id(conn: AsyncConnection, run_id: str) -> Run | None:
    """The run with its steps, whoever owns it (for the engine)."""
    row = (await conn.execute(select(*RUN_COLUMNS).where(runs.c.run_id == run_id))).first()
    if row is None:
        return None
    run = Run.from_row(row)
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
    asleep: str | None = None,
) -> list[Run]:
    """Newest first, without steps; ``after`` is the last run id of the page before.
    ``asleep``: only running runs asleep in a step of that type (:func:`asleep_in`)."""
    q = page(
        RUN_COLUMNS, runs.c.run_id, workspace_id, mode, limit=limit, after=after,
        flow_id=flow_id, status=status,
    ).where(runs.c.root_run_id.is_(None))  # fmt: skip
    if asleep is not None:
        q = q.where(runs.c.run_id.in_(asleep_in(workspace_id, mode, asleep)))
    return [Run.from_row(r) for r in (await conn.execute(q)).all()]


TURN_SPACES = 16
"""At most this many workspaces take part in one claim (:class:`Turns`); the others' turn
comes in the claims after it."""


@dataclass(slots=True)
class Turns:
    """Where the claims of one worker stand in the round of (workspace, mode) queues.

    Every workspace and mode is a queue of its own: a claim takes one due run from each
    queue in turn, starting after the queue that had the last turn, before it takes a second
    from any, so one tenant's ten thousand queued runs (or a burst of priority-100 ones)
    delay another tenant's run by one turn, not by the whole backlog. Within a queue, runs
    go highest ``priority`` first, then in the order they fell due. A worker keeps one
    ``Turns`` for all its claims."""

    after: tuple[str, str] | None = None
    """The queue (workspace id, mode) that had the last turn; ``None``: none yet."""

    def order(self, spaces: Sequence[tuple[str, bool, bool]]) -> list[tuple[str, str]]:
        """The queues of ``spaces`` (each a workspace with whether it has live and test runs
        queued or running) in the order of their turns, from the one after :attr:`after`
        round to it, at most :data:`TURN_SPACES` workspaces' worth."""
        after = self.after or ("", "")
        nearest = sorted(spaces, key=lambda s: (s[0] < after[0], s[0]))[:TURN_SPACES]
        queues = [
            (w, str(m))
            for w, live, test in nearest
            for m, present in ((Mode.LIVE, live), (Mode.TEST, test))
            if present
        ]
        return sorted(queues, key=lambda q: (q <= after, q))

    def took(self, queues: Sequence[tuple[str, str]], claimed: Sequence[Run]) -> None:
        """Move on past the queue that had the last turn of a claim that took ``claimed``
        from ``queues`` (in turn order); past all of them when it took none, so queues beyond
        the claim's :data:`TURN_SPACES` workspaces get their turn."""
        if not queues:
            return
        if not claimed:
            self.after = queues[-1]
            return
        taken = collections.Counter((r.workspace_id, str(r.mode)) for r in claimed)
        rounds = max(taken.values())  # the last run taken was of the last round…
        self.after = [q for q in queues if taken[q] == rounds][-1]  # …by the last queue in it


async def claim_runs(
    conn: AsyncConnection,
    *,
    owner: str,
    now: datetime,
    lease_until: datetime,
    limit: int,
    turns: Turns | None = None,
) -> list[Run]:
    """Claim up to ``limit`` due runs for ``owner`` under a lease ending at ``lease_until``,
    the (workspace, mode) queues taking turns (:class:`Turns`; ``turns`` is moved on).

    Two statements. The first finds the workspaces with runs queued or running by a skip
    scan of ``ix_runs_queue`` (one index probe per workspace, however many runs each has),
    from the one after ``turns.after``. The second takes each queue's due runs from the same
    index, in its order (``priority`` first, then ``due_at``, which claims and heartbeats do
    not move: a run whose worker died is taken in its place once its lease ends, instead of
    behind every run queued meanwhile), ranks them by turn, and claims the first ``limit``.
    Each queue is read in three ranges (priority above 0, 0, below 0), so a read never passes
    over a queue's sleeping runs, whose ``due_at`` is still to come. A queue's runs under a
    live lease are passed over (at most the runs held now).

    PostgreSQL skips rows other workers hold (``FOR UPDATE SKIP LOCKED``,
    :meth:`~flowhook.store.driver.Driver.locking`); SQLite has one writer, so the same
    statements inside its write transaction are enough.
    """
    turns = turns if turns is not None else Turns()
    params: dict[str, Any] = {"after": turns.after[0] if turns.after else ""}
    spaces = await bulk.rows(conn, _spaces_statement(), params)
    queues = turns.order([(w, bool(live), bool(test)) for w, live, test in spaces])
    if not queues:
        return []
    params = {"owner": owner, "now": now, "lease_until": lease_until, "limit": limit}
    for i, (workspace_id, mode) in enumerate(queues):
        params[f"w{i}"], params[f"m{i}"] = workspace_id, mode
    stmt = _claim_statement(not driver_of(conn).one_writer, len(queues))
    claimed = [Run.from_values(_RUN_NAMES, r) for r in await bulk.rows(conn, stmt, params)]
    turns.took(queues, claimed)
    claimed.sort(key=lambda r: r.queued_at)
    return claimed


@cache
def _spaces_statement() -> Any:
    """The workspaces with runs queued or running, each with whether it has live and test
    ones: first those from ``after`` up (ids ascending), then those below it from the
    lowest, at most :data:`TURN_SPACES` of each; a skip scan of ``ix_runs_queue``.
    ``after`` is a workspace id, or ``""`` (below every id) for the first claim."""
    after = bindparam("after", type_=runs.c.workspace_id.type)

    def first(*where: Any) -> Any:  # the first entry of ix_runs_queue meeting ``where``
        # ORDER BY the index's own columns, LIMIT 1: one seek, on any plan PostgreSQL makes
        # (a generic plan took EXISTS for a sequential scan of runs)
        q = select(runs.c.workspace_id).where(_CLAIMABLE, *where).order_by(*_QUEUE_ORDER)
        return q.limit(1).scalar_subquery()

    def walk(name: str, start: Any, bound: Any) -> Any:
        seed = select(first(and_(start, bound)).label("w"), literal_column("1").label("n"))
        cte = seed.cte(name, recursive=True)
        step = select(first(and_(runs.c.workspace_id > cte.c.w, bound)), cte.c.n + 1).where(
            cte.c.w.is_not(None), cte.c.n < TURN_SPACES
        )
        return cte.union_all(step)

    def has(cte: Any, mode: Mode) -> Any:  # whether its queue of ``mode`` holds any run
        in_mode = text(f"runs.mode = '{mode}'")  # written out: the plan knows which mode
        return first(runs.c.workspace_id == cte.c.w, in_mode).is_not(None)

    up = walk("up", runs.c.workspace_id >= after, true())
    down = walk("down", true(), runs.c.workspace_id < after)
    return union_all(
        *(
            select(cte.c.w.label("workspace_id"), has(cte, Mode.LIVE), has(cte, Mode.TEST)).where(
                cte.c.w.is_not(None)
            )
            for cte in (up, down)
        )
    )


@cache
def _claim_statement(skip_locked: bool, queues: int) -> Any:
    """:func:`claim_runs`' claim of ``queues`` queues, built once per number of queues (and
    whether it skips rows other writers lock: not where there is one writer), its values
    bound: ``owner``, ``now``, ``lease_until``, ``limit``, and each
    queue's ``w<i>`` and ``m<i>`` (in turn order)."""
    now = bindparam("now", type_=runs.c.due_at.type)
    until = bindparam("lease_until", type_=runs.c.available_at.type)
    limit = bindparam("limit", type_=Integer)

    def queue(i: int) -> Any:
        """Queue ``i``'s due runs, at most ``limit``, in three ranges of its order."""
        mine = and_(
            runs.c.workspace_id == bindparam(f"w{i}", type_=runs.c.workspace_id.type),
            runs.c.mode == bindparam(f"m{i}", type_=runs.c.mode.type),
        )

        def due(priority: str) -> Any:  # one range of ix_runs_queue, in its order
            q = (
                select(runs.c.run_id, runs.c.priority, runs.c.due_at)
                .where(mine, _CLAIMABLE, text(f"runs.priority {priority}"))
                .where(runs.c.due_at <= now, runs.c.available_at <= now)
                .order_by(*_QUEUE_ORDER)
                .limit(limit)
            )
            if skip_locked:
                q = q.with_for_update(skip_locked=True)
            return select(q.subquery())

        # the ranges written out, and ordered as the index is, so any plan PostgreSQL makes
        # reads them as ranges of ix_runs_queue
        return union_all(due("> 0"), due("= 0"), due("< 0")).subquery()

    def turn(i: int) -> Any:
        """Queue ``i``'s due runs, each with its rank there and ``i``."""
        parts = queue(i)
        rank = func.row_number().over(order_by=(parts.c.priority.desc(), parts.c.due_at))
        return select(parts.c.run_id, rank.label("rank"), literal_column(str(i)).label("turn"))

    if queues == 1:  # the common case: one queue in its own order, no ranks to take turns by
        only = queue(0)
        chosen = select(only.c.run_id).order_by(only.c.priority.desc(), only.c.due_at).limit(limit)
    else:
        candidates = union_all(*(turn(i) for i in range(queues))).subquery()
        chosen = (
            select(candidates.c.run_id).order_by(candidates.c.rank, candidates.c.turn).limit(limit)
        )
    return (
        update(runs)
        .where(runs.c.run_id.in_(chosen.scalar_subquery()))
        .values(
            lease_owner=bindparam("owner"),
            lease_expires_at=until,
            available_at=until,
            claims=runs.c.claims + 1,
        )
        .returning(*RUN_COLUMNS)
    )


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
    driver = driver_of(conn)
    if driver.one_writer:
        return and_(runs.c.run_id.in_(ids), runs.c.lease_owner == owner, _CLAIMABLE)
    ordered = (
        select(runs.c.run_id)
        .where(runs.c.run_id.in_(ids), runs.c.lease_owner == owner, _CLAIMABLE)
        .order_by(runs.c.run_id)
    )
    return runs.c.run_id.in_(driver.locking(ordered).scalar_subquery())


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


async def insert_steps(conn: AsyncConnection, run_id: str, steps: Sequence[RunStep]) -> None:
    """Write step records of a run that no worker holds yet (a rerun's reused steps)."""
    await bulk.insert(conn, run_steps, [s.to_row(run_id) for s in steps])


class StatusChange(NamedTuple):
    """One move of a run to ``status``, writing ``values`` with it; ``honour_cancel``: a
    cancel request blocks the move (every move but the one to ``cancelled``)."""

    status: RunStatus
    values: dict[str, Any]
    honour_cancel: bool = True


@dataclass(frozen=True, slots=True)
class Progress:
    """One run's writes: status changes in order, step rows and events, applied together or
    not at all."""

    run_id: str
    changes: tuple[StatusChange, ...]
    steps: Sequence[RunStep] = ()
    events: Sequence[Event] = ()
    before: Callable[[AsyncConnection], Awaitable[bool]] | None = None
    """Run first in the transaction, before any ``runs`` row is locked, in ``lock_key`` order
    among the items that have one (so the locks it takes are taken in one order by every
    transaction): it may lock and write rows of its own; ``False`` leaves this item's own
    writes out (it answers ``True``). A ``wait`` step parks its run with one."""
    lock_key: str = ""
    after: Callable[[AsyncConnection], Awaitable[None]] | None = None
    """Run once this item's writes (and those of every other item of the transaction) are
    done, if they applied: a part that ends looks at its siblings then, so of two that end in
    one transaction the second sees the first ended."""


def _move(item: Progress) -> tuple[str, dict[str, Any]]:
    """An item's guard (from the transition table, see :func:`flowhook.store.guards.run_move`)
    and the values its changes write, the last status among them."""
    if not item.changes:
        raise ValueError("a run's progress moves it at least once (running → running)")
    values: dict[str, Any] = {}
    for change in item.changes:
        values.update(change.values)
    target = item.changes[-1].status
    values["status"] = str(target)
    if target.terminal:
        values["lease_owner"] = values["lease_expires_at"] = None
    path = tuple(c.status for c in item.changes)
    return run_move(path, honour_cancel=any(c.honour_cancel for c in item.changes)), values


async def apply_progress(
    conn: AsyncConnection,
    items: Sequence[Progress],
    *,
    owner: str,
    handoff: Handoff | None = None,
) -> list[bool]:
    """Apply many runs' writes in one transaction (group commit). Each item's status change
    is an UPDATE guarded in SQL by the run's lease owner, a status its moves are legal from
    (:data:`~flowhook.store.models.TRANSITIONS`) and, unless it is a cancel, no cancel
    request; an item the database refuses writes nothing (no steps, no events) and answers
    ``False`` (the executor raises :class:`LeaseLost`); the others go on.

    A fixed number of statements whatever the batch size: one guarded update per shape of
    change with the steps of the runs it moved (same guard, same columns: one execution per
    row on SQLite, then the steps; on PostgreSQL one ``UPDATE … FROM unnest(…)`` that writes
    the steps too, :func:`~flowhook.store.bulk.update_each`'s ``attached``), and one
    statement each for the events and their deliveries. On PostgreSQL the runs, when more
    than one, are first locked in ``run_id`` order (the lock order rule, see
    :func:`_held`). A run appears at most once in ``items``: the executor awaits each of
    its writes. ``handoff``: a dispatcher of this process takes what it can of the events'
    deliveries (:func:`~flowhook.store.deliveries.insert_deliveries`).
    """
    if not items:
        return []
    applied = [False] * len(items)
    first = sorted(
        (i for i, item in enumerate(items) if item.before), key=lambda i: items[i].lock_key
    )
    for i in first:
        before = items[i].before
        assert before is not None
        if not await before(conn):
            applied[i] = True  # done by ``before``: nothing of its own to write
    left = [i for i, done in enumerate(applied) if not done]
    driver = driver_of(conn)
    if not driver.one_writer and len(left) > 1:  # one row: its UPDATE locks it
        mine = runs.c.run_id.in_([items[i].run_id for i in left]), runs.c.lease_owner == owner
        await conn.execute(
            driver.locking(select(runs.c.run_id).where(*mine).order_by(runs.c.run_id))
        )
    shapes: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    rows: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for i in left:
        guard, values = _move(items[i])
        shapes.setdefault((guard, tuple(sorted(values))), []).append(i)
        rows[i] = (values, {"run_id": items[i].run_id, "lease_owner": owner})
    for (guard, _), members in shapes.items():
        steps = [s.to_row(items[i].run_id) for i in members for s in items[i].steps]
        done = await bulk.update_each(
            conn,
            runs,
            [rows[i] for i in members],
            guard=guard,
            attached=Attached(run_steps, steps, "run_id", ("run_id", "idx")),
        )
        for i, ok in zip(members, done, strict=True):
            applied[i] = ok
    won = [items[i] for i in left if applied[i]]
    await events_store.insert_events(
        conn, [e for item in won for e in item.events], handoff=handoff
    )
    for item in won:
        if item.after is not None:
            await item.after(conn)
    return applied


async def cancel_unleased(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    run_id: str,
    now: datetime,
    *,
    duration_ms: int | None,
    steps_executed: int,
) -> bool:
    """Cancel a run no worker holds (queued, or sleeping in a delay or a retry backoff),
    recording its ``duration_ms``; ``False`` when a worker holds it, it has ended, or it has
    run steps since the caller read ``steps_executed`` (its cancel event would be stale)."""
    result = await conn.execute(
        update(runs)
        .where(
            owned(runs.c.run_id, run_id, workspace_id, mode),
            text(run_move((RunStatus.CANCELLED,), honour_cancel=False)),
            runs.c.lease_owner.is_(None),
            runs.c.steps_executed == steps_executed,
        )
        .values(
            status=str(RunStatus.CANCELLED),
            finished_at=now,
            cancel_requested_at=now,
            duration_ms=duration_ms,
            held=None,  # its slot, if any, is the caller's to give on (control.free_slots)
        )
    )
    return result.rowcount == 1


async def request_cancel(
    conn: AsyncConnection, workspace_id: str, mode: Mode, run_id: str, now: datetime
) -> bool | None:
    """Flag a run a worker holds; the worker ends it ``cancelled`` at its next write.

    ``None`` when nothing was flagged (the run has ended, or is flagged already); else
    whether a worker holds the run now. ``False`` means its worker handed it back (a delay,
    a wait) after the caller's :func:`cancel_unleased` and before this flag took the row's
    lock: no worker write would come before it wakes, so the caller cancels it itself."""
    result = await conn.execute(
        update(runs)
        .where(
            owned(runs.c.run_id, run_id, workspace_id, mode),
            _CLAIMABLE,
            runs.c.cancel_requested_at.is_(None),
        )
        .values(cancel_requested_at=now)
        .returning(runs.c.lease_owner)
    )
    row = result.first()
    return None if row is None else row.lease_owner is not None


@cache
def _next_due_statement() -> Any:
    return select(func.min(runs.c.available_at)).where(_CLAIMABLE)


async def next_due(conn: AsyncConnection) -> datetime | None:
    """When the next queued or sleeping run becomes claimable (the worker asks before each
    idle wait: built once, run on the driver)."""
    [(found,)] = await bulk.rows(conn, _next_due_statement(), {})
    assert found is None or isinstance(found, datetime)
    return found


async def cancel_requested_among(conn: AsyncConnection, run_ids: Sequence[str]) -> list[str]:
    """Which of ``run_ids`` someone asked to cancel: runs, and parts of runs someone asked to
    cancel. A part flagged only because a sibling failed or its step's time is up is left
    out: it stops at its next step boundary (its next write), its step in flight is not cut
    short (DESIGN.md, ``parallel``)."""
    if not run_ids:
        return []
    root = runs.alias("root")
    q = (
        select(runs.c.run_id)
        .select_from(runs.outerjoin(root, root.c.run_id == runs.c.root_run_id))
        .where(
            runs.c.run_id.in_(list(run_ids)),
            runs.c.cancel_requested_at.is_not(None),
            or_(runs.c.root_run_id.is_(None), root.c.cancel_requested_at.is_not(None)),
        )
    )
    return list((await conn.execute(q)).scalars())


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
