"""Attempts completed: an attempt's log line finished and its delivery moved on (pending
again, succeeded or failed), many in one transaction. How an attempt ended is
:class:`~flowhook.store.error_classes.ErrorClass`; the claim that starts one is
:mod:`flowhook.store.delivery_queue`'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store import bulk
from flowhook.store.deliveries import lock_endpoint, release_next
from flowhook.store.driver import Beside, driver_of
from flowhook.store.endpoints import healthy_beside, mark_endpoints_healthy
from flowhook.store.guards import delivery_move
from flowhook.store.models import Attempt, DeliveryStatus
from flowhook.store.pg_driver import update_beside
from flowhook.store.tables import deliveries, delivery_attempts

__all__ = ["Completion", "finish_attempts"]


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

    ``healthy``: endpoints whose failure windows end
    (:func:`~flowhook.store.endpoints.mark_endpoints_healthy`), after the deliveries. With
    compound writes, when no completion releases a FIFO endpoint's next delivery, the
    deliveries' move, the attempts' lines and the endpoints' health are one statement
    (:func:`~flowhook.store.bulk.update_each`'s ``beside``): one round trip where they took
    three."""
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
    beside: list[Beside] = []
    at_once = driver_of(conn).compound_writes and len(by_guard) == 1 and not releases
    if at_once:
        beside.append(update_beside(delivery_attempts, logged, "l"))
        if healthy:
            beside.append(healthy_beside(healthy))
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
