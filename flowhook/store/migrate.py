"""Schema migrations with Alembic, run on start and by ``flowhook migrate``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from flowhook.store import secrets
from flowhook.store.db import Database

__all__ = ["migrate", "current_revision", "head_revision", "alembic_config"]

_HERE = Path(__file__).parent / "migrations"
log = logging.getLogger("flowhook")


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def migrate(db: Database, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (idempotent). Needs the secret key (a missing or
    malformed one stops here, before anything is served); at the head it also seals
    secrets an older process wrote in plaintext since, and checks every sealed one opens
    with the keys given (a wrong key stops here too, and nothing is written)."""
    box = db.keyring.box()

    def _upgrade(sync_conn: Any) -> tuple[str | None, str | None]:
        before = MigrationContext.configure(sync_conn).get_current_revision()
        cfg = alembic_config()
        cfg.attributes["connection"] = sync_conn
        cfg.attributes["secret_box"] = box
        command.upgrade(cfg, revision)
        if revision == "head":
            secrets.reseal(sync_conn, box, mode="seal").raise_if_unreadable(box.source)
        return before, MigrationContext.configure(sync_conn).get_current_revision()

    async with db.writer.begin() as conn:
        before, after = await conn.run_sync(_upgrade)
    if before != after:  # one line; each revision's own is Alembic's, at debug
        if before is None:
            log.info("migrated an empty database to revision %s", after)
        else:
            log.info("migrated the database from revision %s to %s", before, after)


async def current_revision(db: Database) -> str | None:
    def _current(sync_conn: Any) -> str | None:
        return MigrationContext.configure(sync_conn).get_current_revision()

    async with db.writer.connect() as conn:
        return await conn.run_sync(_current)
