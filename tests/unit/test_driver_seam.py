"""The driver seam (flowhook/store/driver.py): which driver a database gets, and what each
driver does of its own (its readings, its telling of duplicates, its quirks' SQL). The
store's integration tests, run on both backends, are the drivers' conformance suite; these
are the parts with logic of their own."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import orjson
import pytest
import sqlalchemy.exc as sa_exc
from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from flowhook.config import database_backend
from flowhook.errors import Duplicate
from flowhook.store import sqlite_inline
from flowhook.store.db import DuplicateRow, _translated
from flowhook.store.driver import Driver, driver_for_url, driver_named
from flowhook.store.pg_driver import PostgresDriver
from flowhook.store.sqlite_driver import SQLiteDriver
from flowhook.store.types import IdType, JSONType, OptionalJSON, UTCDateTime

metadata = MetaData()
things = Table(
    "things",
    metadata,
    Column("id", IdType(), primary_key=True),
    Column("at", UTCDateTime()),
    Column("body", JSONType),
    Column("maybe", OptionalJSON),
    Column("on", Boolean),
    Column("n", Integer),
    Column("label", String(20), nullable=False),
)
T0 = datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=UTC)
SQLITE, POSTGRES = SQLiteDriver(), PostgresDriver()


@pytest.mark.parametrize(
    ("url", "name", "engine_url"),
    [
        ("sqlite:///./x.db", "sqlite", "sqlite+aiosqlite:///./x.db"),
        ("sqlite+aiosqlite:////tmp/x.db", "sqlite", "sqlite+aiosqlite:////tmp/x.db"),
        ("postgresql://u@h:5432/db", "postgresql", "postgresql+asyncpg://u@h:5432/db"),
        ("postgres://u@h/db", "postgresql", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_a_url_chooses_its_driver_once(url: str, name: str, engine_url: str) -> None:
    driver = driver_for_url(url)
    assert driver.name == database_backend(url) == name
    assert driver is driver_named(name)  # one instance per backend
    assert driver.engine_url(url) == engine_url


@pytest.mark.parametrize("url", ["mysql://u@h/db", "not a url"])
def test_a_url_of_no_backend_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="database"):
        driver_for_url(url)


@pytest.mark.parametrize(
    ("driver", "expected"),
    [(SQLITE, (True, False, False, True)), (POSTGRES, (False, True, True, False))],
)
def test_each_driver_names_its_capabilities(
    driver: Driver, expected: tuple[bool, bool, bool, bool]
) -> None:
    found = (
        driver.one_writer,
        driver.tells_other_processes,
        driver.compound_writes,
        driver.shrinks_its_file,
    )
    assert found == expected


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    url = sqlite_inline.engine_url(f"sqlite:///{tmp_path / 'rows.db'}")
    made = create_async_engine(url, json_deserializer=orjson.loads)
    async with made.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.execute(
            things.insert(),
            [
                {"id": "thg_a", "at": T0, "body": {"x": [1, None]}, "maybe": None, "on": True,
                 "n": 1, "label": "a"},
                {"id": "thg_b", "at": None, "body": None, "maybe": ["y"], "on": False,
                 "n": None, "label": "b"},
            ],
        )  # fmt: skip
    yield made
    await made.dispose()


async def test_sqlite_rows_are_what_sqlalchemy_reads(engine: AsyncEngine) -> None:
    """Straight on ``sqlite3``, each value read as SQLAlchemy's own execution reads it: ids
    unpacked, timestamps aware, JSON parsed (``null`` text and SQL ``NULL`` both None),
    booleans ``bool``."""
    stmt = (
        select(*things.c)
        .where(things.c.id.in_(bindparam("ids", expanding=True)))
        .order_by(things.c.id)
    )
    params = {"ids": ["thg_a", "thg_b"]}
    async with engine.connect() as conn:
        via_driver = await SQLITE.rows(conn, stmt, params)
        via_sqlalchemy = [tuple(r) for r in (await conn.execute(stmt, params)).all()]
    assert via_driver == via_sqlalchemy
    assert via_driver[0] == ("thg_a", T0, {"x": [1, None]}, None, True, 1, "a")
    assert via_driver[1][4] is False and via_driver[1][3] == ["y"]


def _sqlite_error(statement: str) -> sa_exc.DBAPIError:
    raw = sqlite3.connect(":memory:")
    raw.execute("CREATE TABLE t (k TEXT PRIMARY KEY, u TEXT UNIQUE, v TEXT NOT NULL)")
    raw.execute("INSERT INTO t VALUES ('a', 'x', 'v')")
    try:
        raw.execute(statement)
    except sqlite3.Error as exc:
        return sa_exc.DBAPIError.instance(statement, None, exc, sqlite3.Error)
    raise AssertionError(f"{statement} was not refused")


def _pg_error(cause: Exception) -> sa_exc.IntegrityError:
    """An IntegrityError caused by ``cause``, as SQLAlchemy's asyncpg dialect raises one."""
    try:
        try:
            raise cause
        except asyncpg.PostgresError as exc:
            raise sa_exc.IntegrityError("INSERT …", None, Exception(str(exc))) from exc
    except sa_exc.IntegrityError as wrapped:
        return wrapped


def test_a_duplicate_is_told_from_other_integrity_errors() -> None:
    assert SQLITE.is_duplicate(_sqlite_error("INSERT INTO t VALUES ('a', 'y', 'v')"))
    assert SQLITE.is_duplicate(_sqlite_error("INSERT INTO t VALUES ('b', 'x', 'v')"))
    assert not SQLITE.is_duplicate(_sqlite_error("INSERT INTO t VALUES ('c', 'z', NULL)"))
    assert POSTGRES.is_duplicate(_pg_error(asyncpg.exceptions.UniqueViolationError("dup")))
    assert not POSTGRES.is_duplicate(_pg_error(asyncpg.exceptions.NotNullViolationError("x")))


async def test_the_store_raises_a_duplicate_that_is_still_the_drivers_error() -> None:
    """Above the store it is a :class:`Duplicate`; to code written against the driver (the
    store's own tests) still the ``IntegrityError`` it was."""
    duplicate = _sqlite_error("INSERT INTO t VALUES ('a', 'y', 'v')")
    with pytest.raises(Duplicate) as caught:
        async with _translated(SQLITE):
            raise duplicate
    assert isinstance(caught.value, DuplicateRow)
    assert isinstance(caught.value, sa_exc.IntegrityError)
    assert caught.value.code == "duplicate" and "UNIQUE constraint failed" in str(caught.value)
    missing = _sqlite_error("INSERT INTO t VALUES ('c', 'z', NULL)")
    with pytest.raises(sa_exc.IntegrityError) as caught:
        async with _translated(SQLITE):
            raise missing
    assert not isinstance(caught.value, Duplicate)


SQLITE_DIALECT = sqlite.dialect()
POSTGRES_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def _sql(stmt: object, driver: Driver) -> str:
    dialect = SQLITE_DIALECT if driver is SQLITE else POSTGRES_DIALECT
    return str(stmt.compile(dialect=dialect))  # type: ignore[attr-defined]


def test_the_quirks_are_each_backends_sql() -> None:
    q = select(things.c.id).where(things.c.n > 0)
    assert "FOR UPDATE" not in _sql(SQLITE.locking(q, skip_locked=True), SQLITE)
    assert "FOR UPDATE SKIP LOCKED" in _sql(POSTGRES.locking(q, skip_locked=True), POSTGRES)
    one_of = select(things.c.id).where
    assert "IN (__[POSTCOMPILE_ids])" in _sql(one_of(SQLITE.one_of(things.c.id, "ids")), SQLITE)
    assert "= ANY (" in _sql(one_of(POSTGRES.one_of(things.c.id, "ids")), POSTGRES)
    assert "max(things.n, " in _sql(select(SQLITE.greatest(things.c.n, 0)), SQLITE)
    assert "greatest(things.n, " in _sql(select(POSTGRES.greatest(things.c.n, 0)), POSTGRES)
    since_sqlite = _sql(select(SQLITE.milliseconds_since(T0, things.c.at)), SQLITE)
    assert "things.at" in since_sqlite and "/ " in since_sqlite  # integer microseconds
    since_pg = _sql(select(POSTGRES.milliseconds_since(T0, things.c.at)), POSTGRES)
    assert "EXTRACT(epoch FROM" in since_pg
    assert "ON CONFLICT" in _sql(
        SQLITE.upsert(things).values(id="x").on_conflict_do_nothing(), SQLITE
    )
