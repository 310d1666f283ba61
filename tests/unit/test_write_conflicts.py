"""Lost lock conflicts: how the store names them, and how ``Database.retrying`` reruns them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy.exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.errors import StoreUnavailable, WriteConflict
from flowhook.store import db as db_module
from flowhook.store.db import CONFLICT_ATTEMPTS, Database, _translated


def _dbapi_error(cause: BaseException) -> sa_exc.DBAPIError:
    """A DBAPIError caused by ``cause``, as SQLAlchemy's asyncpg dialect raises one."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise sa_exc.DBAPIError("UPDATE runs …", None, Exception(str(exc))) from exc
    except sa_exc.DBAPIError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    "cause",
    [
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        asyncpg.exceptions.SerializationError("could not serialize access"),
    ],
)
async def test_deadlocks_and_serialization_failures_are_write_conflicts(
    cause: BaseException,
) -> None:
    with pytest.raises(WriteConflict) as raised:
        async with _translated():
            raise _dbapi_error(cause)
    assert isinstance(raised.value, StoreUnavailable)  # the API answers 503, Retry-After


async def test_other_database_errors_are_not_write_conflicts() -> None:
    error = _dbapi_error(asyncpg.exceptions.UniqueViolationError("duplicate key"))
    with pytest.raises(sa_exc.DBAPIError):
        async with _translated():
            raise error


@pytest.fixture
async def sqlite_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Database]:
    monkeypatch.setattr(db_module, "CONFLICT_BACKOFF", 0.0)
    database = Database(f"sqlite:///{tmp_path / 'conflicts.db'}")
    async with database.transaction() as conn:
        await conn.execute(text("CREATE TABLE t (n INTEGER)"))
    yield database
    await database.dispose()


async def _rows(db: Database) -> list[int]:
    async with db.read() as conn:
        return [r.n for r in await conn.execute(text("SELECT n FROM t ORDER BY n"))]


async def test_a_transaction_that_lost_a_conflict_runs_again_and_its_first_tries_left_nothing(
    sqlite_db: Database,
) -> None:
    tries: list[int] = []

    async def work(conn: AsyncConnection) -> str:
        tries.append(len(tries))
        await conn.execute(text("INSERT INTO t VALUES (:n)"), {"n": len(tries)})
        if len(tries) < 3:
            raise WriteConflict("the transaction lost a lock conflict (40P01)")
        return "done"

    assert await sqlite_db.retrying(work) == "done"
    assert tries == [0, 1, 2]
    assert await _rows(sqlite_db) == [3]


async def test_retrying_gives_up_after_a_bounded_number_of_tries(sqlite_db: Database) -> None:
    tries = 0

    async def work(conn: AsyncConnection) -> None:
        nonlocal tries
        tries += 1
        raise WriteConflict("the transaction lost a lock conflict (40001)")

    with pytest.raises(WriteConflict):
        await sqlite_db.retrying(work)
    assert tries == CONFLICT_ATTEMPTS


async def test_retrying_does_not_rerun_other_errors(sqlite_db: Database) -> None:
    tries = 0

    async def work(conn: AsyncConnection) -> None:
        nonlocal tries
        tries += 1
        raise StoreUnavailable("the database cannot be reached")

    with pytest.raises(StoreUnavailable):
        await sqlite_db.retrying(work)
    assert tries == 1
