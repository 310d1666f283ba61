"""Sign in to the settings screen with an API key; sessions and their CSRF tokens."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from flowhook.clock import Clock
from flowhook.errors import Unauthenticated
from flowhook.service.auth import KeyService, Principal
from flowhook.store import keys as keys_store
from flowhook.store import sessions as store
from flowhook.store.db import Database
from flowhook.store.sessions import WebSession

__all__ = ["SessionService", "SESSION_HOURS", "session_hash"]

SESSION_HOURS = 12


def session_hash(token: str) -> str:
    """What the table keeps of a session's cookie token."""
    return hashlib.sha256(token.encode()).hexdigest()


class SessionService:
    def __init__(self, db: Database, clock: Clock, keys: KeyService) -> None:
        self._db = db
        self._clock = clock
        self._keys = keys

    async def sign_in(self, api_key: str) -> tuple[str, WebSession]:
        """A new session for a valid key: (cookie token, session). Raises Unauthenticated."""
        who = await self._keys.authenticate(f"Bearer {api_key.strip()}")
        token = secrets.token_urlsafe(32)
        now = self._clock.now()
        session = WebSession(
            who.key_id,
            who.workspace_id,
            who.mode,
            secrets.token_urlsafe(32),
            now + timedelta(hours=SESSION_HOURS),
        )
        async with self._db.transaction() as conn:
            await store.insert_session(conn, session_hash(token), session, now)
        return token, session

    async def resume(self, token: str | None) -> tuple[Principal, WebSession] | None:
        """The caller behind a session cookie; ``None`` when absent, expired or its key revoked."""
        if not token or len(token) > 100:
            return None
        async with self._db.read() as conn:
            session = await store.find_session(conn, session_hash(token), self._clock.now())
            if session is None:
                return None
            key = await keys_store.get_key(conn, session.key_id)
        if key is None or key.revoked_at is not None:
            return None
        return Principal(session.workspace_id, session.mode, session.key_id), session

    async def sign_out(self, token: str | None) -> None:
        """End the session; its open streams end with it, in every process."""
        if token:
            async with self._db.transaction() as conn:
                await store.delete_session(conn, session_hash(token))
                await keys_store.announce_credentials(conn)
            self._keys.credentials_ended()

    @staticmethod
    def check_csrf(session: WebSession, given: str | None) -> None:
        # Bytes: compare_digest refuses str with characters outside ASCII (a TypeError).
        if not given or not hmac.compare_digest(session.csrf_token.encode(), given.encode()):
            raise Unauthenticated(
                "the form's security token is missing or wrong; reload the page and try again"
            )
