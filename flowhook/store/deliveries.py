"""Deliveries queued: an event's fan-out to the endpoints that chose it, FIFO endpoints'
order, and the hand-off of new deliveries to a dispatcher of the same process.

A delivery queued by the engine's progress transaction may skip the queue's claim: when the
transaction is given a :class:`Handoff` from a dispatcher in the same process that has room
(and no backlog to honour first), the delivery is written already claimed by that dispatcher,
its first attempt's line with it, exactly as a claim would have left it, and the dispatcher
starts it once the transaction has committed (see :func:`insert_deliveries`). The queue and
its claims are :mod:`flowhook.store.delivery_queue`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.delivery_queue import DueDelivery, insert_claimed
from flowhook.store.driver import Insert, driver_of
from flowhook.store.guards import PENDING_DELIVERY
from flowhook.store.models import Delivery, Mode
from flowhook.store.tables import deliveries, endpoint_events, webhook_endpoints
from flowhook.store.types import HELD
from flowhook.store.wakeup import wake_at_commit

__all__ = [
    "DELIVERY_CHANNEL",
    "FIFO",
    "Subscriber",
    "subscribers",
    "Handoff",
    "insert_deliveries",
    "lock_endpoint",
    "release_next",
    "release_all",
]

DELIVERY_CHANNEL = "flowhook_deliveries"
FIFO = "fifo"
"""An endpoint's ``ordering`` that sends its deliveries one at a time, in event order."""

_EP = webhook_endpoints.c
_D = deliveries.c
_DUE = text(PENDING_DELIVERY)
"""Pending (written out, see :mod:`flowhook.store.guards`)."""


@dataclass(frozen=True, slots=True)
class Subscriber:
    """An enabled endpoint that chose an event type, with what decides its deliveries."""

    endpoint_id: str
    event: str
    flow_ids: list[str] | None
    """Only events of these flows (``None``: every event)."""
    fifo: bool
    paused: bool = False
    """Paused when the fan-out read it: its deliveries are queued held (see
    :func:`insert_deliveries`)."""

    def wants(self, flow_id: str | None) -> bool:
        return self.flow_ids is None or flow_id in self.flow_ids


async def subscribers(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    event_types: Sequence[str],
    *,
    written: Insert | None = None,
    handoff: Handoff | None = None,
) -> list[Subscriber]:
    """Every enabled endpoint that chose one of the types, once per type it chose.

    With a ``handoff`` that has not looked at the queue yet, the same query asks whether a
    due delivery waits there (:meth:`Handoff.saw_queue`): the progress transaction then
    reaches its deliveries in one round trip fewer. ``written``: rows to insert first (the
    events whose subscribers these are), in the same statement with compound writes
    (:func:`~flowhook.store.bulk.insert_then_read`), one round trip fewer again."""
    params: dict[str, Any] = {
        "workspace_id": workspace_id,
        "mode": str(mode),
        "events": sorted(set(event_types)),
    }
    if handoff is not None and (handoff.looked or handoff.full):
        handoff = None  # it has looked at the queue already, or takes no more
    if handoff is not None:
        params["now"] = handoff.now = handoff.now or handoff.clock()
    stmt = _subscribers_statement(handoff is not None)
    if written is None:
        rows = await bulk.rows(conn, stmt, params)
    else:
        rows = await bulk.insert_then_read(conn, written, stmt, params)
    found = [
        Subscriber(ep, event, flows, order == FIFO, paused is not None)
        for ep, event, flows, order, paused, *_ in rows
    ]
    if handoff is not None and rows:  # no rows: nothing to deliver, the queue not read
        handoff.saw_queue(bool(rows[0][5]))
    return found


@cache
def _subscribers_statement(with_queue: bool) -> Any:
    """:func:`subscribers`' query, built once: its values are bound parameters. With
    ``with_queue``, a sixth column says whether a delivery is due at ``now`` (the
    statement of :func:`_waiting`, evaluated once for the query)."""
    columns: list[Any] = [
        endpoint_events.c.endpoint_id,
        endpoint_events.c.event,
        _EP.filter_flow_ids,
        _EP.ordering,
        _pause_column(),
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


def _pause_column() -> Any:
    """The endpoint's ``paused_at``, as the fan-out reads it (tests that write rows at a
    revision from before endpoints had one read ``NULL`` here instead)."""
    return _EP.paused_at


async def lock_endpoint(conn: AsyncConnection, endpoint_id: str) -> None:
    """Serialise the queueing and the ends of a FIFO endpoint's deliveries (a transaction
    -level advisory lock where the backend has more than one writer)."""
    await driver_of(conn).lock(conn, f"flowhook.fifo:{endpoint_id}")


@dataclass(eq=False, slots=True)
class Handoff:
    """A dispatcher of this process taking new deliveries straight from the transaction that
    queues them (passed to :func:`insert_deliveries`, and to the writes that call it:
    ``apply_progress``, ``insert_events``). :func:`insert_deliveries` asks ``room`` before
    it takes each one, writes the ones taken as a claim by ``owner`` would
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
    conn: AsyncConnection,
    queued: Sequence[Delivery],
    *,
    fifo: Sequence[str] = (),
    paused: Sequence[str] = (),
    handoff: Handoff | None = None,
) -> None:
    """Queue deliveries; other processes' dispatchers hear of them at commit. A delivery to
    an endpoint of ``fifo`` waits (due never, :data:`~flowhook.store.types.HELD`) while
    another of that endpoint is pending: the one that ends releases the next, in event
    order. A delivery to an endpoint of ``paused`` that is still paused (read again under
    its lock, which its resume takes too: a resume is never missed) is held, due never but
    keeping when it fell due, until the resume. With a ``handoff``, the deliveries it takes
    are written claimed by its dispatcher instead
    (:func:`~flowhook.store.delivery_queue.insert_claimed`), and nobody is woken for them."""
    if not queued:
        return
    present = {d.endpoint_id for d in queued}
    fifo, paused = sorted(present.intersection(fifo)), sorted(present.intersection(paused))
    for endpoint_id in sorted({*fifo, *paused}):  # the lock order rule: by id
        await lock_endpoint(conn, endpoint_id)
    if fifo:
        queued = await _queue_in_order(conn, queued, set(fifo))
    rows = [d.to_row() for d in queued]
    holding = await _still_paused(conn, paused) if paused else set()
    if holding:
        for d, row in zip(queued, rows, strict=True):
            if d.endpoint_id in holding:
                row["next_attempt_at"] = HELD
    taken: list[str] = []
    if handoff is not None:
        taken = await _take(conn, handoff, queued, rows, set(fifo) | holding)
    if handoff is None or handoff.now is None or not taken:  # (``now`` is set with a hand-off)
        await bulk.insert(conn, deliveries, rows)
    else:
        handoff.claimed.extend(await insert_claimed(conn, rows, taken, handoff.now))
    if len(taken) < len(rows):
        await _wake(conn)


async def _take(
    conn: AsyncConnection,
    handoff: Handoff,
    queued: Sequence[Delivery],
    rows: list[dict[str, Any]],
    ordered: set[str],
) -> list[str]:
    """The ids of the deliveries ``handoff`` takes (never one of ``ordered``: a FIFO or
    paused endpoint's), their ``rows``
    made what a claim by its dispatcher would leave: leased until ``now + lease``, one
    attempt counted. Every row keeps one shape, so all are one statement."""
    now = handoff.now = handoff.now or handoff.clock()
    if not handoff.full and not handoff.looked:
        handoff.saw_queue(await _waiting(conn, now))
    until = now + handoff.lease
    taken: list[str] = []
    for d, row in zip(queued, rows, strict=True):
        taken_here = d.endpoint_id not in ordered and handoff.takes(d.endpoint_id)
        if taken_here:
            taken.append(d.id)
        row["attempts"] = 1 if taken_here else 0
        row["lease_owner"] = handoff.owner if taken_here else None
        row["lease_expires_at"] = until if taken_here else None
        if taken_here:
            row["next_attempt_at"] = until
    return taken


@cache
def _waiting_statement() -> Any:
    """A pending delivery due at ``now`` (one under a lease is due at its end, a FIFO
    endpoint's held one never): the partial index on ``next_attempt_at``, one entry read."""
    due = bindparam("now", type_=_D.next_attempt_at.type)
    return select(_D.id).where(_DUE, _D.next_attempt_at <= due).limit(1)


async def _waiting(conn: AsyncConnection, now: datetime) -> bool:
    """Whether a due delivery waits in the queue at ``now``."""
    return bool(await bulk.rows(conn, _waiting_statement(), {"now": now}))


async def _queue_in_order(
    conn: AsyncConnection, queued: Sequence[Delivery], fifo: set[str]
) -> list[Delivery]:
    """``queued`` with every FIFO endpoint's delivery but its first held behind the one
    pending. Call with the endpoints locked (:func:`lock_endpoint`)."""
    out = list(queued)
    for endpoint_id in sorted({d.endpoint_id for d in queued} & fifo):
        busy = await _pending_of(conn, endpoint_id)
        for i, d in enumerate(out):
            if d.endpoint_id != endpoint_id:
                continue
            if busy:
                out[i] = replace(d, next_attempt_at=HELD)
            busy = True
    return out


async def _still_paused(conn: AsyncConnection, endpoint_ids: Sequence[str]) -> set[str]:
    """Which of ``endpoint_ids`` are paused, read after their locks were taken."""
    q = select(_EP.id).where(_EP.id.in_(sorted(endpoint_ids)), _EP.paused_at.is_not(None))
    return set((await conn.execute(q)).scalars())


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
    """Dispatchers hear of due deliveries at commit: this process's, and where the backend
    tells them, every other one's."""
    await wake_at_commit(conn, "deliveries", DELIVERY_CHANNEL)
