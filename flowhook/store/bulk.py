"""Many-row writes of the hot tables, and statements built once, on the connection's driver.

Every run writes about a dozen rows (itself, its steps, its events, their deliveries), and the
dispatcher claims many times a second: the store's modules write and run those statements
through here, and the backend's :class:`~flowhook.store.driver.Driver` (chosen by
:func:`~flowhook.store.driver.driver_of`) does each its own way, none of them choosing a
backend: :mod:`flowhook.store.sqlite_driver` straight on ``sqlite3``,
:mod:`flowhook.store.pg_driver` one statement for all the rows on asyncpg.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.driver import Attached, Beside, Insert, Pairs, driver_of

__all__ = ["insert", "update", "update_each", "rows", "insert_then_read"]


async def insert(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    *,
    update_on_conflict: Sequence[str] = (),
    channel: str | None = None,
    notice: str = "",
) -> None:
    """Insert ``rows`` (all with the same keys); with ``update_on_conflict`` (the key
    columns), a row whose key exists replaces that row's other columns. With ``channel``,
    ``NOTIFY channel, notice`` at commit where the backend tells other processes (in the
    insert's own statement: atomic on its own, one round trip)."""
    if rows:
        await driver_of(conn).insert(
            conn,
            table,
            rows,
            update_on_conflict=tuple(update_on_conflict),
            channel=channel,
            notice=notice,
        )


async def update(conn: AsyncConnection, table: Table, rows: Pairs) -> None:
    """``UPDATE table SET <values> WHERE <key columns = key values>`` for each (values, keys)
    pair of ``rows``; every pair names the same columns. Unguarded: for writes whose rows
    the caller already holds (an attempt's log line); state changes use :func:`update_each`."""
    if rows:
        await driver_of(conn).update(conn, table, rows)


async def update_each(
    conn: AsyncConnection,
    table: Table,
    rows: Pairs,
    *,
    guard: str | None = None,
    ordered: bool = False,
    attached: Attached | None = None,
    beside: Sequence[Beside] = (),
) -> list[bool]:
    """:func:`update` with a guard, telling for each row whether the database applied it.

    ``guard`` is a condition in SQL with no parameters (statuses written out, as the partial
    indexes want them), added to every row's key match; key columns that must match a value
    (the lease owner) go in the row's keys. Rows are updated in the order given where there
    is one writer; elsewhere, with ``ordered``, they are locked in the order of the first key
    column (the lock order rule), else the caller locks them first when the order matters.

    ``attached``: rows to insert with those the database applied (a run's steps with its
    move); with compound writes in the update's statement, one round trip for both.

    ``beside``: only with compound writes (the caller runs its own statements elsewhere):
    statements run after the update in its statement, one round trip for all. They need rows
    to update: without any, nothing runs, ``beside`` included."""
    if not rows:
        return []
    if attached is not None and not attached.rows:
        attached = None
    return await driver_of(conn).update_each(
        conn, table, rows, guard=guard, ordered=ordered, attached=attached, beside=beside
    )


async def rows(conn: AsyncConnection, stmt: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run ``stmt`` (a statement built once, its values all named bind parameters; a list
    for an ``expanding`` one) on the backend's own driver and return its rows as tuples of
    the values SQLAlchemy's types give (:meth:`~flowhook.store.driver.Driver.rows`)."""
    return await driver_of(conn).rows(conn, stmt, params)


async def insert_then_read(
    conn: AsyncConnection, written: Insert, query: Any, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """``written``'s rows inserted, then ``query``'s rows read; one statement where the
    backend has compound writes (:meth:`~flowhook.store.driver.Driver.insert_then_read`)."""
    return await driver_of(conn).insert_then_read(conn, written, query, params)
