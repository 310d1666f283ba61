"""Signals and the ``wait`` steps they resolve (DESIGN.md, "Steps that wait, branch and call").

A ``wait`` step that finds no signal for it registers a row in ``waits`` and its run sleeps
without a lease. A signal records itself in the rows it matches and wakes their runs; a run
that reaches its ``wait`` after the signal arrived finds the signal in ``signals`` (any sent
since the run was queued counts). Both sides take the same lock first, the signal name's,
in their write transaction, so a signal and a run reaching its ``wait`` never miss each
other: on PostgreSQL a transaction-level advisory lock per workspace, mode and name; on
SQLite the write transaction is already the only one.

Matching: a ``wait`` step's ``match`` is kept as its field names (``match_keys``) and a
digest of their values (``match_digest``); a signal matches when its ``data`` holds every
one of those fields and the digest of their values is the same, so equality is JSON
equality (``1`` is not ``"1"``, nor ``true``) and the lookup is one indexed query per set of
field names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import and_, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.driver import driver_of
from flowhook.store.guards import ACTIVE_RUN
from flowhook.store.models import Mode
from flowhook.store.runs import NOTIFY_CHANNEL
from flowhook.store.tables import runs, signals, waits
from flowhook.store.wakeup import wake_at_commit

__all__ = [
    "Signal",
    "Wait",
    "match_digest",
    "match_keys",
    "lock_name",
    "insert_signal",
    "deliver",
    "find_for_wait",
    "sent_before",
    "register_wait",
    "resolve_wait",
    "taken",
    "get_signal",
]


@dataclass(frozen=True, slots=True)
class Signal:
    id: str
    workspace_id: str
    mode: Mode
    name: str
    data: dict[str, Any]
    created_at: datetime
    run_id: str | None = None
    """The one run it was sent to; ``None`` for a broadcast."""
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """A run's ``wait`` step (step ``idx``) waiting for a signal ``name`` whose data matches
    ``match``, until ``until`` (``None``: until the run's own timeout)."""

    run_id: str
    idx: int
    workspace_id: str
    mode: Mode
    name: str
    match: dict[str, Any]
    created_at: datetime
    until: datetime | None
    root_run_id: str | None = None
    """For a ``wait`` inside a branch or item (``run_id`` is its part's): the run people
    see, to which a signal sent to one run is sent."""


def match_keys(match: dict[str, Any]) -> str:
    """The field names a ``match`` compares, as stored: a JSON list, sorted."""
    return orjson.dumps(sorted(match)).decode()


def match_digest(match: dict[str, Any]) -> str:
    """The digest of a ``match``'s values (or of a signal's data projected on its names)."""
    encoded = orjson.dumps(match, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(encoded).hexdigest()


def _projected(data: dict[str, Any], keys: str) -> dict[str, Any] | None:
    """``data`` reduced to the fields ``keys`` names, or ``None`` when one is missing."""
    names = orjson.loads(keys)
    if not all(name in data for name in names):
        return None
    return {name: data[name] for name in names}


async def lock_name(conn: AsyncConnection, workspace_id: str, mode: str, name: str) -> None:
    """Serialise the signals of ``name`` with the runs reaching a ``wait`` for it (in the
    write transaction that does either; SQLite has one writer)."""
    await driver_of(conn).lock(conn, f"flowhook.signal:{workspace_id}:{mode}:{name}")


def _signal(row: Any) -> Signal:
    return Signal(
        id=row.id, workspace_id=row.workspace_id, mode=Mode(row.mode), name=row.name,
        data=row.data, created_at=row.created_at, run_id=row.run_id, dedup_key=row.dedup_key,
    )  # fmt: skip


async def get_signal(conn: AsyncConnection, signal_id: str) -> Signal | None:
    row = (await conn.execute(select(signals).where(signals.c.id == signal_id))).first()
    return _signal(row) if row else None


async def sent_before(conn: AsyncConnection, signal: Signal) -> Signal | None:
    """The signal stored earlier under ``signal``'s ``dedup_key`` in its workspace and mode,
    if one was."""
    if signal.dedup_key is None:
        return None
    q = select(signals).where(
        signals.c.workspace_id == signal.workspace_id,
        signals.c.mode == str(signal.mode),
        signals.c.dedup_key == signal.dedup_key,
    )
    row = (await conn.execute(q)).first()
    return _signal(row) if row is not None else None


async def insert_signal(conn: AsyncConnection, signal: Signal) -> Signal | None:
    """Store ``signal``; with a ``dedup_key`` already used in its workspace and mode, store
    nothing and answer the signal stored then (else ``None``). Call after
    :func:`lock_name`."""
    earlier = await sent_before(conn, signal)
    if earlier is not None:
        return earlier
    row_values = {
        "id": signal.id, "workspace_id": signal.workspace_id, "mode": str(signal.mode),
        "name": signal.name, "data": signal.data, "run_id": signal.run_id,
        "dedup_key": signal.dedup_key, "created_at": signal.created_at,
    }  # fmt: skip
    await bulk.insert(conn, signals, [row_values])
    return None


def _open_waits(workspace_id: str, mode: str, name: str) -> Any:
    return and_(
        waits.c.workspace_id == workspace_id,
        waits.c.mode == mode,
        waits.c.name == name,
        waits.c.resolved_at.is_(None),
    )


async def deliver(conn: AsyncConnection, signal: Signal, now: datetime) -> list[str]:
    """Resolve the open ``wait`` steps ``signal`` matches (at most one per run, the earliest)
    with it and wake their runs; the ids of those runs. Only waits of runs still going
    count. A signal sent to one run reaches the waits of its branches and items too (at most
    one per branch or item, like a broadcast). Call after :func:`lock_name`, in the
    transaction that stored the signal."""
    ws, mode = signal.workspace_id, str(signal.mode)
    open_ = _open_waits(ws, mode, signal.name)
    # only waits of runs still going (a cancelled run's wait stays open), by primary key
    live = (
        select(waits.c.run_id, waits.c.idx)
        .join(runs, runs.c.run_id == waits.c.run_id)
        .where(text(ACTIVE_RUN))
    )
    if signal.run_id is not None:  # sent to one run: its match fields do not apply
        target = signal.run_id
        found = live.where(open_, or_(waits.c.run_id == target, runs.c.root_run_id == target))
    else:
        key_sets = select(waits.c.match_keys).where(open_).distinct()
        wanted = []
        for keys in (await conn.execute(key_sets)).scalars():
            projected = _projected(signal.data, keys)
            if projected is not None:
                digest = match_digest(projected)
                wanted.append(and_(waits.c.match_keys == keys, waits.c.match_digest == digest))
        if not wanted:
            return []
        found = live.where(open_, or_(*wanted))
    first: dict[str, int] = {}
    for run_id, idx in (await conn.execute(found.order_by(waits.c.run_id, waits.c.idx))).all():
        first.setdefault(run_id, idx)
    if not first:
        return []
    await bulk.update(
        conn,
        waits,
        [
            ({"signal_id": signal.id, "resolved_at": now}, {"run_id": r, "idx": i})
            for r, i in first.items()
        ],
    )
    await wake(conn, list(first), now)
    return list(first)


async def wake(conn: AsyncConnection, run_ids: Sequence[str], now: datetime) -> None:
    """Make sleeping runs claimable now (a run a worker holds is left alone: that worker
    reads what woke it), and wake the workers at commit."""
    ids = sorted(run_ids)
    for start in range(0, len(ids), 500):
        await conn.execute(
            update(runs)
            .where(
                runs.c.run_id.in_(ids[start : start + 500]),
                text(ACTIVE_RUN),
                runs.c.lease_owner.is_(None),
            )
            .values(available_at=now, due_at=now)
        )
    await wake_at_commit(conn, "runs", NOTIFY_CHANNEL)


PAGE = 1000
"""Signals :func:`find_for_wait` reads at a time."""


async def find_for_wait(conn: AsyncConnection, wait: Wait, since: datetime) -> Signal | None:
    """The earliest signal that resolves ``wait``: of its name, sent to its run (or to the
    run its part is part of) or a broadcast whose data matches sent since ``since`` (the run
    was queued), and not already used by another ``wait`` step of the run (the step found
    again after a crash finds the same one). Read :data:`PAGE` signals at a time, oldest
    first, until one matches or none are left: a busy name (a thousand other orders paid
    meanwhile) never hides the one that matches. Call after :func:`lock_name`."""
    used = select(waits.c.signal_id).where(
        waits.c.run_id == wait.run_id, waits.c.idx != wait.idx, waits.c.signal_id.is_not(None)
    )
    q = (
        select(signals)
        .where(
            signals.c.workspace_id == wait.workspace_id,
            signals.c.mode == str(wait.mode),
            signals.c.name == wait.name,
            or_(
                and_(signals.c.run_id.is_(None), signals.c.created_at >= since),
                signals.c.run_id.in_([wait.run_id, wait.root_run_id or wait.run_id]),
            ),
            signals.c.id.not_in(used),
        )
        .order_by(signals.c.created_at, signals.c.id)
        .limit(PAGE)
    )
    keys, digest = match_keys(wait.match), match_digest(wait.match)
    after = q
    while True:
        rows = (await conn.execute(after)).all()
        for row in rows:
            if row.run_id is not None:
                return _signal(row)
            projected = _projected(row.data, keys)
            if projected is not None and match_digest(projected) == digest:
                return _signal(row)
        if len(rows) < PAGE:
            return None
        last = rows[-1]  # the next page: after the last one read, in the same order
        after = q.where(
            or_(
                signals.c.created_at > last.created_at,
                and_(signals.c.created_at == last.created_at, signals.c.id > last.id),
            )
        )


async def register_wait(
    conn: AsyncConnection, wait: Wait, *, resolved_by: Signal | None = None, now: datetime
) -> None:
    """Record that the run reached its ``wait`` step: open, or already resolved by
    ``resolved_by`` (so the signal counts as used by this run)."""
    row = {
        "run_id": wait.run_id, "idx": wait.idx, "workspace_id": wait.workspace_id,
        "mode": str(wait.mode), "name": wait.name, "match_keys": match_keys(wait.match),
        "match_digest": match_digest(wait.match), "created_at": wait.created_at,
        "until": wait.until, "signal_id": resolved_by.id if resolved_by else None,
        "resolved_at": now if resolved_by else None,
    }  # fmt: skip
    await bulk.insert(conn, waits, [row], update_on_conflict=("run_id", "idx"))


async def taken(conn: AsyncConnection, run_id: str, idx: int) -> Signal | None:
    """The signal that resolved a run's ``wait`` step ``idx``, if one did: a read, with no
    lock (a resolved wait stays so)."""
    q = (
        select(signals)
        .join(waits, waits.c.signal_id == signals.c.id)
        .where(waits.c.run_id == run_id, waits.c.idx == idx)
    )
    row = (await conn.execute(q)).first()
    return _signal(row) if row else None


async def resolve_wait(
    conn: AsyncConnection, run_id: str, idx: int, now: datetime
) -> tuple[bool, Signal | None]:
    """What became of a run's ``wait`` step ``idx``: ``(True, signal)`` when a signal resolved
    it; ``(True, None)`` when its time is up (recorded here, so a signal that comes later no
    longer counts); ``(False, None)`` while it still waits. Call after :func:`lock_name`."""
    q = select(waits.c.signal_id, waits.c.until, waits.c.resolved_at).where(
        waits.c.run_id == run_id, waits.c.idx == idx
    )
    row = (await conn.execute(q)).first()
    if row is None:
        return True, None
    if row.signal_id is not None:
        return True, await get_signal(conn, row.signal_id)
    if row.resolved_at is not None:
        return True, None
    until = row.until
    if until is not None and until.tzinfo is None:
        until = until.replace(tzinfo=now.tzinfo)
    if until is None or now < until:
        return False, None
    await conn.execute(
        update(waits)
        .where(waits.c.run_id == run_id, waits.c.idx == idx, waits.c.resolved_at.is_(None))
        .values(resolved_at=now)
    )
    return True, None
