"""``sqlite_driver.run_raw``: a statement built once, run straight on ``sqlite3`` with its values
converted as the store's types bind them on SQLite, lists expanded per length."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, bindparam, select
from sqlalchemy.exc import DBAPIError

from flowhook.store import sqlite_driver
from flowhook.store.sqlite_inline import InlineConnection
from flowhook.store.types import UTCDateTime, to_micros

metadata = MetaData()
things = Table(
    "things",
    metadata,
    Column("id", String, primary_key=True),
    Column("at", UTCDateTime),
    Column("on", Boolean),
    Column("n", Integer),
)
T0 = datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=UTC)


@pytest.fixture
def inline() -> InlineConnection:
    conn = InlineConnection(sqlite3.connect(":memory:", isolation_level=None), 1.0)
    conn.raw.execute('CREATE TABLE things (id TEXT PRIMARY KEY, at DATETIME, "on" BOOLEAN, n INT)')
    for i in range(5):  # stored as SQLAlchemy stores them (compared in test_bulk_insert.py)
        at = to_micros(T0 + timedelta(seconds=i))  # integer microseconds since the epoch
        conn.raw.execute("INSERT INTO things VALUES (?, ?, ?, ?)", (f"t{i}", at, i % 2, i))
    return conn


STMT = (
    select(things.c.id, things.c.at)
    .where(
        things.c.id.not_in(bindparam("skip", expanding=True)),
        things.c.at >= bindparam("since", type_=things.c.at.type),
        things.c.on == bindparam("on", type_=Boolean),
        things.c.n < 4,  # a value SQLAlchemy binds itself
    )
    .order_by(things.c.id)
    .limit(bindparam("limit", type_=Integer))
)


async def test_values_are_bound_as_stored_and_lists_expand_per_length(
    inline: InlineConnection,
) -> None:
    since = (T0 + timedelta(seconds=1)).astimezone(UTC)
    rows = await sqlite_driver.run_raw(
        inline, STMT, {"skip": ["t0"], "since": since, "on": True, "limit": 9}
    )
    t1, t3 = 1767268801000005, 1767268803000005  # 2026-01-01 12:00:01.000005, :03.000005
    assert rows == [("t1", t1), ("t3", t3)]
    assert sqlite_driver.stored_datetime(rows[0][1]) == T0 + timedelta(seconds=1)
    assert sqlite_driver.stored_datetime(rows[1][1]) == T0 + timedelta(seconds=3)
    fewer = {"skip": ["t0", "t1"], "since": since, "on": True, "limit": 9}
    assert await sqlite_driver.run_raw(inline, STMT, fewer) == [("t3", t3)]
    off = {"skip": ["x"], "since": T0, "on": False, "limit": 1}
    assert await sqlite_driver.run_raw(inline, STMT, off) == [("t0", 1767268800000005)]


async def test_errors_come_as_sqlalchemy_raises_them(inline: InlineConnection) -> None:
    with pytest.raises(ValueError, match="empty list"):
        await sqlite_driver.run_raw(inline, STMT, {"skip": [], "since": T0, "on": True, "limit": 1})
    inline.raw.execute("DROP TABLE things")
    with pytest.raises(DBAPIError):
        await sqlite_driver.run_raw(
            inline, STMT, {"skip": ["x"], "since": T0, "on": True, "limit": 1}
        )
