"""Schema migrations with Alembic, run on start and by ``flowhook migrate``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from flowhook.store.db import Database

__all__ = ["migrate", "current_revision", "head_revision", "alembic_config"]

_HERE = Path(__file__).parent / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def migrate(db: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (idempotent)."""

    def _upgrade(sync_conn: Any) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, revision)

    async with db.writer.begin() as conn:
        await conn.run_sync(_upgrade)


async def current_revision(db: Database) -> str | None:
    def _current(sync_conn: Any) -> str | None:
        return MigrationContext.configure(sync_conn).get_current_revision()

    async with db.writer.connect() as conn:
        return await conn.run_sync(_current)
