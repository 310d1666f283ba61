"""The state machines' guards, as the SQL every state change carries.

A move is legal when :data:`~flowhook.store.models.TRANSITIONS` (runs) or
:data:`~flowhook.store.models.DELIVERY_TRANSITIONS` (deliveries) allows it; these functions
turn the tables into the ``WHERE`` conditions of the statements that move rows, so the
database itself refuses an illegal move. Statuses are written out, not bound: SQLite uses a
partial index (``ix_runs_claimable``, ``ix_deliveries_due_at``) only when a query states its
condition literally (with ``IN (?, ?)`` a claim scanned every run; figures in
bench/README.md), and so do PostgreSQL's generic plans. So the partial indexes of
:mod:`flowhook.store.tables` take their predicates from here too (:data:`ACTIVE_RUN_INDEX`,
:func:`held_is`, ...): the term a query states and its index's cannot drift apart.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from functools import lru_cache

from flowhook.store.models import (
    DELIVERY_TRANSITIONS,
    TRANSITIONS,
    DeliveryStatus,
    Held,
    RunStatus,
    active,
    sources,
)

__all__ = [
    "status_in",
    "held_is",
    "ACTIVE_RUN",
    "PENDING_DELIVERY",
    "ACTIVE_RUN_INDEX",
    "PENDING_DELIVERY_INDEX",
    "run_move",
    "delivery_move",
]


def status_in(table: str | None, statuses: Iterable[enum.StrEnum]) -> str:
    """``<table>.status IN ('a', 'b')``, ``<table>.status = 'a'`` for one status, or a
    condition no row meets when there are none; ``table=None``: the bare column, as a partial
    index states it.

    One status is written with ``=``: SQLite uses a partial index only when the query's
    WHERE has the index's own term, and takes ``status IN ('pending')`` for another term
    than the ``status = 'pending'`` of ``ix_deliveries_due``. Written as IN, the dispatcher's
    "when is the next delivery due" read scanned every delivery ever kept (figures in
    bench/README.md)."""
    column = "status" if table is None else f"{table}.status"
    values = [f"'{s.value}'" for s in statuses]
    if len(values) == 1:
        return f"{column} = {values[0]}"
    return f"{column} IN ({', '.join(values)})" if values else "1 = 0"


def held_is(reason: Held, table: str | None = None) -> str:
    """``<table>.held = '<reason>'``: the runs flow control holds back for ``reason``."""
    column = "held" if table is None else f"{table}.held"
    return f"{column} = '{reason.value}'"


ACTIVE_RUN = status_in("runs", active(TRANSITIONS))
"""A run some move still leaves: queued or running (the queue, and what a cancel can stop)."""

PENDING_DELIVERY = status_in("deliveries", active(DELIVERY_TRANSITIONS))
"""A delivery still to be sent."""

ACTIVE_RUN_INDEX = status_in(None, active(TRANSITIONS))
""":data:`ACTIVE_RUN` as the partial indexes of the queue state it (``ix_runs_claimable``)."""

PENDING_DELIVERY_INDEX = status_in(None, active(DELIVERY_TRANSITIONS))
""":data:`PENDING_DELIVERY` as the partial indexes of due deliveries state it."""


@lru_cache(maxsize=32)
def run_move(path: tuple[RunStatus, ...], *, honour_cancel: bool) -> str:
    """The guard of a write that moves a run through ``path`` (each status in turn): its
    status is one every move of the path is legal from, and, with ``honour_cancel``, nobody
    asked to cancel it. The lease owner is matched as a key by the caller."""
    guard = status_in("runs", sources(TRANSITIONS, *path))
    return f"{guard} AND runs.cancel_requested_at IS NULL" if honour_cancel else guard


@lru_cache(maxsize=8)
def delivery_move(target: DeliveryStatus) -> str:
    """The guard of a write that moves a delivery to ``target``."""
    return status_in("deliveries", sources(DELIVERY_TRANSITIONS, target))
