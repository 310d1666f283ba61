"""API keys: made, hashed, looked up from a memory cache, revoked.

A key is ``sk_test_`` or ``sk_live_`` and 32 base32 characters (160 random bits). Only its
SHA-256 is stored: the key has too much entropy for a slow hash to add anything, and a fast
one keeps authentication off the hot path's budget.

Authentication asks the database only on a cache miss. A revocation clears the cache of the
process that made it at once, and :class:`RevocationWatch` clears every other process's
within a second: PostgreSQL announces revocations with NOTIFY, and on SQLite (where
``flowhook keys revoke`` may run beside ``serve``) a background check reads a revocation
marker twice a second. Either way no request pays a query for it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from flowhook.clock import Clock
from flowhook.errors import InvalidInput, NotFound, StoreUnavailable, Unauthenticated
from flowhook.ids import new_id
from flowhook.service.ratelimit import TokenBuckets
from flowhook.store import keys as keys_store
from flowhook.store.db import Connection, Database
from flowhook.store.models import ApiKey, Mode, Workspace
from flowhook.store.wakeup import PgListener, Wakeup

__all__ = [
    "Principal",
    "KeyService",
    "hash_key",
    "CreatedKey",
    "RevocationWatch",
    "clean_label",
    "MAX_LABEL",
]

log = logging.getLogger("flowhook")

_KEY_RE = re.compile(r"^sk_(test|live)_[a-z2-7]{32}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: one workspace, in one mode."""

    workspace_id: str
    mode: Mode
    key_id: str


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: str
    """The secret, shown once."""
    api_key: ApiKey


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


MAX_LABEL = 100
"""The longest key label, in characters."""


def clean_label(label: str | None) -> str | None:
    """A key's label as stored: trimmed, ``None`` when blank; InvalidInput when it is longer
    than :data:`MAX_LABEL` or holds a control character."""
    if label is None or not label.strip():
        return None
    label = label.strip()
    if len(label) > MAX_LABEL:
        raise InvalidInput(f"a key's label is at most {MAX_LABEL} characters, not {len(label)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in label):
        raise InvalidInput("a key's label must not hold control characters (tabs, new lines)")
    return label


def describe_key(key: ApiKey | None, key_id: str) -> str:
    """How a key is named in words: ``key "CI deploys" (key_…)``, or ``key key_…``."""
    if key is not None and key.label:
        return f'key "{key.label}" ({key_id})'
    return f"key {key_id}"


def _new_secret(mode: Mode) -> str:
    token = base64.b32encode(secrets.token_bytes(20)).decode().lower()
    return f"sk_{mode}_{token}"


class KeyService:
    def __init__(
        self, db: Database, clock: Clock, *, cache_seconds: float = 30.0, rate_limit: float = 0.0
    ) -> None:
        self._rate = rate_limit
        self._buckets = TokenBuckets()
        self._db = db
        self._clock = clock
        self._ttl = cache_seconds
        self._cache: OrderedDict[str, tuple[Principal | None, float]] = OrderedDict()
        self._cache_max = 10_000
        self._generation = 0
        """Bumped by :meth:`forget`: a lookup that raced a revocation is not remembered."""
        self._ended: list[Callable[[], None]] = []
        self._used: set[str] = set()
        """Keys that authenticated since :meth:`record_use` last wrote."""

    async def create(
        self, mode: Mode, workspace: str = "default", *, label: str | None = None
    ) -> CreatedKey:
        """A new key for ``workspace`` (created when missing), named ``label`` when given."""
        label = clean_label(label)
        async with self._db.transaction() as conn:
            ws = await keys_store.get_workspace_by_name(conn, workspace)
            if ws is None:
                ws = Workspace(new_id("ws"), workspace, self._clock.now())
                await keys_store.insert_workspace(conn, ws)
            return await self._insert(conn, ws.id, ws.name, mode, label)

    async def create_for(self, who: Principal, label: str | None) -> CreatedKey:
        """A new key in the caller's workspace and mode (the settings screen's Keys page: a
        sandbox session cannot make a live key)."""
        label = clean_label(label)
        async with self._db.transaction() as conn:
            ws = await keys_store.get_workspace(conn, who.workspace_id)
            if ws is None:
                raise NotFound("this workspace no longer exists")
            return await self._insert(conn, ws.id, ws.name, who.mode, label)

    async def _insert(
        self, conn: Connection, ws_id: str, ws_name: str, mode: Mode, label: str | None
    ) -> CreatedKey:
        now = self._clock.now()
        secret = _new_secret(mode)
        key_id = new_id("key")
        await keys_store.insert_key(
            conn,
            key_id=key_id,
            workspace_id=ws_id,
            mode=mode,
            prefix=secret[:12],
            key_hash=hash_key(secret),
            created_at=now,
            label=label,
        )
        return CreatedKey(
            secret, ApiKey(key_id, ws_id, ws_name, mode, secret[:12], now, None, label)
        )

    async def list_for(self, who: Principal) -> list[ApiKey]:
        """The keys of the caller's workspace and mode, newest first (a sandbox session sees
        no live key, as no page shows another mode's data)."""
        async with self._db.read() as conn:
            keys = await keys_store.list_keys(conn, workspace_id=who.workspace_id)
        mine = [k for k in keys if k.mode == who.mode]
        return sorted(mine, key=lambda k: k.created_at, reverse=True)

    async def revoke_for(self, who: Principal, key_id: str) -> ApiKey:
        """Revoke a key of the caller's workspace and mode; NotFound for any other."""
        async with self._db.transaction() as conn:
            key = await keys_store.get_key(conn, key_id)
            if key is None or key.workspace_id != who.workspace_id or key.mode != who.mode:
                raise NotFound(f"no API key {key_id!r} in this workspace and mode")
            key = await keys_store.revoke_key(conn, key_id, self._clock.now())
        self.forget()
        assert key is not None
        return key

    async def list(self, workspace: str | None = None) -> list[ApiKey]:
        async with self._db.read() as conn:
            return await keys_store.list_keys(conn, workspace)

    async def get(self, key_id: str) -> ApiKey | None:
        async with self._db.read() as conn:
            return await keys_store.get_key(conn, key_id)

    async def describe(self, key_id: str) -> str:
        """The key in words, with its label when it has one (for "approved by")."""
        try:
            key = await self.get(key_id)
        except StoreUnavailable:
            key = None
        return describe_key(key, key_id)

    async def record_use(self) -> None:
        """Write when the keys that authenticated since the last call were last used: one
        statement for all of them, off the request path (:class:`RevocationWatch` calls
        this every half minute and when it stops)."""
        used, self._used = self._used, set()
        if not used:
            return
        try:
            async with self._db.transaction() as conn:
                await keys_store.mark_used(conn, used, self._clock.now())
        except StoreUnavailable:
            self._used |= used  # try again next time

    async def revoke(self, key_id: str) -> ApiKey:
        async with self._db.transaction() as conn:
            key = await keys_store.revoke_key(conn, key_id, self._clock.now())
        if key is None:
            raise NotFound(f"no API key {key_id!r}")
        self.forget()  # this process at once; the others through their RevocationWatch
        return key

    def forget(self) -> None:
        """Drop every cached key: the next request of each key reads it again; and tell what
        holds a key past its request (open streams) to check it again."""
        self._cache.clear()
        self._generation += 1
        self.credentials_ended()

    def on_credentials_ended(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a key may have been revoked or a session ended."""
        self._ended.append(callback)

    def credentials_ended(self) -> None:
        for callback in self._ended:
            callback()

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal for an ``Authorization: Bearer <key>`` header, or Unauthenticated."""
        if not authorization:
            raise Unauthenticated(
                "missing API key: send Authorization: Bearer sk_test_… or sk_live_…"
            )
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not _KEY_RE.match(key):
            raise Unauthenticated(
                "malformed API key: send Authorization: Bearer sk_test_… or sk_live_…"
            )
        digest = hash_key(key)
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > time.monotonic():
            principal = hit[0]
        else:
            generation = self._generation
            principal = await self._lookup(digest)
            if generation == self._generation:
                self._remember(digest, principal)
        if principal is None:
            raise Unauthenticated("unknown or revoked API key")
        self._used.add(principal.key_id)
        if self._rate > 0:
            self._buckets.take(
                principal.key_id, rate=self._rate, burst=2 * self._rate, what="with this API key"
            )
        return principal

    async def _lookup(self, digest: str) -> Principal | None:
        async with self._db.read() as conn:
            found = await keys_store.find_key_by_hash(conn, digest)
        if found is None:
            return None
        key, stored = found
        if not hmac.compare_digest(stored, digest) or key.revoked_at is not None:
            return None
        return Principal(key.workspace_id, key.mode, key.id)

    def _remember(self, digest: str, principal: Principal | None) -> None:
        # Unknown keys are remembered briefly too, so guessing cannot load the database.
        ttl = self._ttl if principal is not None else min(self._ttl, 5.0)
        self._cache[digest] = (principal, time.monotonic() + ttl)
        self._cache.move_to_end(digest)
        while len(self._cache) > self._cache_max:
            self._cache.popitem(last=False)


class RevocationWatch:
    """Makes a key revoked in another process stop working here within ``interval``.

    Every ``interval`` one small query reads the revocation marker and the cache is
    forgotten when it moved. On PostgreSQL a LISTEN on the keys channel also forgets at once
    when a revocation is announced; the marker read still bounds the delay when the
    listening connection was down (or silently half-open) at that moment.

    Every ``use_interval`` it also writes when this process's keys were last used
    (:meth:`KeyService.record_use`), and once more when it stops.
    """

    def __init__(
        self, db: Database, keys: KeyService, *, interval: float = 0.5, use_interval: float = 30.0
    ) -> None:
        self._db = db
        self._keys = keys
        self._every = interval
        self._use_every = use_interval
        self._use_due = time.monotonic() + use_interval
        self._wakeup = Wakeup()
        self._listener: PgListener | None = None
        self._task: asyncio.Task[None] | None = None
        self._seen: tuple[int, datetime | None] | None = None

    async def start(self) -> None:
        self._seen = await self._marker()
        dsn = self._db.listen_dsn
        if dsn is not None:
            self._listener = PgListener(dsn, {keys_store.KEYS_CHANNEL: self._wakeup})
            await self._listener.start()
        self._task = asyncio.create_task(self._watch(), name="flowhook-key-revocations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        try:
            await self._keys.record_use()
        except Exception:
            log.exception("recording when keys were last used failed")

    async def _marker(self) -> tuple[int, datetime | None] | None:
        try:
            async with self._db.read() as conn:
                return await keys_store.revocations(conn)
        except StoreUnavailable:
            return None  # read again next time; the cache TTL still bounds staleness

    async def _watch(self) -> None:
        while True:
            announced = await self._wakeup.wait(self._every)
            self._wakeup.clear()
            if announced:
                self._keys.forget()
            try:
                marker = await self._marker()
            except Exception:
                log.exception("key revocation check failed")
                continue
            if marker is not None and marker != self._seen:
                self._keys.forget()
                self._seen = marker
            if time.monotonic() >= self._use_due:
                self._use_due = time.monotonic() + self._use_every
                try:
                    await self._keys.record_use()
                except Exception:
                    log.exception("recording when keys were last used failed")
