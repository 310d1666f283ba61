"""``pg_driver.run_pg``: a statement built once, run on PostgreSQL through the driver with each
list bound as one array, gives the rows SQLAlchemy gives for the same statement and values
(ids unpacked, datetimes aware), whatever the lists' lengths, empty ones included."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    Table,
    bindparam,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from flowhook.store import pg_driver
from flowhook.store.db import Database
from flowhook.store.types import IdType, OptionalJSON, UTCDateTime

pytestmark = pytest.mark.postgres

metadata = MetaData()
things = Table(
    "run_pg_things",
    metadata,
    Column("id", IdType(), primary_key=True),
    Column("at", UTCDateTime),
    Column("on", Boolean),
    Column("n", Integer),
    Column("x", Float),
    Column("blob", LargeBinary),
    Column("parent", IdType()),
    Column("doc", OptionalJSON),
)
T0 = datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=UTC)
IDS = [f"dlv_{i:026d}" for i in range(6)]

_T = things.c
PICK = (
    select(_T.id, _T.at, _T.on, _T.n, _T.x, _T.blob, _T.parent)
    .where(
        _T.id.in_(bindparam("ids", expanding=True)),
        _T.parent.not_in(bindparam("skip", expanding=True)),
        _T.at >= bindparam("since", type_=_T.at.type),
        _T.n < 5,  # a value SQLAlchemy binds itself
    )
    .order_by(_T.id)
    .limit(bindparam("limit", type_=Integer))
)
# A CTE puts a later parameter first in the text: the values go by number, not by place.
_first = select(_T.id).where(_T.n >= bindparam("low", type_=Integer)).cte("first")
CTE = (
    select(func.count(), func.min(_T.at))
    .where(_T.id.in_(select(_first.c.id)), _T.id.in_(bindparam("ids", expanding=True)))
    .where(_T.n <= bindparam("high", type_=Integer))
)
MOVE = (
    update(things)
    .where(_T.id.in_(bindparam("ids", expanding=True)))
    .values(n=_T.n + 10, at=bindparam("at", type_=_T.at.type))
    .returning(_T.id, _T.n, _T.at)
)
TOUCH = update(things).where(_T.id.in_(bindparam("ids", expanding=True))).values(on=False)
CLEAR = (  # a None SQLAlchemy binds itself, beside a list used twice
    update(things)
    .where(_T.id.in_(bindparam("ids", expanding=True)), _T.parent.not_in(bindparam("ids")))
    .values(parent=None)
    .returning(_T.id, _T.parent)
)


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[Database]:
    db = Database(pg_url)
    async with db.transaction() as conn:
        await conn.run_sync(metadata.drop_all)
        await conn.run_sync(metadata.create_all)
        await conn.execute(
            things.insert(),
            [
                {
                    "id": IDS[i], "at": T0 + timedelta(seconds=i), "on": i % 2 == 0, "n": i,
                    "x": i / 4, "blob": bytes([i]) * 3, "parent": IDS[0] if i % 2 else None,
                    "doc": [["wf_a", "wf_b"], None, {"n": i}][i % 3],
                }
                for i in range(6)
            ],
        )  # fmt: skip
    try:
        yield db
    finally:
        async with db.transaction() as conn:
            await conn.run_sync(metadata.drop_all)
        await db.dispose()


async def _both(db: Database, stmt: Any, params: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The rows of ``run_pg`` and of SQLAlchemy, each in a transaction rolled back."""
    found = []
    for run in (pg_driver.run_pg, _through_sqlalchemy):
        try:
            async with db.transaction() as conn:
                found.append(await run(conn, stmt, params))
                raise _Undo
        except _Undo:
            pass
    return found[0], found[1]


class _Undo(Exception):
    pass


async def _through_sqlalchemy(conn: Any, stmt: Any, params: dict[str, Any]) -> list[Any]:
    result = await conn.execute(stmt, params)
    return [tuple(r) for r in result.all()] if result.returns_rows else []


@pytest.mark.parametrize(
    "params",
    [
        {"ids": IDS, "skip": ["dlv_x"], "since": T0, "limit": 9},
        {"ids": IDS[1:4], "skip": [IDS[0]], "since": T0 + timedelta(seconds=1), "limit": 9},
        {"ids": IDS[:1], "skip": ["dlv_x"], "since": T0, "limit": 1},
        {"ids": [], "skip": ["dlv_x"], "since": T0, "limit": 9},
        {"ids": IDS, "skip": [], "since": T0, "limit": 9},
    ],
)
async def test_rows_are_sqlalchemys_for_any_length_of_list(
    db: Database, params: dict[str, Any]
) -> None:
    fast, slow = await _both(db, PICK, params)
    assert fast == slow
    for row in fast:
        assert isinstance(row[0], str) and row[1].tzinfo is not None


async def test_a_statement_whose_text_numbers_its_values_out_of_order(db: Database) -> None:
    fast, slow = await _both(db, CTE, {"low": 2, "high": 4, "ids": IDS})
    assert fast == slow == [(3, T0 + timedelta(seconds=2))]


async def test_updates_with_and_without_returning(db: Database) -> None:
    at = T0 + timedelta(days=1)
    fast, slow = await _both(db, MOVE, {"ids": IDS[2:4], "at": at})
    assert sorted(fast) == sorted(slow) == [(IDS[2], 12, at), (IDS[3], 13, at)]
    async with db.transaction() as conn:
        assert await pg_driver.run_pg(conn, TOUCH, {"ids": IDS[:2]}) == []
        assert (await conn.execute(select(_T.on).where(_T.id == IDS[0]))).scalar() is False


async def test_an_array_value_is_one_value_not_a_list_to_expand(db: Database) -> None:
    numbers = select(func.unnest(bindparam("xs", type_=ARRAY(Integer)), type_=Integer))
    async with db.read() as conn:
        assert await pg_driver.run_pg(conn, numbers, {"xs": [3, 1, 2]}) == [(3,), (1,), (2,)]


async def test_a_none_sqlalchemy_binds_itself_and_a_list_used_twice(db: Database) -> None:
    fast, slow = await _both(db, CLEAR, {"ids": [IDS[1], IDS[3]]})
    assert sorted(fast) == sorted(slow) == [(IDS[1], None), (IDS[3], None)]


async def test_json_reads_as_sqlalchemys(db: Database) -> None:
    docs = select(_T.id, _T.doc).where(_T.id.in_(bindparam("ids", expanding=True)))
    fast, slow = await _both(db, docs.order_by(_T.id), {"ids": IDS})
    assert fast == slow
    assert [doc for _, doc in fast[:3]] == [["wf_a", "wf_b"], None, {"n": 2}]


async def test_rows_written_as_one_array_per_column(db: Database) -> None:
    rows = [
        {
            "id": f"dlv_{i:026d}", "at": T0 + timedelta(microseconds=i), "on": i % 2 == 0,
            "n": i, "x": 0.5, "blob": bytes([i]), "parent": IDS[i % 2] if i % 3 else None,
            "doc": [[i], {"i": i}, None, [{"j": i}, "k"]][i % 4],
        }
        for i in range(12, 16)
    ]  # fmt: skip
    # a list first: one JSON value, not a second dimension of the array
    v = pg_driver.unnested(things, [(c, c) for c in rows[0]])
    write = things.insert().from_select(list(rows[0]), select(*(v.c[c] for c in rows[0])))
    async with db.transaction() as conn:
        assert await pg_driver.run_pg(conn, write, pg_driver.unnested_params(rows)) == []
        found = await conn.execute(select(things).where(_T.n >= 10).order_by(_T.id))
        empty = select(func.count()).where(_T.n >= 10, _T.doc.is_(None))
        assert (await conn.execute(empty)).scalar() == 1  # SQL NULL, not JSON null
    assert [dict(r._mapping) for r in found] == rows


def test_a_column_read_with_no_known_reading_fails_the_plan() -> None:
    other = Table("run_pg_other", MetaData(), Column("id", Integer), Column("amount", Numeric))
    from sqlalchemy.dialects.postgresql import asyncpg

    with pytest.raises(TypeError, match="no reading known"):
        pg_driver._pg_raw_plan(select(other.c.amount), asyncpg.dialect())
