"""The delivery queue: claims, leases, and what an attempt needs.

Deliveries are their own queue, like runs: a pending delivery is due at ``next_attempt_at``;
a claim moves ``next_attempt_at`` to the end of the lease so a delivery whose process died is
tried again once the lease runs out, with the same event id. Claims take deliveries in the
order they fell due (``due_at``, which claims do not move), so one claimed again after a
crash goes before the deliveries that fell due after it, and the attempt the crash cut short
is marked interrupted in the attempt log.

The dispatcher claims many times a second: its statements are built once (per whether
endpoints are left out), their values bound as parameters, so a claim pays neither the
construction nor SQLAlchemy's cache key of a fresh statement, and they run on the driver
(:func:`flowhook.store.bulk.rows`: straight on ``sqlite3``, or on asyncpg with each list of
ids one array, compiled once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cache, lru_cache
from typing import Any

from sqlalchemy import Integer, any_, bindparam, func, insert, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.crypto import SecretBox, cipher
from flowhook.store.driver import driver_of
from flowhook.store.error_classes import INTERRUPTED_DETAIL, ErrorClass
from flowhook.store.guards import PENDING_DELIVERY
from flowhook.store.models import envelope
from flowhook.store.pg_driver import unnested, unnested_params
from flowhook.store.tables import deliveries, delivery_attempts, events, runs, webhook_endpoints
from flowhook.store.types import IdType

__all__ = [
    "DueDelivery",
    "claim_deliveries",
    "due_deliveries",
    "insert_claimed",
    "renew_delivery_lease",
    "next_due_delivery",
    "NEXT_DUE_SLICE",
]

_EP = webhook_endpoints.c
_D = deliveries.c
_DUE = text(PENDING_DELIVERY)
"""Pending (written out, see :mod:`flowhook.store.guards`)."""


@dataclass(frozen=True, slots=True)
class DueDelivery:
    """A claimed delivery with what its attempt needs."""

    id: str
    event_id: str
    event_type: str
    endpoint_id: str
    attempts: int
    body: bytes
    url: str | None
    """``None`` when the endpoint was deleted."""
    enabled: bool
    secret: str
    previous_secret: str | None
    previous_secret_expires_at: datetime | None
    failing_since: datetime | None
    created_at: datetime
    ordering: str | None = None
    rate_limit: float | None = None
    run_id: str | None = None
    flow_id: str | None = None
    traceparent: str | None = None
    """The trace context of the event's run (read with the claim: no query of its own)."""
    paused_at: datetime | None = None
    """The endpoint is paused: the delivery goes back to wait, no attempt used
    (:func:`flowhook.store.pausing.put_back`)."""

    @classmethod
    def from_values(cls, values: dict[str, Any], box: SecretBox) -> DueDelivery:
        """From the columns of :data:`_DUE_COLUMNS` by name; secrets opened with ``box``."""
        body = values["body"]
        if body is None:  # the envelope, rebuilt around the stored payload
            body = envelope(
                values["event_type"],
                values["flow_id"],
                values["run_id"],
                values["event_at"],
                values["payload"],
            )
        secret, previous = values["secret"], values["previous_secret"]
        return cls(
            **{name: values[name] for name in _DUE_PLAIN},
            enabled=bool(values["enabled"]),
            body=bytes(body),
            secret=box.open(secret) if secret else "",
            previous_secret=box.open(previous) if previous else None,
        )


_DUE_COLUMNS = (
    _D.id,
    _D.event_id,
    _D.event_type,
    _D.endpoint_id,
    _D.attempts,
    events.c.payload,
    events.c.body,
    events.c.created_at.label("event_at"),
    _EP.url,
    _EP.enabled,
    _EP.secret,
    _EP.previous_secret,
    _EP.previous_secret_expires_at,
    _EP.failing_since,
    _D.created_at,
    _EP.ordering,
    _EP.rate_limit,
    _D.run_id,
    events.c.flow_id,
    runs.c.traceparent,
    _EP.paused_at,
)
_DUE_NAMES = tuple(c.key for c in _DUE_COLUMNS)
_CLAIMED_OWN = ("id", "event_id", "event_type", "endpoint_id", "attempts", "created_at", "run_id")
"""The columns of :data:`_DUE_COLUMNS` that are the delivery's own (read from the claim)."""
_DUE_PLAIN = tuple(
    f.name
    for f in fields(DueDelivery)
    if f.name in _DUE_NAMES and f.name not in ("enabled", "body", "secret", "previous_secret")
)
"""The fields of :class:`DueDelivery` taken from their column as they are."""


async def claim_deliveries(
    conn: AsyncConnection,
    *,
    owner: str,
    now: datetime,
    lease_until: datetime,
    limit: int,
    per_endpoint: int,
    busy_endpoints: Sequence[str] = (),
) -> list[DueDelivery]:
    """Claim due deliveries, at most ``per_endpoint`` of any one endpoint, oldest first, and
    none of the endpoints this process already has at its cap: one dead endpoint cannot fill
    the batch. The guarded UPDATE makes a row claimed by two processes go to one.

    "Oldest" is by the time a delivery fell due (``due_at``), not ``next_attempt_at``, which
    the claim moves to the lease's end: a delivery whose process died is taken in its place
    when its lease ends, not behind everything that fell due meanwhile. The attempt that
    process left open is marked :attr:`~flowhook.store.error_classes.ErrorClass.INTERRUPTED`.

    The per-endpoint ranking looks at the oldest due deliveries only (a window twice
    the batch, read in order from the partial index on ``due_at``, passing over the ones
    under a live lease), so a claim does not sort the whole backlog, which was most of the
    dispatcher's time with thousands due.

    With compound writes (PostgreSQL) the claim is one statement, atomic on its own: ``conn``
    may be in autocommit (:meth:`~flowhook.store.db.Database.statement`). Elsewhere it is
    several, in ``conn``'s transaction.
    """
    if busy_endpoints:  # none due past the busy endpoints: nothing to rank (a cheap read)
        due = await next_due_delivery(conn, busy_endpoints)
        if due is None or due > now:
            return []
    window = _window(now, limit, per_endpoint, busy_endpoints)
    if driver_of(conn).compound_writes:
        stmt = _claim_at_once_statement("busy" in window)
        return await _due_rows(conn, stmt, {**window, "owner": owner, "lease_until": lease_until})
    ids = [r[0] for r in await bulk.rows(conn, _oldest_due_statement("busy" in window), window)]
    if not ids:
        return []
    params = {"ids": ids, "now": now, "owner": owner, "lease_until": lease_until}
    claimed = await bulk.rows(conn, _claim_statement(), params)
    if not claimed:
        return []
    await _mark_interrupted(conn, [r[0] for r in claimed if r[1] > 1])
    # Every attempt is logged before it is sent: its line is written with the claim.
    await bulk.insert(
        conn,
        delivery_attempts,
        [{"delivery_id": r[0], "number": r[1], "started_at": now} for r in claimed],
    )
    return await due_deliveries(conn, [r[0] for r in claimed])


async def _due_rows(conn: AsyncConnection, stmt: Any, params: dict[str, Any]) -> list[DueDelivery]:
    """``stmt`` run on the driver, its rows of :data:`_DUE_COLUMNS` made deliveries to
    attempt."""
    rows = await bulk.rows(conn, stmt, params)
    box = cipher(conn)  # opened values are cached: an endpoint's secret is decrypted once
    return [DueDelivery.from_values(dict(zip(_DUE_NAMES, r, strict=True)), box) for r in rows]


async def due_deliveries(conn: AsyncConnection, ids: Sequence[str]) -> list[DueDelivery]:
    """What the attempts of the claimed deliveries ``ids`` need, oldest first."""
    return await _due_rows(conn, _due_statement(), {"ids": list(ids)})


async def insert_claimed(
    conn: AsyncConnection, rows: Sequence[dict[str, Any]], taken: Sequence[str], now: datetime
) -> list[DueDelivery]:
    """Queue the deliveries ``rows``, of which ``taken`` are written claimed (leased, one
    attempt counted, as :func:`claim_deliveries` would leave them): their first attempt's
    line logged with them, and what their attempts need read. With compound writes one
    statement (:func:`_handoff_statement`), where it took three."""
    if driver_of(conn).compound_writes:
        params = {**unnested_params(rows), "now": now}
        return await _due_rows(conn, _handoff_statement(tuple(rows[0])), params)
    await bulk.insert(conn, deliveries, rows)
    # every attempt is logged before it is sent, as a claim logs it
    await bulk.insert(
        conn,
        delivery_attempts,
        [{"delivery_id": i, "number": 1, "started_at": now} for i in taken],
    )
    return await due_deliveries(conn, taken)


@cache
def _claim_statement() -> Any:
    """Take ``ids`` still due at ``now`` (the guard: a row two processes chose goes to one)
    for ``owner`` until ``lease_until``; returns (id, attempts)."""
    until = bindparam("lease_until", type_=_D.next_attempt_at.type)
    return (
        update(deliveries)
        .where(
            _D.id.in_(bindparam("ids", expanding=True)),
            _DUE,
            _D.next_attempt_at <= bindparam("now", type_=_D.next_attempt_at.type),
        )
        .values(
            lease_owner=bindparam("owner"),
            lease_expires_at=until,
            next_attempt_at=until,
            attempts=_D.attempts + 1,
        )
        .returning(_D.id, _D.attempts)
    )


def _array_of(ids: Any) -> Any:
    """``ARRAY(SELECT ids …)``: computed once (an InitPlan), then read as ``id = ANY(…)``."""
    return func.ARRAY(select(ids).scalar_subquery(), type_=postgresql.ARRAY(IdType()))


@cache
def _claim_at_once_statement(busy: bool) -> Any:
    """The whole claim as one PostgreSQL statement: the oldest due deliveries' ids
    (:func:`_oldest_due_statement`) are claimed (:func:`_claim_statement`'s guard and
    values); the attempts the claimed ones' processes left open are marked interrupted;
    each claimed delivery's new attempt is logged; and what the attempts need is read
    (:data:`_DUE_COLUMNS`, the deliveries' own columns as the claim left them), oldest
    first. Claimed step by step, each of its five round trips and the transaction's two
    waited behind the dispatcher's busy event loop, which bounded PostgreSQL's deliveries/s
    (bench/README.md, "Figures moved from docstrings").

    The rows are locked first, in id order (the lock order rule), in a CTE run once: an
    ``UPDATE … WHERE id IN (<the oldest>)`` locked them in the order of whatever scan the
    planner chose, and concurrent claims deadlocked. Both steps take their ids as one array
    (an InitPlan), so each reads the rows by key."""
    oldest = _oldest_due_statement(busy).subquery("oldest")
    until = bindparam("lease_until", type_=_D.next_attempt_at.type)
    now = bindparam("now", type_=_D.next_attempt_at.type)
    locked = (
        select(_D.id)
        .where(
            _D.id == any_(_array_of(oldest.c.id)),
            _DUE,
            _D.next_attempt_at <= now,
        )
        .order_by(_D.id)
        .with_for_update(key_share=True)  # what the UPDATE takes: FOR NO KEY UPDATE
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    claimed = (
        update(deliveries)
        .where(
            _D.id == any_(_array_of(locked.c.id)),
            _DUE,
            _D.next_attempt_at <= now,
        )
        .values(
            lease_owner=bindparam("owner"),
            lease_expires_at=until,
            next_attempt_at=until,
            attempts=_D.attempts + 1,
        )
        .returning(*(_D[name] for name in _CLAIMED_OWN))
        .cte("claimed")
    )
    _A = delivery_attempts.c
    interrupted = (
        update(delivery_attempts)
        .where(
            _A.delivery_id.in_(select(claimed.c.id).where(claimed.c.attempts > 1)),
            _A.finished_at.is_(None),
            _A.error_class.is_(None),
        )
        .values(error_class=str(ErrorClass.INTERRUPTED), error_detail=INTERRUPTED_DETAIL)
        .cte("interrupted")
    )
    logged = (
        insert(delivery_attempts)
        .from_select(
            ["delivery_id", "number", "started_at"],
            select(claimed.c.id, claimed.c.attempts, now),
        )
        .cte("logged")
    )
    return _due_from(claimed).add_cte(interrupted, logged)


def _due_from(written: Any) -> Any:
    """:data:`_DUE_COLUMNS` of the deliveries a CTE wrote (``RETURNING`` the columns of
    :data:`_CLAIMED_OWN`: the rows as the statement left them, which its own reads of
    ``deliveries`` would not see), oldest first."""
    columns = [written.c[c.key].label(c.key) if c.key in _CLAIMED_OWN else c for c in _DUE_COLUMNS]
    return (
        select(*columns)
        .select_from(written)
        .join(events, events.c.id == written.c.event_id)
        .outerjoin(webhook_endpoints, _EP.id == written.c.endpoint_id)
        .outerjoin(runs, runs.c.run_id == written.c.run_id)
        .order_by(written.c.created_at)
    )


@lru_cache(maxsize=8)
def _handoff_statement(columns: tuple[str, ...]) -> Any:
    """PostgreSQL: deliveries written (``columns``, one array parameter each:
    :func:`~flowhook.store.pg_driver.unnested`), the attempt line of each one taken (written
    with one attempt counted) logged, and what the taken ones' attempts need read, as
    :func:`_claim_at_once_statement` reads it: one round trip instead of three."""
    rows = unnested(deliveries, [(c, c) for c in columns])
    written = (
        insert(deliveries)
        .from_select(list(columns), select(*(rows.c[c] for c in columns)))
        .returning(*(_D[name] for name in _CLAIMED_OWN))
        .cte("written")
    )
    taken = written.c.attempts > 0
    now = bindparam("now", type_=_D.due_at.type)
    lines = select(written.c.id, written.c.attempts, now).where(taken)
    logged = (
        insert(delivery_attempts)
        .from_select(["delivery_id", "number", "started_at"], lines)
        .cte("logged")
    )
    return _due_from(written).where(taken).add_cte(logged)


@cache
def _due_statement() -> Any:
    """What the attempts of the claimed ``ids`` need (:data:`_DUE_COLUMNS`), oldest first."""
    return (
        select(*_DUE_COLUMNS)
        .join(events, events.c.id == _D.event_id)
        .outerjoin(webhook_endpoints, _EP.id == _D.endpoint_id)
        .outerjoin(runs, runs.c.run_id == _D.run_id)  # by primary key: its trace context
        .where(_D.id.in_(bindparam("ids", expanding=True)))
        .order_by(_D.created_at)
    )


@cache
def _oldest_due_statement(busy: bool) -> Any:
    """The ids of up to ``limit`` due deliveries at ``now``, oldest first, at most
    ``per_endpoint`` of any one endpoint, from a ``window`` of the oldest due (and with
    ``busy``: none of the endpoints ``busy``)."""
    now = bindparam("now", type_=_D.due_at.type)
    window = (
        select(_D.id, _D.endpoint_id, _D.due_at)
        .where(_DUE, _D.due_at <= now, _D.next_attempt_at <= now)
        .order_by(_D.due_at)
        .limit(bindparam("window", type_=Integer))
    )
    if busy:
        window = window.where(_D.endpoint_id.not_in(bindparam("busy", expanding=True)))
    oldest = window.subquery()
    ranked = select(
        oldest.c.id,
        oldest.c.due_at,
        func.row_number()
        .over(partition_by=oldest.c.endpoint_id, order_by=oldest.c.due_at)
        .label("rank"),
    ).subquery()
    return (
        select(ranked.c.id)
        .where(ranked.c.rank <= bindparam("per_endpoint", type_=Integer))
        .order_by(ranked.c.due_at)
        .limit(bindparam("limit", type_=Integer))
    )


def _window(
    now: datetime, limit: int, per_endpoint: int, busy_endpoints: Sequence[str]
) -> dict[str, Any]:
    """The parameters of :func:`_oldest_due_statement` (``busy`` only when there are any)."""
    params: dict[str, Any] = {
        "now": now, "window": 2 * limit, "per_endpoint": per_endpoint, "limit": limit,
    }  # fmt: skip
    if busy_endpoints:
        params["busy"] = sorted(busy_endpoints)
    return params


async def _mark_interrupted(conn: AsyncConnection, delivery_ids: Sequence[str]) -> None:
    """Mark the attempts of ``delivery_ids`` that never recorded an outcome as interrupted:
    they are claimed again, so no process is sending them any more (a late answer from one
    that is still overwrites the mark with what it saw)."""
    if not delivery_ids:
        return
    await conn.execute(
        update(delivery_attempts)
        .where(
            delivery_attempts.c.delivery_id.in_(list(delivery_ids)),
            delivery_attempts.c.finished_at.is_(None),
            delivery_attempts.c.error_class.is_(None),
        )
        .values(error_class=str(ErrorClass.INTERRUPTED), error_detail=INTERRUPTED_DETAIL)
    )


async def renew_delivery_lease(
    conn: AsyncConnection, delivery_id: str, *, owner: str, until: datetime
) -> bool:
    """Extend a held delivery's lease to ``until``; ``False`` when ``owner`` lost it."""
    result = await conn.execute(
        update(deliveries)
        .where(_D.id == delivery_id, _D.lease_owner == owner, _DUE)
        .values(lease_expires_at=until, next_attempt_at=until)
    )
    return bool(result.rowcount == 1)


NEXT_DUE_SLICE = 128
"""Pending deliveries, earliest first, that the due-time probe reads before it looks past the
busy endpoints one endpoint at a time (see :func:`next_due_delivery`)."""


@cache
def _next_due_statement(busy: bool) -> Any:
    """The earliest ``next_attempt_at`` of a pending delivery; with ``busy``, of those among
    the first :data:`NEXT_DUE_SLICE` (earliest first) whose endpoint is not in ``busy``."""
    if not busy:
        return select(func.min(_D.next_attempt_at)).where(_DUE)
    earliest = (
        select(_D.endpoint_id, _D.next_attempt_at)
        .where(_DUE)
        .order_by(_D.next_attempt_at)
        .limit(NEXT_DUE_SLICE)
        .subquery()
    )
    return select(func.min(earliest.c.next_attempt_at)).where(
        earliest.c.endpoint_id.not_in(bindparam("busy", expanding=True))
    )


@cache
def _next_due_past_statement() -> Any:
    """The earliest ``next_attempt_at`` of a pending delivery of an endpoint not in ``busy``,
    visiting each endpoint that has pending deliveries once, from
    ``ix_deliveries_endpoint_due``: a recursive query steps from one endpoint id to the next
    (a loose index scan) and takes each one's earliest. Its cost grows with those endpoints,
    not with their backlogs."""

    def first(column: Any, *where: Any) -> Any:
        # ORDER BY the index's own columns, LIMIT 1: one seek in ix_deliveries_endpoint_due
        # (with min() SQLite took (endpoint_id, status, created_at) and walked delivered rows)
        return (
            select(column)
            .where(_DUE, *where)
            .order_by(_D.endpoint_id, _D.next_attempt_at)
            .limit(1)
            .scalar_subquery()
        )

    endpoints = select(first(_D.endpoint_id).label("endpoint")).cte(
        "pending_endpoints", recursive=True
    )
    after = first(_D.endpoint_id, _D.endpoint_id > endpoints.c.endpoint)
    endpoints = endpoints.union_all(select(after).where(endpoints.c.endpoint.is_not(None)))
    earliest = first(_D.next_attempt_at, _D.endpoint_id == endpoints.c.endpoint)
    return select(func.min(earliest)).where(
        endpoints.c.endpoint.is_not(None),
        endpoints.c.endpoint.not_in(bindparam("busy", expanding=True)),
    )


async def next_due_delivery(
    conn: AsyncConnection, busy_endpoints: Sequence[str] = ()
) -> datetime | None:
    """When the next pending delivery falls due, leaving out endpoints that cannot take more
    now (they wake the dispatcher themselves when they can).

    With busy endpoints, the earliest :data:`NEXT_DUE_SLICE` pending deliveries are read
    first: one of another endpoint among them is the answer. Only when all are the busy
    endpoints' does the probe look past them endpoint by endpoint. A read in due order alone
    walked the busy endpoints' whole backlog on every wake-up; the endpoint-by-endpoint read
    alone grew with the endpoints that have anything pending (bench/README.md, "Figures
    moved from docstrings")."""
    busy = list(busy_endpoints)
    params: dict[str, Any] = {"busy": busy} if busy else {}
    [(found,)] = await bulk.rows(conn, _next_due_statement(bool(busy)), params)
    if found is None and busy:
        [(found,)] = await bulk.rows(conn, _next_due_past_statement(), params)
    assert found is None or isinstance(found, datetime)
    return found
