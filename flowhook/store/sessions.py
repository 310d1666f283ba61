"""Settings-screen sessions, server side: the cookie holds a random token, the table its hash."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.models import Mode
from flowhook.store.tables import web_sessions

__all__ = ["WebSession", "insert_session", "find_session", "delete_session", "ended_among"]


@dataclass(frozen=True, slots=True)
class WebSession:
    key_id: str
    workspace_id: str
    mode: Mode
    csrf_token: str
    expires_at: datetime


async def insert_session(
    conn: AsyncConnection, token_hash: str, session: WebSession, now: datetime
) -> None:
    await conn.execute(delete(web_sessions).where(web_sessions.c.expires_at < now))
    await conn.execute(
        web_sessions.insert().values(
            token_hash=token_hash,
            key_id=session.key_id,
            workspace_id=session.workspace_id,
            mode=str(session.mode),
            csrf_token=session.csrf_token,
            created_at=now,
            expires_at=session.expires_at,
        )
    )


async def find_session(conn: AsyncConnection, token_hash: str, now: datetime) -> WebSession | None:
    q = select(web_sessions).where(
        web_sessions.c.token_hash == token_hash, web_sessions.c.expires_at > now
    )
    row = (await conn.execute(q)).first()
    if row is None:
        return None
    return WebSession(row.key_id, row.workspace_id, Mode(row.mode), row.csrf_token, row.expires_at)


async def delete_session(conn: AsyncConnection, token_hash: str) -> None:
    await conn.execute(delete(web_sessions).where(web_sessions.c.token_hash == token_hash))


async def ended_among(conn: AsyncConnection, token_hashes: set[str], now: datetime) -> set[str]:
    """Those of ``token_hashes`` whose session ended (signed out, or expired)."""
    if not token_hashes:
        return set()
    q = select(web_sessions.c.token_hash).where(
        web_sessions.c.token_hash.in_(token_hashes), web_sessions.c.expires_at > now
    )
    return token_hashes - {row[0] for row in await conn.execute(q)}
