"""Workspaces and API keys."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.driver import driver_of
from flowhook.store.models import ApiKey, Mode, Workspace
from flowhook.store.rows import from_row
from flowhook.store.tables import api_keys, workspaces

__all__ = [
    "count_workspaces",
    "get_workspace_by_name",
    "get_workspace",
    "insert_workspace",
    "insert_key",
    "find_key_by_hash",
    "list_keys",
    "revoke_key",
    "get_key",
    "revocations",
    "mark_used",
    "revoked_among",
    "announce_credentials",
    "KEYS_CHANNEL",
]

KEYS_CHANNEL = "flowhook_keys"
"""PostgreSQL NOTIFY channel: a key was revoked or a session ended (every API process forgets
its key cache and checks its open streams again)."""


async def count_workspaces(conn: AsyncConnection) -> int:
    return int((await conn.execute(select(func.count()).select_from(workspaces))).scalar_one())


async def get_workspace_by_name(conn: AsyncConnection, name: str) -> Workspace | None:
    row = (await conn.execute(select(workspaces).where(workspaces.c.name == name))).first()
    return Workspace(row.id, row.name, row.created_at) if row else None


async def get_workspace(conn: AsyncConnection, workspace_id: str) -> Workspace | None:
    row = (await conn.execute(select(workspaces).where(workspaces.c.id == workspace_id))).first()
    return Workspace(row.id, row.name, row.created_at) if row else None


async def insert_workspace(conn: AsyncConnection, ws: Workspace) -> None:
    await conn.execute(workspaces.insert().values(id=ws.id, name=ws.name, created_at=ws.created_at))


async def insert_key(
    conn: AsyncConnection,
    *,
    key_id: str,
    workspace_id: str,
    mode: Mode,
    prefix: str,
    key_hash: str,
    created_at: datetime,
    label: str | None = None,
) -> None:
    values = {
        "id": key_id,
        "workspace_id": workspace_id,
        "mode": str(mode),
        "prefix": prefix,
        "key_hash": key_hash,
        "created_at": created_at,
    }
    if label is not None:  # (a key made with no label writes only what revision 0031 had)
        values["label"] = label
    await conn.execute(api_keys.insert().values(**values))


_AUTH_COLUMNS = (
    api_keys.c.id,
    api_keys.c.workspace_id,
    workspaces.c.name.label("workspace_name"),
    api_keys.c.mode,
    api_keys.c.prefix,
    api_keys.c.created_at,
    api_keys.c.revoked_at,
    api_keys.c.key_hash,
)
"""What authentication reads: no label, no last use (it needs neither)."""

_KEY_COLUMNS = (*_AUTH_COLUMNS, api_keys.c.label, api_keys.c.last_used_at)


def _key(row: object) -> ApiKey:
    return from_row(ApiKey, row, {"mode": Mode})


async def find_key_by_hash(conn: AsyncConnection, key_hash: str) -> tuple[ApiKey, str] | None:
    """The key whose SHA-256 is ``key_hash``, with the stored hash for a constant-time check."""
    q = select(*_AUTH_COLUMNS).join(workspaces).where(api_keys.c.key_hash == key_hash)
    row = (await conn.execute(q)).first()
    return (_key(row), row.key_hash) if row else None


async def list_keys(
    conn: AsyncConnection, workspace_name: str | None = None, *, workspace_id: str | None = None
) -> list[ApiKey]:
    q = select(*_KEY_COLUMNS).join(workspaces).order_by(api_keys.c.id)
    if workspace_name is not None:
        q = q.where(workspaces.c.name == workspace_name)
    if workspace_id is not None:
        q = q.where(api_keys.c.workspace_id == workspace_id)
    return [_key(r) for r in (await conn.execute(q)).all()]


async def revoke_key(conn: AsyncConnection, key_id: str, now: datetime) -> ApiKey | None:
    """Revoke the key; ``None`` when there is no such key. Revoking twice keeps the first time.
    On PostgreSQL the revocation is announced on :data:`KEYS_CHANNEL` at commit; on SQLite
    other processes see :func:`revocations` change."""
    done = await conn.execute(
        update(api_keys)
        .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    if done.rowcount:
        await driver_of(conn).notify(conn, KEYS_CHANNEL)
    row = (
        await conn.execute(select(*_KEY_COLUMNS).join(workspaces).where(api_keys.c.id == key_id))
    ).first()
    return _key(row) if row else None


async def get_key(conn: AsyncConnection, key_id: str) -> ApiKey | None:
    row = (
        await conn.execute(select(*_KEY_COLUMNS).join(workspaces).where(api_keys.c.id == key_id))
    ).first()
    return _key(row) if row else None


async def mark_used(conn: AsyncConnection, key_ids: set[str], now: datetime) -> None:
    """Record that ``key_ids`` were used by ``now`` (a later time already recorded stays)."""
    if not key_ids:
        return
    await conn.execute(
        update(api_keys)
        .where(
            api_keys.c.id.in_(sorted(key_ids)),
            (api_keys.c.last_used_at.is_(None)) | (api_keys.c.last_used_at < now),
        )
        .values(last_used_at=now)
    )


async def revocations(conn: AsyncConnection) -> tuple[int, datetime | None]:
    """(revoked keys, latest revocation): changes whenever a key is revoked, read cheaply
    by every process that caches keys."""
    row = (
        await conn.execute(
            select(func.count(), func.max(api_keys.c.revoked_at)).where(
                api_keys.c.revoked_at.is_not(None)
            )
        )
    ).one()
    return int(row[0]), row[1]


async def revoked_among(conn: AsyncConnection, key_ids: set[str]) -> set[str]:
    """Those of ``key_ids`` that no longer authenticate (revoked, or gone)."""
    if not key_ids:
        return set()
    q = select(api_keys.c.id).where(api_keys.c.id.in_(key_ids), api_keys.c.revoked_at.is_(None))
    valid = {row[0] for row in await conn.execute(q)}
    return key_ids - valid


async def announce_credentials(conn: AsyncConnection) -> None:
    """Tell every PostgreSQL process, at commit, that credentials ended (a session signed
    out); SQLite has one API process per file, told in memory."""
    await driver_of(conn).notify(conn, KEYS_CHANNEL)
