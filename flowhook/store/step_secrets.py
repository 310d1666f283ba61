"""Step secrets: named values an ``http`` step reads as ``{{ secrets.NAME }}``, one per
workspace, mode and name, sealed at rest like the endpoints' secrets (:mod:`crypto`). Only
:func:`values_of` opens them: the listing reads names and times, never values."""

from __future__ import annotations

import secrets as random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.crypto import cipher
from flowhook.store.models import Mode
from flowhook.store.tables import step_secrets

__all__ = [
    "SecretInfo",
    "insert_secret",
    "replace_secret",
    "delete_secret",
    "list_secrets",
    "existing_names",
    "values_of",
]

_S = step_secrets.c


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """A secret as it is shown: its name and times, never its value."""

    name: str
    created_at: datetime
    updated_at: datetime


def _scoped(workspace_id: str, mode: Mode) -> ColumnElement[bool]:
    return and_(_S.workspace_id == workspace_id, _S.mode == str(mode))


async def insert_secret(
    conn: AsyncConnection, workspace_id: str, mode: Mode, name: str, value: str, now: datetime
) -> SecretInfo:
    """Add it; a name already held raises :class:`~flowhook.errors.Duplicate`."""
    await conn.execute(
        step_secrets.insert().values(
            id=random.token_hex(16), workspace_id=workspace_id, mode=str(mode), name=name,
            value=cipher(conn).seal(value), created_at=now, updated_at=now,
        )
    )  # fmt: skip
    return SecretInfo(name, now, now)


async def replace_secret(
    conn: AsyncConnection, workspace_id: str, mode: Mode, name: str, value: str, now: datetime
) -> SecretInfo | None:
    """Its new value; ``None`` when there is no such secret."""
    q = (
        update(step_secrets)
        .where(_scoped(workspace_id, mode), _S.name == name)
        .values(value=cipher(conn).seal(value), updated_at=now)
        .returning(_S.created_at)
    )
    row = (await conn.execute(q)).first()
    return None if row is None else SecretInfo(name, row.created_at, now)


async def delete_secret(conn: AsyncConnection, workspace_id: str, mode: Mode, name: str) -> bool:
    q = delete(step_secrets).where(_scoped(workspace_id, mode), _S.name == name)
    return bool((await conn.execute(q)).rowcount)


async def list_secrets(conn: AsyncConnection, workspace_id: str, mode: Mode) -> list[SecretInfo]:
    """Every secret of the workspace and mode, by name (names and times only)."""
    q = (
        select(_S.name, _S.created_at, _S.updated_at)
        .where(_scoped(workspace_id, mode))
        .order_by(_S.name)
    )
    return [SecretInfo(r.name, r.created_at, r.updated_at) for r in (await conn.execute(q)).all()]


async def existing_names(
    conn: AsyncConnection, workspace_id: str, mode: Mode, names: Iterable[str]
) -> set[str]:
    """Which of ``names`` the workspace and mode hold."""
    wanted = sorted(set(names))
    if not wanted:
        return set()
    q = select(_S.name).where(_scoped(workspace_id, mode), _S.name.in_(wanted))
    return {r.name for r in (await conn.execute(q)).all()}


async def values_of(
    conn: AsyncConnection, workspace_id: str, mode: Mode, names: Iterable[str]
) -> dict[str, str]:
    """The plaintext of those of ``names`` that exist (what an http step sends)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    q = select(_S.name, _S.value).where(_scoped(workspace_id, mode), _S.name.in_(wanted))
    box = cipher(conn)
    return {r.name: box.open(r.value) for r in (await conn.execute(q)).all()}
