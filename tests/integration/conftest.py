"""Fixtures shared by the integration tests that build a database from scratch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import PG_URL


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
