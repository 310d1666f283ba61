"""Webhook endpoints, deliveries (one event to one endpoint) and their attempt log.

Deliveries are their own queue, like runs: a pending delivery is due at ``next_attempt_at``;
a claim moves ``next_attempt_at`` to the end of the lease so a delivery whose process died is
tried again once the lease runs out, with the same event id. Claims take deliveries in the
order they fell due (``due_at``, which claims do not move), so one claimed again after a
crash goes before the deliveries that fell due after it, and the attempt the crash cut short
is marked ``interrupted`` in the attempt log.

A delivery queued by the engine's progress transaction may skip the queue's claim: when the
transaction carries a :class:`Handoff` from a dispatcher in the same process that has room
(and no backlog to honour first), the delivery is written already claimed by that dispatcher,
its first attempt's line with it, exactly as a claim would have left it, and the dispatcher
starts it once the transaction has committed (see :func:`insert_deliveries`).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache
from typing import Any

import orjson
from sqlalchemy import Integer, any_, bindparam, delete, func, insert, null, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.crypto import SecretBox, cipher
from flowhook.store.guards import PENDING_DELIVERY, delivery_move
from flowhook.store.models import Attempt, Delivery, DeliveryStatus, Endpoint, Mode, envelope
from flowhook.store.rows import from_row, owned, page
from flowhook.store.tables import (
    deliveries,
    delivery_attempts,
    endpoint_events,
    events,
    runs,
    webhook_endpoints,
)
from flowhook.store.types import IdType

__all__ = [
    "DELIVERY_CHANNEL",
    "DueDelivery",
    "Handoff",
    "insert_endpoint",
    "get_endpoint",
    "list_endpoints",
    "update_endpoint",
    "delete_endpoint",
    "subscribers",
    "insert_deliveries",
    "claim_deliveries",
    "reserve_send",
    "release_next",
    "release_all",
    "lock_endpoint",
    "Subscriber",
    "FIFO",
    "HELD",
    "INTERRUPTED",
    "Completion",
    "finish_attempts",
    "get_delivery",
    "list_deliveries",
    "failed_deliveries_between",
    "mark_endpoint_health",
    "mark_endpoints_healthy",
    "oldest_pending",
    "next_due_delivery",
    "endpoint_stats",
]

DELIVERY_CHANNEL = "flowhook_deliveries"
FIFO = "fifo"
HELD = datetime(9999, 1, 1, tzinfo=UTC)
"""When a FIFO endpoint's delivery behind a pending one falls due: never, until released."""

_EP = webhook_endpoints.c
_D = deliveries.c
_DUE = text(PENDING_DELIVERY)
"""Pending (written out, see :mod:`flowhook.store.guards`)."""

INTERRUPTED = "interrupted"
"""``error_class`` of an attempt whose process stopped before it recorded an outcome (the
webhook may or may not have arrived); set when the delivery is claimed again."""
_INTERRUPTED_DETAIL = (
    "the process sending this attempt stopped before it recorded an answer; the webhook may "
    "or may not have arrived"
)


def _endpoint(row: Any, events_of: list[str], box: SecretBox) -> Endpoint:
    return from_row(
        Endpoint,
        row,
        {"mode": Mode, "enabled": bool},
        events=sorted(events_of),
        secret=box.open(row.secret),
        previous_secret=box.open(row.previous_secret) if row.previous_secret else None,
    )


async def _events_of(conn: AsyncConnection, endpoint_ids: Sequence[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {i: [] for i in endpoint_ids}
    if endpoint_ids:
        q = select(endpoint_events).where(endpoint_events.c.endpoint_id.in_(list(endpoint_ids)))
        for r in (await conn.execute(q)).all():
            found[r.endpoint_id].append(r.event)
    return found


def _endpoint_values(ep: Endpoint, box: SecretBox) -> dict[str, Any]:
    """The columns to write; secrets sealed."""
    return {
        "url": ep.url,
        "description": ep.description,
        "enabled": ep.enabled,
        "disabled_reason": ep.disabled_reason,
        "secret": box.seal(ep.secret),
        "previous_secret": box.seal(ep.previous_secret) if ep.previous_secret else None,
        "previous_secret_expires_at": ep.previous_secret_expires_at,
        "failing_since": ep.failing_since,
        "updated_at": ep.updated_at,
        "rate_limit": ep.rate_limit,
        "ordering": ep.ordering,
        "filter_flow_ids": ep.filter_flow_ids,
    }


async def insert_endpoint(conn: AsyncConnection, ep: Endpoint) -> None:
    await conn.execute(
        webhook_endpoints.insert().values(
            id=ep.id,
            workspace_id=ep.workspace_id,
            mode=str(ep.mode),
            created_at=ep.created_at,
            **_endpoint_values(ep, cipher(conn)),
        )
    )
    await conn.execute(
        endpoint_events.insert(), [{"endpoint_id": ep.id, "event": e} for e in ep.events]
    )


async def get_endpoint(
    conn: AsyncConnection,
    endpoint_id: str,
    workspace_id: str | None = None,
    mode: Mode | None = None,
) -> Endpoint | None:
    """The endpoint; scoped to a workspace and mode when they are given."""
    q = select(webhook_endpoints).where(_EP.id == endpoint_id)
    if workspace_id is not None:
        q = q.where(_EP.workspace_id == workspace_id, _EP.mode == str(mode))
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    return _endpoint(row, (await _events_of(conn, [row.id]))[row.id], cipher(conn))


async def list_endpoints(
    conn: AsyncConnection, workspace_id: str, mode: Mode, *, limit: int, after: str | None = None
) -> list[Endpoint]:
    q = page(webhook_endpoints, _EP.id, workspace_id, mode, limit=limit, after=after)
    rows = (await conn.execute(q)).all()
    chosen = await _events_of(conn, [r.id for r in rows])
    box = cipher(conn)
    return [_endpoint(r, chosen[r.id], box) for r in rows]


async def update_endpoint(conn: AsyncConnection, ep: Endpoint, *, events_changed: bool) -> None:
    await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == ep.id)
        .values(**_endpoint_values(ep, cipher(conn)))
    )
    if events_changed:
        await conn.execute(delete(endpoint_events).where(endpoint_events.c.endpoint_id == ep.id))
        await conn.execute(
            endpoint_events.insert(), [{"endpoint_id": ep.id, "event": e} for e in ep.events]
        )


async def delete_endpoint(
    conn: AsyncConnection, workspace_id: str, mode: Mode, endpoint_id: str
) -> bool:
    mine = owned(_EP.id, endpoint_id, workspace_id, mode)
    if (await conn.execute(select(_EP.id).where(mine))).first() is None:
        return False
    await conn.execute(delete(endpoint_events).where(endpoint_events.c.endpoint_id == endpoint_id))
    await conn.execute(delete(webhook_endpoints).where(mine))
    return True


@dataclass(frozen=True, slots=True)
class Subscriber:
    """An enabled endpoint that chose an event type, with what decides its deliveries."""

    endpoint_id: str
    event: str
    flow_ids: list[str] | None
    """Only events of these flows (``None``: every event)."""
    fifo: bool

    def wants(self, flow_id: str | None) -> bool:
        return self.flow_ids is None or flow_id in self.flow_ids


async def subscribers(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    event_types: Sequence[str],
    *,
    written: bulk.Insert | None = None,
) -> list[Subscriber]:
    """Every enabled endpoint that chose one of the types, once per type it chose.

    With a :class:`Handoff` in the transaction that has not looked at the queue yet, the
    same query asks whether a due delivery waits there (:meth:`Handoff.saw_queue`): the
    progress transaction then reaches its deliveries in one round trip fewer. ``written``
    (PostgreSQL): rows to insert in the same statement (the events whose subscribers these
    are, :func:`~flowhook.store.bulk.insert_then_read`), one round trip fewer again."""
    params: dict[str, Any] = {
        "workspace_id": workspace_id,
        "mode": str(mode),
        "events": sorted(set(event_types)),
    }
    tx = conn.info.get("tx")
    handoff: Handoff | None = tx.get(HANDOFF) if tx is not None else None
    if handoff is not None and (handoff.looked or handoff.full):
        handoff = None  # it has looked at the queue already, or takes no more
    if handoff is not None:
        params["now"] = handoff.now = handoff.now or handoff.clock()
    stmt = _subscribers_statement(handoff is not None)
    inline = bulk.inline_sqlite(conn)
    if inline is not None:  # in every transaction that writes events: straight to sqlite3
        rows = await bulk.run_raw(inline, stmt, params)
        found = [
            Subscriber(ep, event, None if flows is None else orjson.loads(flows), order == FIFO)
            for ep, event, flows, order, *_ in rows
        ]
    else:
        if written is None:
            rows = await bulk.run_pg(conn, stmt, params)
        else:
            rows = await bulk.insert_then_read(conn, written, stmt, params)
        found = [
            Subscriber(ep, event, flows, order == FIFO) for ep, event, flows, order, *_ in rows
        ]
    if handoff is not None and rows:  # no rows: nothing to deliver, the queue not read
        handoff.saw_queue(bool(rows[0][4]))
    return found


@cache
def _subscribers_statement(with_queue: bool) -> Any:
    """:func:`subscribers`' query, built once: its values are bound parameters. With
    ``with_queue``, a fifth column says whether a delivery is due at ``now`` (the
    statement of :func:`_waiting`, evaluated once for the query)."""
    columns: list[Any] = [
        endpoint_events.c.endpoint_id,
        endpoint_events.c.event,
        _EP.filter_flow_ids,
        _EP.ordering,
    ]
    if with_queue:
        columns.append(_waiting_statement().exists().label("waiting"))
    return (
        select(*columns)
        .join(webhook_endpoints, _EP.id == endpoint_events.c.endpoint_id)
        .where(
            _EP.workspace_id == bindparam("workspace_id", type_=_EP.workspace_id.type),
            _EP.mode == bindparam("mode", type_=_EP.mode.type),
            _EP.enabled.is_(True),
            endpoint_events.c.event.in_(bindparam("events", expanding=True)),
        )
    )


async def lock_endpoint(conn: AsyncConnection, endpoint_id: str) -> None:
    """Serialise the queueing and the ends of a FIFO endpoint's deliveries (a transaction
    -level advisory lock on PostgreSQL; SQLite has one writer)."""
    if conn.dialect.name == "postgresql":
        key = func.hashtextextended(f"flowhook.fifo:{endpoint_id}", 0)
        await conn.execute(select(func.pg_advisory_xact_lock(key)))


HANDOFF = "handoff"
"""The key of a transaction's :class:`Handoff` in ``conn.info["tx"]``."""


@dataclass(eq=False, slots=True)
class Handoff:
    """A dispatcher of this process taking new deliveries straight from the transaction that
    queues them (put it in ``conn.info["tx"][HANDOFF]``). :func:`insert_deliveries` asks
    ``room`` before it takes each one, writes the ones taken as a claim by ``owner`` would
    leave them (leased until ``now + lease``, one attempt counted, its line written) and
    reads what their attempts need into ``claimed``. Only once the transaction has committed
    may the dispatcher start them (if it rolled back, they were never written).

    Nothing is taken past the queue: not while a due delivery waits in it (looked up in the
    transaction, so one queued by anybody, or a retry that fell due, goes first), and once
    ``room`` refused one, none after it in the transaction. Deliveries to a FIFO endpoint are
    never taken: they wait their turn in the queue."""

    owner: str
    lease: timedelta
    clock: Callable[[], datetime]
    room: Callable[[str], bool]
    """Whether the dispatcher takes one more delivery to an endpoint (counting what this
    hand-off took already, in :attr:`taken`)."""
    now: datetime | None = None
    """When the deliveries taken were claimed (set as they are written)."""
    claimed: list[DueDelivery] = field(default_factory=list)
    taken: Counter[str] = field(default_factory=Counter)
    full: bool = False
    """Something went to the queue in this transaction: the rest go behind it."""
    looked: bool = False
    """The transaction has looked whether a due delivery waits in the queue."""

    def reset(self) -> None:
        """Forget what an earlier try of the transaction took (it rolled back)."""
        self.now = None
        self.claimed = []
        self.taken = Counter()
        self.full = False
        self.looked = False

    def saw_queue(self, waiting: bool) -> None:
        """The transaction looked at the queue (at :attr:`now`): a due delivery waits
        there, or none does."""
        self.looked = True
        if waiting:
            self.full = True

    def takes(self, endpoint_id: str) -> bool:
        if self.full or not self.room(endpoint_id):
            self.full = True
            return False
        self.taken[endpoint_id] += 1
        return True


async def insert_deliveries(
    conn: AsyncConnection, queued: Sequence[Delivery], *, fifo: Sequence[str] = ()
) -> None:
    """Queue deliveries; PostgreSQL listeners hear of them at commit. A delivery to an
    endpoint of ``fifo`` waits (due never, :data:`HELD`) while another of that endpoint is
    pending: the one that ends releases the next, in event order. With a :class:`Handoff`
    in the transaction, the deliveries it takes are written claimed by its dispatcher
    instead, and nobody is woken for them."""
    if not queued:
        return
    if fifo:
        queued = await _queue_in_order(conn, queued, set(fifo))
    tx = conn.info.get("tx")
    handoff: Handoff | None = tx.get(HANDOFF) if tx is not None else None
    rows = [d.to_row() for d in queued]
    taken: list[str] = []
    now: datetime | None = None
    if handoff is not None:
        now = handoff.now = handoff.now or handoff.clock()
        if not handoff.full and not handoff.looked:
            handoff.saw_queue(await _waiting(conn, now))
        ordered = set(fifo)
        until = now + handoff.lease
        for d, row in zip(queued, rows, strict=True):
            taken_here = d.endpoint_id not in ordered and handoff.takes(d.endpoint_id)
            if taken_here:
                taken.append(d.id)
            # one shape for every row: one statement
            row["attempts"] = 1 if taken_here else 0
            row["lease_owner"] = handoff.owner if taken_here else None
            row["lease_expires_at"] = until if taken_here else None
            if taken_here:
                row["next_attempt_at"] = until
    if handoff is None or now is None or not taken:  # (``now`` is set with a hand-off)
        await bulk.insert(conn, deliveries, rows)
    elif conn.dialect.name == "postgresql":  # the rows, attempt lines and reads: one trip
        handoff.claimed.extend(await _handoff_at_once(conn, rows, now))
    else:
        await bulk.insert(conn, deliveries, rows)
        # every attempt is logged before it is sent, as a claim logs it
        await bulk.insert(
            conn,
            delivery_attempts,
            [{"delivery_id": i, "number": 1, "started_at": now} for i in taken],
        )
        handoff.claimed.extend(await _due_of(conn, taken))
    if len(taken) < len(rows):
        await _wake(conn)


@cache
def _waiting_statement() -> Any:
    """A pending delivery due at ``now`` (one under a lease is due at its end, a FIFO
    endpoint's held one never): the partial index on ``next_attempt_at``, one entry read."""
    due = bindparam("now", type_=_D.next_attempt_at.type)
    return select(_D.id).where(_DUE, _D.next_attempt_at <= due).limit(1)


async def _waiting(conn: AsyncConnection, now: datetime) -> bool:
    """Whether a due delivery waits in the queue at ``now``."""
    inline = bulk.inline_sqlite(conn)
    if inline is not None:
        return bool(await bulk.run_raw(inline, _waiting_statement(), {"now": now}))
    return bool(await bulk.run_pg(conn, _waiting_statement(), {"now": now}))


async def _queue_in_order(
    conn: AsyncConnection, queued: Sequence[Delivery], fifo: set[str]
) -> list[Delivery]:
    out = list(queued)
    for endpoint_id in sorted({d.endpoint_id for d in queued} & fifo):
        await lock_endpoint(conn, endpoint_id)
        busy = await _pending_of(conn, endpoint_id)
        for i, d in enumerate(out):
            if d.endpoint_id != endpoint_id:
                continue
            if busy:
                out[i] = replace(d, next_attempt_at=HELD)
            busy = True
    return out


async def _pending_of(conn: AsyncConnection, endpoint_id: str) -> bool:
    q = select(_D.id).where(_D.endpoint_id == endpoint_id, _DUE).limit(1)
    return (await conn.execute(q)).first() is not None


async def release_next(conn: AsyncConnection, endpoint_id: str, now: datetime) -> str | None:
    """A FIFO endpoint's delivery ended: the oldest one it holds back becomes due, unless one
    is due already (an endpoint made FIFO with several in hand goes on until they are sent).
    Call after :func:`lock_endpoint`."""
    mine = (_D.endpoint_id == endpoint_id, _DUE)
    going = select(_D.id).where(*mine, _D.due_at != HELD).limit(1)
    if (await conn.execute(going)).first() is not None:
        return None
    oldest = select(_D.id).where(*mine).order_by(_D.created_at, _D.event_id, _D.id).limit(1)
    nxt = (await conn.execute(oldest)).scalar()
    if nxt is None:
        return None
    await conn.execute(
        update(deliveries).where(_D.id == nxt, _DUE).values(next_attempt_at=now, due_at=now)
    )
    await _wake(conn)
    return str(nxt)


async def release_all(conn: AsyncConnection, endpoint_id: str, now: datetime) -> None:
    """An endpoint is no longer FIFO: every delivery it held back is due now."""
    await conn.execute(
        update(deliveries)
        .where(_D.endpoint_id == endpoint_id, _DUE, _D.due_at == HELD)
        .values(next_attempt_at=now, due_at=now)
    )
    await _wake(conn)


async def _wake(conn: AsyncConnection) -> None:
    """Dispatchers hear of due deliveries at commit: this process's, and on PostgreSQL
    every other one's."""
    conn.info.setdefault("wake", set()).add("deliveries")
    if conn.dialect.name == "postgresql":
        await conn.execute(text(f"NOTIFY {DELIVERY_CHANNEL}"))


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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
)
_DUE_NAMES = tuple(c.key for c in _DUE_COLUMNS)
_CLAIMED_OWN = ("id", "event_id", "event_type", "endpoint_id", "attempts", "created_at", "run_id")
"""The columns of :data:`_DUE_COLUMNS` that are the delivery's own (read from the claim)."""
_DUE_TIMES = frozenset(("event_at", "previous_secret_expires_at", "failing_since", "created_at"))
"""Read as SQLite's text on the raw path, made aware datetimes there."""
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
    process left open is marked :data:`INTERRUPTED`.

    The per-endpoint ranking looks at the oldest due deliveries only (a window twice
    the batch, read in order from the partial index on ``due_at``, passing over the ones
    under a live lease), so a claim does not sort the whole backlog: with 5,000 due it took
    8 ms, most of the dispatcher's time.

    On PostgreSQL the claim is one statement, atomic on its own: ``conn`` may be in
    autocommit (:meth:`~flowhook.store.db.Database.statement`). On SQLite it is several, in
    ``conn``'s transaction.
    """
    if busy_endpoints:  # none due past the busy endpoints: nothing to rank (a cheap read)
        due = await next_due_delivery(conn, busy_endpoints)
        if due is None or due > now:
            return []
    if conn.dialect.name == "postgresql":
        window = _window(now, limit, per_endpoint, busy_endpoints)
        return await _claim_at_once(conn, {**window, "owner": owner, "lease_until": lease_until})
    ids = await _oldest_due(conn, now, limit, per_endpoint, busy_endpoints)
    if not ids:
        return []
    params = {"ids": ids, "now": now, "owner": owner, "lease_until": lease_until}
    inline = bulk.inline_sqlite(conn)
    if inline is not None:
        claimed: Sequence[Any] = await bulk.run_raw(inline, _claim_statement(), params)
    else:
        claimed = await bulk.run_pg(conn, _claim_statement(), params)
    if not claimed:
        return []
    claimed_ids = [r[0] for r in claimed]
    await _mark_interrupted(conn, [r[0] for r in claimed if r[1] > 1])
    # Every attempt is logged before it is sent: its line is written with the claim.
    await bulk.insert(
        conn,
        delivery_attempts,
        [{"delivery_id": r[0], "number": r[1], "started_at": now} for r in claimed],
    )
    return await _due_of(conn, claimed_ids)


async def _claim_at_once(conn: AsyncConnection, params: dict[str, Any]) -> list[DueDelivery]:
    """PostgreSQL: :func:`claim_deliveries` in one statement (:func:`_claim_at_once_statement`),
    so it is one round trip, and atomic on its own: the caller needs no transaction."""
    return await _due_rows(conn, _claim_at_once_statement("busy" in params), params)


async def _due_rows(conn: AsyncConnection, stmt: Any, params: dict[str, Any]) -> list[DueDelivery]:
    """PostgreSQL: ``stmt`` run (:func:`~flowhook.store.bulk.run_pg`), its rows of
    :data:`_DUE_COLUMNS` made deliveries to attempt."""
    rows = await bulk.run_pg(conn, stmt, params)
    box = cipher(conn)  # opened values are cached: an endpoint's secret is decrypted once
    return [DueDelivery.from_values(dict(zip(_DUE_NAMES, r, strict=True)), box) for r in rows]


async def _due_of(conn: AsyncConnection, ids: Sequence[str]) -> list[DueDelivery]:
    """What the attempts of the claimed deliveries ``ids`` need, oldest first."""
    box = cipher(conn)  # opened values are cached: an endpoint's secret is decrypted once
    inline = bulk.inline_sqlite(conn)
    if inline is not None:
        found = []
        for row in await bulk.run_raw(inline, _due_statement(), {"ids": ids}):
            values = dict(zip(_DUE_NAMES, row, strict=True))
            for name in _DUE_TIMES:
                values[name] = bulk.stored_datetime(values[name])
            found.append(DueDelivery.from_values(values, box))
        return found
    rows = await bulk.run_pg(conn, _due_statement(), {"ids": list(ids)})
    return [DueDelivery.from_values(dict(zip(_DUE_NAMES, r, strict=True)), box) for r in rows]


# The dispatcher claims many times a second: its statements are built once (per dialect,
# and per whether endpoints are left out), their values bound as parameters, so a claim
# pays neither the construction nor SQLAlchemy's cache key of a fresh statement; on SQLite
# they run straight on ``sqlite3`` (:func:`flowhook.store.bulk.run_raw`), on PostgreSQL
# through asyncpg with each list of ids one array (:func:`flowhook.store.bulk.run_pg`),
# compiled once.


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
    waited behind the dispatcher's busy event loop: ~21 ms a claim of 64 under load, the
    bound of PostgreSQL's deliveries/s.

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
        .values(error_class=INTERRUPTED, error_detail=_INTERRUPTED_DETAIL)
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
    """PostgreSQL: a hand-off's deliveries written (``columns``, one array parameter each:
    :func:`~flowhook.store.bulk.unnested`), the attempt line of each one taken (written with
    one attempt counted) logged, and what the taken ones' attempts need read, as
    :func:`_claim_at_once_statement` reads it: one round trip instead of three."""
    rows = bulk.unnested(deliveries, [(c, c) for c in columns])
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


async def _handoff_at_once(
    conn: AsyncConnection, rows: Sequence[dict[str, Any]], now: datetime
) -> list[DueDelivery]:
    """PostgreSQL: :func:`insert_deliveries`'s rows with a hand-off, in one statement
    (:func:`_handoff_statement`); what the taken ones' attempts need."""
    params = {**bulk.unnested_params(rows), "now": now}
    return await _due_rows(conn, _handoff_statement(tuple(rows[0])), params)


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


async def _oldest_due(
    conn: AsyncConnection,
    now: datetime,
    limit: int,
    per_endpoint: int,
    busy_endpoints: Sequence[str],
) -> list[str]:
    """The ids of up to ``limit`` due deliveries, oldest first, at most ``per_endpoint`` of
    any one endpoint and none of ``busy_endpoints`` (see :func:`claim_deliveries`)."""
    params = _window(now, limit, per_endpoint, busy_endpoints)
    stmt = _oldest_due_statement("busy" in params)
    inline = bulk.inline_sqlite(conn)
    if inline is not None:
        return [r[0] for r in await bulk.run_raw(inline, stmt, params)]
    return [r[0] for r in await bulk.run_pg(conn, stmt, params)]


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


async def reserve_send(conn: AsyncConnection, endpoint_id: str, now: datetime) -> datetime:
    """When a delivery to an endpoint with a ``rate_limit`` may be sent: the endpoint's next
    free time (``rate_next_at``, its row locked, so every dispatcher shares one schedule),
    which moves on by ``1 / rate_limit`` seconds; ``now`` for an endpoint without one."""
    q = select(_EP.rate_next_at, _EP.rate_limit).where(_EP.id == endpoint_id)
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    row = (await conn.execute(q)).first()
    if row is None or not row.rate_limit:
        return now
    slot = max(now, _aware(row.rate_next_at)) if row.rate_next_at else now
    await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == endpoint_id)
        .values(rate_next_at=slot + timedelta(seconds=1.0 / float(row.rate_limit)))
    )
    return slot


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
        .values(error_class=INTERRUPTED, error_detail=_INTERRUPTED_DETAIL)
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


@dataclass(frozen=True, slots=True)
class Completion:
    """How one attempt ended, and what becomes of its delivery."""

    delivery_id: str
    endpoint_id: str
    attempt: Attempt
    status: DeliveryStatus
    next_attempt_at: datetime | None
    last_error: str | None
    fifo: bool = False
    """Its endpoint is FIFO: a final outcome releases the next delivery."""


async def finish_attempts(
    conn: AsyncConnection,
    completions: Sequence[Completion],
    *,
    owner: str,
    healthy: Sequence[str] = (),
) -> list[str]:
    """Complete attempts' log lines and move their deliveries on (pending again, succeeded
    or failed), many in one transaction. Each move is guarded in SQL by the lease owner and
    the delivery's status (:data:`~flowhook.store.models.DELIVERY_TRANSITIONS`); a delivery
    the database refuses (its lease moved on: another process claimed it again) is left
    alone, its attempt's line still records what this attempt saw, and its id is returned,
    so the caller can tell that race was lost.

    Rows are written in ``delivery_id`` order: two processes finishing overlapping
    deliveries lock them in one order, never in opposite ones (the lock order rule).

    ``healthy``: endpoints whose failure windows end (:func:`mark_endpoints_healthy`), after
    the deliveries. On PostgreSQL, when no completion releases a FIFO endpoint's next
    delivery, the deliveries' move, the attempts' lines and the endpoints' health are one
    statement (:func:`~flowhook.store.bulk.update_each`'s ``beside``): one round trip where
    they took three."""
    if not completions:
        return []
    completions = sorted(completions, key=lambda c: c.delivery_id)
    logged = [
        (c.attempt.outcome(), {"delivery_id": c.delivery_id, "number": c.attempt.number})
        for c in completions
    ]
    by_guard: dict[str, list[Completion]] = {}
    for c in completions:  # one guard for all three moves today: the status is pending
        by_guard.setdefault(delivery_move(c.status), []).append(c)
    releases = any(c.fifo and c.status is not DeliveryStatus.PENDING for c in completions)
    beside: list[bulk.Beside] = []
    at_once = conn.dialect.name == "postgresql" and len(by_guard) == 1 and not releases
    if at_once:
        beside.append(bulk.update_beside(delivery_attempts, logged, "l"))
        if healthy:
            beside.append(bulk.Beside(_healthy_statement(), {"ids": sorted(healthy)}))
    lost: list[str] = []
    for guard, moving in by_guard.items():
        applied = await bulk.update_each(
            conn,
            deliveries,
            [(_moved(c), {"id": c.delivery_id, "lease_owner": owner}) for c in moving],
            guard=guard,
            ordered=True,
            beside=beside,
        )
        lost.extend(c.delivery_id for c, ok in zip(moving, applied, strict=True) if not ok)
    if at_once:
        return lost
    ended = {
        c.endpoint_id: c.attempt.finished_at or c.attempt.started_at
        for c in completions
        if c.fifo and c.status is not DeliveryStatus.PENDING and c.delivery_id not in lost
    }
    for endpoint_id in sorted(ended):  # the next in event order goes
        await lock_endpoint(conn, endpoint_id)
        await release_next(conn, endpoint_id, ended[endpoint_id])
    await bulk.update(conn, delivery_attempts, logged)
    await mark_endpoints_healthy(conn, healthy)
    return sorted(lost)


def _moved(c: Completion) -> dict[str, Any]:
    """The columns a completion writes into its delivery."""
    due = c.next_attempt_at or c.attempt.finished_at
    return {
        "status": str(c.status),
        "last_status_code": c.attempt.status_code,
        "last_error": c.last_error,
        "next_attempt_at": due,
        "due_at": due,
        "finished_at": None if c.status is DeliveryStatus.PENDING else c.attempt.finished_at,
        "lease_owner": None,
        "lease_expires_at": None,
    }


async def get_delivery(
    conn: AsyncConnection, workspace_id: str, mode: Mode, delivery_id: str
) -> Delivery | None:
    q = select(deliveries).where(owned(_D.id, delivery_id, workspace_id, mode))
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    found = Delivery.from_row(row)
    attempts_q = (
        select(delivery_attempts)
        .where(delivery_attempts.c.delivery_id == delivery_id)
        .order_by(delivery_attempts.c.number)
    )
    found.attempt_log = [Attempt.from_row(a) for a in (await conn.execute(attempts_q)).all()]
    return found


async def list_deliveries(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    *,
    limit: int,
    after: str | None = None,
    status: DeliveryStatus | None = None,
    endpoint_id: str | None = None,
    event_type: str | None = None,
    run_id: str | None = None,
) -> list[Delivery]:
    equal: dict[str, Any] = {"status": status, "endpoint_id": endpoint_id, "event_type": event_type}
    if run_id is None:
        q = page(deliveries, _D.id, workspace_id, mode, limit=limit, after=after, **equal)
    else:
        q = _of_run(workspace_id, mode, run_id, limit=limit, after=after, **equal)
    return [Delivery.from_row(r) for r in (await conn.execute(q)).all()]


def _of_run(
    workspace_id: str, mode: Mode, run_id: str, *, limit: int, after: str | None, **equal: Any
) -> Any:
    """:func:`list_deliveries` of one run: as :func:`page` would read them, but found through
    the run's events (a delivery's run is its event's; there is no index on run_id). The
    workspace is compared as ``coalesce(workspace_id, workspace_id)`` so that no index serves
    it (an expression, of the same type: ``|| ''`` made a packed id text): SQLite, which
    has no statistics to choose by, would otherwise read the workspace's deliveries newest
    first (the ORDER BY's index) down to the run's, every one of them for an old run."""
    q = (
        select(deliveries)
        .where(
            _D.event_id.in_(select(events.c.id).where(events.c.run_id == run_id)),
            _D.run_id == run_id,
            func.coalesce(_D.workspace_id, _D.workspace_id) == workspace_id,
            _D.mode == mode.value,
        )
        .order_by(_D.id.desc())
        .limit(limit)
    )
    if after is not None:
        q = q.where(_D.id < after)
    for name, value in equal.items():
        if value is not None:
            q = q.where(_D[name] == (value.value if isinstance(value, enum.Enum) else value))
    return q


async def failed_deliveries_between(
    conn: AsyncConnection,
    endpoint_id: str,
    since: datetime,
    until: datetime,
    *,
    after: str | None = None,
    limit: int = 200,
) -> list[Delivery]:
    """The endpoint's failed deliveries created in [since, until], by id, after ``after``."""
    q = (
        select(deliveries)
        .where(
            _D.endpoint_id == endpoint_id,
            _D.status == str(DeliveryStatus.FAILED),
            _D.created_at >= since,
            _D.created_at <= until,
        )
        .order_by(_D.id)
        .limit(limit)
    )
    if after is not None:
        q = q.where(_D.id > after)
    return [Delivery.from_row(r) for r in (await conn.execute(q)).all()]


async def events_in_hand(conn: AsyncConnection, endpoint_id: str, event_ids: set[str]) -> set[str]:
    """Which of ``event_ids`` have a delivery to the endpoint that did not fail (sent or
    on its way), so recovering them again would send them twice."""
    if not event_ids:
        return set()
    q = select(_D.event_id).where(
        _D.endpoint_id == endpoint_id,
        _D.event_id.in_(sorted(event_ids)),
        _D.status != str(DeliveryStatus.FAILED),
    )
    return set((await conn.execute(q)).scalars())


async def mark_endpoints_healthy(conn: AsyncConnection, endpoint_ids: Sequence[str]) -> None:
    """Record a success for each of ``endpoint_ids``: the failure window of any that had
    one ends. One statement for all (a group commit names every endpoint it delivered to;
    one statement each took a third of its time on PostgreSQL), locking only the endpoints
    it changes, in id order."""
    if not endpoint_ids:
        return
    params = {"ids": sorted(endpoint_ids)}
    inline = bulk.inline_sqlite(conn)
    if inline is not None:
        await bulk.run_raw(inline, _healthy_statement(), params)
    else:
        await bulk.run_pg(conn, _healthy_statement(), params)


@cache
def _healthy_statement() -> Any:
    """End the failure windows of ``ids``: the endpoints that have one are locked in id
    order first (the lock order rule: a plain ``UPDATE`` locks in the table's order)."""
    failing = (
        select(_EP.id)
        .where(_EP.id.in_(bindparam("ids", expanding=True)), _EP.failing_since.is_not(None))
        .order_by(_EP.id)
        .with_for_update(key_share=True)  # what the UPDATE takes: FOR NO KEY UPDATE
        .cte("failing")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    return (
        update(webhook_endpoints)
        .where(_EP.id.in_(select(failing.c.id)))
        .values(failing_since=null())
    )


async def mark_endpoint_health(
    conn: AsyncConnection,
    endpoint_id: str,
    *,
    succeeded: bool,
    now: datetime,
    disable_before: datetime,
) -> bool:
    """Record an outcome for the endpoint's health; ``True`` when this failure disabled it
    (nothing but failures since ``disable_before``)."""
    if succeeded:
        await mark_endpoints_healthy(conn, [endpoint_id])
        return False
    await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == endpoint_id, _EP.failing_since.is_(None))
        .values(failing_since=now)
    )
    result = await conn.execute(
        update(webhook_endpoints)
        .where(_EP.id == endpoint_id, _EP.enabled.is_(True), _EP.failing_since <= disable_before)
        .values(
            enabled=False,
            disabled_reason="disabled after failing without a success since "
            + "the failure window began; re-enable it and recover what failed",
            updated_at=now,
        )
    )
    return result.rowcount == 1


async def oldest_pending(conn: AsyncConnection) -> datetime | None:
    """When the oldest delivery still pending was created (for the age metric)."""
    value = (
        await conn.execute(
            select(func.min(_D.created_at)).where(_D.status == str(DeliveryStatus.PENDING))
        )
    ).scalar_one_or_none()
    if value is None:
        return None
    assert isinstance(value, datetime)
    return _aware(value)


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
    walked the busy endpoints' whole backlog (~1.5 ms with 30,000 behind a rate-limited
    endpoint, on every wake-up); the endpoint-by-endpoint read alone grew with the endpoints
    that have anything pending (~5 ms with 5,000 of them)."""
    busy = list(busy_endpoints)
    found = await _scalar(conn, _next_due_statement(bool(busy)), {"busy": busy} if busy else {})
    if found is None and busy:
        found = await _scalar(conn, _next_due_past_statement(), {"busy": busy})
    return found


async def _scalar(conn: AsyncConnection, stmt: Any, params: dict[str, Any]) -> datetime | None:
    """The one datetime (or NULL) ``stmt`` selects, aware, on either path."""
    inline = bulk.inline_sqlite(conn)
    if inline is not None:
        [(found,)] = await bulk.run_raw(inline, stmt, params)
        return bulk.stored_datetime(found)
    [(value,)] = await bulk.run_pg(conn, stmt, params)
    if value is None:
        return None
    assert isinstance(value, datetime)
    return _aware(value)


async def endpoint_stats(
    conn: AsyncConnection, endpoint_ids: Sequence[str], since: datetime
) -> dict[str, dict[str, int]]:
    """Deliveries per endpoint and status created since ``since``."""
    stats: dict[str, dict[str, int]] = {i: {} for i in endpoint_ids}
    if not endpoint_ids:
        return stats
    q = (
        select(_D.endpoint_id, _D.status, func.count())
        .where(_D.endpoint_id.in_(list(endpoint_ids)), _D.created_at >= since)
        .group_by(_D.endpoint_id, _D.status)
    )
    for endpoint_id, status, n in (await conn.execute(q)).all():
        stats[endpoint_id][status] = int(n)
    return stats
