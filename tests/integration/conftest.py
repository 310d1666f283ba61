"""Fixtures shared by the integration tests that build a database from scratch."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy import String

from flowhook.store import deliveries, sqlite_driver, types
from flowhook.store.tables import webhook_endpoints
from tests.conftest import PG_URL


class _TextId(types._Stored, String):
    """``VARCHAR(40)`` with no processing: an id column as PostgreSQL held it before 0023."""


def _same(value: object) -> object:
    return value


def _no_pause() -> sa.ColumnElement[object]:
    """``paused_at`` as the fan-out read it before endpoints had one: never set."""
    return sa.cast(sa.null(), webhook_endpoints.c.paused_at.type).label("paused_at")


@contextlib.contextmanager
def text_ids() -> Iterator[None]:
    """The store's code as it was before migration 0023: ids written and read as their text
    (``IdType`` and the bulk paths do not pack them; PostgreSQL's columns are ``varchar``).
    A test that writes rows at a revision older than 0023 through the current code does so
    inside this (with a :class:`Database` made and disposed inside it: SQLAlchemy keeps
    each type's processors per engine). Endpoints had no pause then either (0031): the
    fan-out reads none."""
    with pytest.MonkeyPatch.context() as patch:
        for module in (types, sqlite_driver):
            patch.setattr(module, "pack_id", _same)
            patch.setattr(module, "unpack_id", _same)
        patch.setattr(types, "_POSTGRES_ID", _TextId(40))
        patch.setattr(deliveries, "_pause_column", _no_pause)
        deliveries._subscribers_statement.cache_clear()
        try:
            yield
        finally:
            deliveries._subscribers_statement.cache_clear()


def admin_sql(sql: str) -> None:
    """Run ``sql`` on the test PostgreSQL server (CREATE / DROP DATABASE)."""

    async def go() -> None:
        assert PG_URL
        conn = await asyncpg.connect(PG_URL.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(go())


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new database with no schema, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    request.getfixturevalue("pg_url")  # skips (or fails in CI) without PostgreSQL
    assert PG_URL
    name = f"flowhook_test_{uuid.uuid4().hex[:10]}"
    admin_sql(f'CREATE DATABASE "{name}"')
    yield f"{PG_URL.rpartition('/')[0]}/{name}"
    admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
