"""The contract between the inline SQLite driver (flowhook/store/sqlite_inline.py) and the
SQLAlchemy internals it builds on. An upgrade of SQLAlchemy that changes them fails here, with
a message saying what changed and what to review, rather than somewhere deep in a transaction."""

from __future__ import annotations

import inspect
import sqlite3
import tomllib
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import pytest
import sqlalchemy.exc as sa_exc
from packaging.requirements import Requirement
from sqlalchemy import event, text
from sqlalchemy.connectors.asyncio import AsyncAdapt_dbapi_connection
from sqlalchemy.dialects.sqlite import aiosqlite as sa_aiosqlite
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from flowhook.store import sqlite_driver, sqlite_inline
from flowhook.store.sqlite_inline import InlineConnection, SQLiteDialect_inline

ROOT = Path(__file__).resolve().parents[2]

REVIEW = (
    "SQLAlchemy {version} changed what flowhook's inline SQLite driver relies on: {what}. "
    "Review flowhook/store/sqlite_inline.py (_Adapter, _DBAPI, SQLiteDialect_inline) against "
    "sqlalchemy/dialects/sqlite/aiosqlite.py and sqlalchemy/connectors/asyncio.py, then update "
    "this test and the pin in pyproject.toml."
)

# What SQLAlchemy 2.1's aiosqlite classes define themselves. _Adapter overrides the members
# that touched aiosqlite's private attributes; the others only await public coroutine methods.
KNOWN = {
    sa_aiosqlite.AsyncAdapt_aiosqlite_connection: {
        "_cursor_cls", "_ss_cursor_cls", "_handle_exception_no_connection",
        "_terminate_force_close", "_terminate_graceful_close",
        "close", "commit", "create_function", "isolation_level", "rollback",
    },
    sa_aiosqlite.AsyncAdapt_aiosqlite_dbapi: {"_init_dbapi_attributes", "connect"},
    sa_aiosqlite.SQLiteDialect_aiosqlite: {
        "do_terminate", "driver", "execution_ctx_cls", "get_driver_connection",
        "get_pool_class", "has_terminate", "import_dbapi", "is_async", "is_disconnect",
        "retrieve_dbapi_version", "supports_server_side_cursors", "supports_statement_cache",
    },
}  # fmt: skip


def _review(what: str) -> str:
    return REVIEW.format(version=version("sqlalchemy"), what=what)


def test_the_installed_sqlalchemy_is_in_the_tested_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pin = next(r for r in map(Requirement, project["dependencies"]) if r.name == "sqlalchemy")
    assert any(s.operator == "<" for s in pin.specifier), "SQLAlchemy needs an upper bound"
    installed = version("sqlalchemy")
    assert pin.specifier.contains(installed), _review(f"it is outside the pin {pin.specifier}")


@pytest.mark.parametrize("cls", list(KNOWN), ids=lambda c: c.__name__)
def test_sqlalchemy_s_aiosqlite_classes_are_the_ones_the_seam_was_written_for(cls: type) -> None:
    own = {k for k in vars(cls) if not k.startswith("__")}
    added, gone = sorted(own - KNOWN[cls]), sorted(KNOWN[cls] - own)
    assert not added and not gone, _review(f"{cls.__name__} now adds {added}, drops {gone}")


def test_the_adapter_s_base_and_constructor_are_as_the_seam_calls_them() -> None:
    for name in ("commit", "rollback"):
        assert callable(getattr(AsyncAdapt_dbapi_connection, name, None)), _review(
            f"AsyncAdapt_dbapi_connection.{name} is gone"
        )
    params = list(inspect.signature(sa_aiosqlite.AsyncAdapt_aiosqlite_connection).parameters)
    assert params == ["dbapi", "connection"], _review(f"the adapter now takes {params}")
    assert "_connection" in getattr(AsyncAdapt_dbapi_connection, "__annotations__", {}), _review(
        "the adapter no longer keeps the driver connection as _connection"
    )


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(
        sqlite_inline.engine_url(f"sqlite:///{tmp_path / 'seam.db'}"),
        connect_args={"busy_timeout": 1.0},
    )
    # The driver leaves transactions to its caller (as Database does it: BEGIN on "begin").
    event.listen(engine.sync_engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
    yield engine
    await engine.dispose()


async def test_a_round_trip_through_sqlalchemy_uses_the_inline_connection(
    engine: AsyncEngine,
) -> None:
    assert isinstance(engine.dialect, SQLiteDialect_inline) and engine.dialect.has_terminate
    try:
        async with engine.begin() as conn:
            driver = conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]
            assert isinstance(driver, InlineConnection), _review("driver_connection changed")
            assert sqlite_driver.raw_sqlite(conn) is driver.raw
            await conn.exec_driver_sql("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
            await conn.execute(text("INSERT INTO t VALUES (:k, :v)"), [{"k": 1, "v": "a"}])
        async with engine.connect() as conn:
            await conn.execute(text("INSERT INTO t VALUES (2, 'b')"))
            await conn.rollback()
            rows = (await conn.execute(text("SELECT k, v FROM t ORDER BY k"))).all()
        assert [tuple(r) for r in rows] == [(1, "a")]
        with pytest.raises(sa_exc.IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO t VALUES (1, 'again')"))
    except (AttributeError, TypeError, NotImplementedError) as exc:
        pytest.fail(_review(f"a round trip raised {exc!r}"))


async def test_an_invalidated_connection_is_closed_and_replaced(engine: AsyncEngine) -> None:
    try:
        async with engine.connect() as conn:
            driver = conn.sync_connection.connection.driver_connection  # type: ignore[union-attr]
            await conn.invalidate()  # SQLAlchemy's terminate: our stop()
        assert isinstance(driver, InlineConnection) and driver.closed
        with pytest.raises(sqlite3.ProgrammingError):
            driver.raw.execute("SELECT 1")
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar() == 1
    except (AttributeError, TypeError, NotImplementedError) as exc:
        pytest.fail(_review(f"invalidating a connection raised {exc!r}"))
