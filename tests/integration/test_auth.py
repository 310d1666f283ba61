"""API keys: hashed at rest, cached, revocable."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from flowhook.errors import NotFound, Unauthenticated
from flowhook.service import Services
from flowhook.store.db import Database
from flowhook.store.models import Mode
from flowhook.store.tables import api_keys


async def test_keys_are_stored_only_as_hashes(services: Services, db: Database) -> None:
    created = await services.keys.create(Mode.LIVE, "acme")
    assert created.key.startswith("sk_live_") and len(created.key) == 40
    async with db.read() as conn:
        rows = (await conn.execute(select(api_keys))).all()
    assert len(rows) == 1
    assert created.key not in str(tuple(rows[0]))
    assert rows[0].prefix == created.key[:12]


async def test_authenticate_uses_the_cache_and_revoke_takes_effect_at_once(
    services: Services, db: Database
) -> None:
    created = await services.keys.create(Mode.TEST, "acme")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    assert (who.mode, who.key_id) == (Mode.TEST, created.api_key.id)
    real = services.keys._db
    services.keys._db = Database("postgresql://nobody@127.0.0.1:9/unreachable")
    try:  # a cached key needs no database
        assert await services.keys.authenticate(f"Bearer {created.key}") == who
    finally:
        await services.keys._db.dispose()
        services.keys._db = real
    await services.keys.revoke(created.api_key.id)
    with pytest.raises(Unauthenticated):
        await services.keys.authenticate(f"Bearer {created.key}")
    with pytest.raises(NotFound):
        await services.keys.revoke("key_nothing")


async def test_workspaces_are_shared_by_name(services: Services) -> None:
    a = await services.keys.create(Mode.TEST, "acme")
    b = await services.keys.create(Mode.LIVE, "acme")
    c = await services.keys.create(Mode.TEST, "globex")
    assert a.api_key.workspace_id == b.api_key.workspace_id != c.api_key.workspace_id
    listed = await services.keys.list("acme")
    assert {k.id for k in listed} == {a.api_key.id, b.api_key.id}
