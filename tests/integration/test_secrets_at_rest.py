"""Endpoint and hook secrets are encrypted at rest, on SQLite and PostgreSQL: the columns
hold ciphertext, what signs and verifies is unchanged, plaintext rows from before are sealed
by the migration, a wrong key stops the start, and rotation moves every secret to a new key."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from standardwebhooks.webhooks import Webhook
from typer.testing import CliRunner

from flowhook.cli import app as cli
from flowhook.errors import SecretKeyError
from flowhook.signing import new_secret, standard_signature, x_service_signature
from flowhook.store import endpoints
from flowhook.store import hooks as hooks_store
from flowhook.store.crypto import PREFIX, generate_key
from flowhook.store.db import Database
from flowhook.store.migrate import current_revision, head_revision, migrate
from flowhook.store.models import Endpoint, Mode
from flowhook.store.tables import endpoint_events, inbound_hooks, webhook_endpoints
from tests.conftest import Api, Receiver
from tests.integration.conftest import text_ids
from tests.integration.test_webhooks import endpoint, until

FLOW: dict[str, Any] = {
    "name": "s",
    "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}],
}
NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def raw_secrets(db: Database) -> list[str]:
    """Every stored secret as the database holds it."""
    async with db.read() as conn:
        endpoints = (
            await conn.execute(text("SELECT secret, previous_secret FROM webhook_endpoints"))
        ).all()
        hooks = (await conn.execute(text("SELECT verify FROM inbound_hooks"))).scalars().all()
    found = [v for row in endpoints for v in row if v is not None]
    for verify in hooks:
        verify = orjson.loads(verify) if isinstance(verify, str | bytes) else verify
        if verify and "secret" in verify:
            found.append(verify["secret"])
    return found


async def test_secrets_are_ciphertext_in_the_database_and_sign_as_before(
    api: Api, receiver: Receiver, db: Database
) -> None:
    ep = await endpoint(api, receiver.url + "/hook", ["flow.completed"])
    r = await api.post(f"/api/v1/webhooks/endpoints/{ep['id']}/rotate-secret", {})
    assert r.status_code == 200, r.text
    rotated = r.json()
    assert rotated["previous_secret"] == ep["secret"] != rotated["secret"]
    flow_id = await api.create_flow(FLOW)
    r = await api.post(
        "/api/v1/hooks",
        {"flow_id": flow_id, "verify": {"type": "hmac", "header": "X-Sig", "encoding": "hex"}},
    )
    assert r.status_code == 201, r.text
    hook = r.json()
    r = await api.post("/api/v1/hooks", {"flow_id": flow_id, "verify": {"type": "standard"}})
    standard = r.json()

    stored = await raw_secrets(db)
    plain = [
        rotated["secret"],
        ep["secret"],
        hook["verify"]["secret"],
        standard["verify"]["secret"],
    ]
    assert len(stored) == 4 and all(v.startswith(PREFIX) for v in stored)
    assert not any(p in v for p in plain for v in stored)

    # What the API reveals and what signs are the plaintext, as before.
    revealed = (await api.get(f"/api/v1/webhooks/endpoints/{ep['id']}/secret")).json()
    assert (revealed["secret"], revealed["previous_secret"]) == (rotated["secret"], ep["secret"])
    await api.wait(await api.execute(flow_id))
    [sent] = await until(lambda: receiver.of("flow.completed"))
    body = sent["body"]
    assert sent["headers"]["X-Service-Signature"] == x_service_signature(ep["secret"], body)
    assert Webhook(rotated["secret"]).verify(body, sent["headers"]) == orjson.loads(body)
    assert Webhook(ep["secret"]).verify(body, sent["headers"]) == orjson.loads(body)

    # An inbound hook verifies against its decrypted secret.
    payload = b'{"n": 1}'
    good = hmac.new(hook["verify"]["secret"].encode(), payload, hashlib.sha256).hexdigest()
    for signature, status in (("0" * 64, 401), (good, 202)):
        r = await api.client.post(
            "/api/v1/hooks/" + hook["id"],
            content=payload,
            headers={"Content-Type": "application/json", "X-Sig": signature},
        )
        assert r.status_code == status, r.text


# A database as the version before encryption left it: migrated to 0005, plaintext rows.


# (``empty_url``: tests/integration/conftest.py)


LEGACY = {
    "endpoint": new_secret(),
    "previous": new_secret(),
    "hmac": "plain-hmac-secret",
    "standard": new_secret(),
}


async def _write_as_the_old_version(db: Database) -> None:
    await migrate(db, "0005")
    async with db.transaction() as conn:
        await conn.execute(
            webhook_endpoints.insert().values(
                id="ep_1", workspace_id="ws", mode="test", url="https://x.example/h",
                description="", enabled=True, secret=LEGACY["endpoint"],
                previous_secret=LEGACY["previous"], previous_secret_expires_at=NOW,
                created_at=NOW, updated_at=NOW,
            )
        )  # fmt: skip
        await conn.execute(endpoint_events.insert().values(endpoint_id="ep_1", event="flow.failed"))
        for hook_id, verify in (
            (
                "hk_1",
                {"type": "hmac", "header": "X-S", "encoding": "hex", "secret": LEGACY["hmac"]},
            ),
            ("hk_2", {"type": "standard", "secret": LEGACY["standard"]}),
            ("hk_3", None),
        ):
            await conn.execute(
                inbound_hooks.insert().values(
                    id=hook_id, workspace_id="ws", mode="test", flow_id="fl_1", verify=verify,
                    rate_limit=10, created_at=NOW,
                )
            )  # fmt: skip


async def test_the_migration_seals_plaintext_rows_and_they_sign_the_same(empty_url: str) -> None:
    key = generate_key()
    with text_ids():  # written by the code of 0005's time: ids as text (0023 packs them)
        old = Database(empty_url, secret_key=key)
        try:
            await _write_as_the_old_version(old)
        finally:
            await old.dispose()
    db = Database(empty_url, secret_key=key)
    try:
        before = x_service_signature(LEGACY["endpoint"], b"{}")
        assert sorted(await raw_secrets(db)) == sorted(LEGACY.values())

        await migrate(db)
        assert await current_revision(db) == head_revision()
        stored = await raw_secrets(db)
        assert len(stored) == 4 and all(v.startswith(PREFIX) for v in stored)
        assert not any(p in v for p in LEGACY.values() for v in stored)

        async with db.read() as conn:
            ep = await endpoints.get_endpoint(conn, "ep_1")
            hmac_hook = await hooks_store.get_hook(conn, "hk_1")
            standard_hook = await hooks_store.get_hook(conn, "hk_2")
            open_hook = await hooks_store.get_hook(conn, "hk_3")
        assert ep is not None and hmac_hook and standard_hook and open_hook
        assert (ep.secret, ep.previous_secret) == (LEGACY["endpoint"], LEGACY["previous"])
        assert ep.events == ["flow.failed"]  # the column change kept the subscriptions
        assert x_service_signature(ep.secret, b"{}") == before
        assert hmac_hook.verify == {
            "type": "hmac", "header": "X-S", "encoding": "hex", "secret": LEGACY["hmac"],
        }  # fmt: skip
        assert standard_hook.verify and standard_signature(
            standard_hook.verify["secret"], "msg", 1, b"{}"
        ) == standard_signature(LEGACY["standard"], "msg", 1, b"{}")
        assert open_hook.verify is None

        await migrate(db)  # again: nothing more to do
        assert sorted(await raw_secrets(db)) == sorted(stored)
    finally:
        await db.dispose()


async def _seed(url: str, key: str | None) -> Endpoint:
    """An endpoint (with a rotated-out secret) and a hook, sealed under ``key`` (``None``:
    the SQLite key file's)."""
    db = Database(url, secret_key=key)
    try:
        await migrate(db)
        ep = Endpoint(
            "ep_1", "ws", Mode.TEST, "https://x.example/h", "", True, ["flow.failed"],
            new_secret(), NOW, NOW, previous_secret=new_secret(),
            previous_secret_expires_at=NOW + timedelta(days=1),
        )  # fmt: skip
        hook = hooks_store.Hook(
            "hk_1", "ws", Mode.TEST, "fl_1", {"type": "standard", "secret": new_secret()},
            None, 10, NOW,
        )  # fmt: skip
        async with db.transaction() as conn:
            await endpoints.insert_endpoint(conn, ep)
            await hooks_store.insert_hook(conn, hook)
        return ep
    finally:
        await db.dispose()


async def _read(url: str, key: str) -> tuple[Endpoint | None, list[str]]:
    db = Database(url, secret_key=key)
    try:
        await migrate(db)
        async with db.read() as conn:
            return await endpoints.get_endpoint(conn, "ep_1"), await raw_secrets(db)
    finally:
        await db.dispose()


async def test_a_wrong_key_stops_the_start_naming_the_setting(database_url: str) -> None:
    key, wrong = generate_key(), generate_key()
    await _seed(database_url, key)
    db = Database(database_url, secret_key=wrong)
    try:
        with pytest.raises(SecretKeyError) as caught:
            await migrate(db)
    finally:
        await db.dispose()
    message = caught.value.message
    assert "FLOWHOOK_SECRET_KEY" in message and "the secrets of 2 record(s)" in message
    assert key not in message and wrong not in message
    ep, _ = await _read(database_url, key)  # the right key still reads them
    assert ep is not None


runner = CliRunner()


def _flowhook(url: str, keys: str, *args: str) -> Any:
    return runner.invoke(cli, [*args, "--database-url", url], env={"FLOWHOOK_SECRET_KEY": keys})


def test_rotate_moves_every_secret_to_the_newest_key_and_the_old_one_can_go(
    database_url: str,
) -> None:
    old, new = generate_key(), generate_key()
    ep = asyncio.run(_seed(database_url, old))

    # The new key first, the old one still listed: everything reads.
    got, _ = asyncio.run(_read(database_url, f"{new},{old}"))
    assert got is not None and got.secret == ep.secret

    done = _flowhook(database_url, f"{new},{old}", "secrets", "rotate")
    assert done.exit_code == 0, done.output
    assert "re-encrypted 2 endpoint secrets, 1 hook secrets" in done.output
    again = _flowhook(database_url, f"{new},{old}", "secrets", "rotate")
    assert "re-encrypted 0 endpoint secrets, 0 hook secrets" in again.output

    # The old key dropped: the secrets are the same plaintext, sealed anew.
    got, stored = asyncio.run(_read(database_url, new))
    assert got is not None
    assert (got.secret, got.previous_secret) == (ep.secret, ep.previous_secret)
    assert len(stored) == 3 and all(v.startswith(PREFIX) for v in stored)

    # Only the old key now: it opens nothing, and says so.
    refused = _flowhook(database_url, old, "migrate")
    assert refused.exit_code == 1
    assert "FLOWHOOK_SECRET_KEY" in refused.output and old not in refused.output


def test_generate_key_prints_a_fresh_key() -> None:
    first = runner.invoke(cli, ["secrets", "generate-key"])
    second = runner.invoke(cli, ["secrets", "generate-key"])
    assert first.exit_code == 0 and len(first.output.strip()) == 44
    assert first.output != second.output


@pytest.mark.postgres
def test_postgresql_without_a_key_refuses_with_how_to_make_one(pg_url: str) -> None:
    result = runner.invoke(
        cli, ["migrate", "--database-url", pg_url], env={"FLOWHOOK_SECRET_KEY": None}
    )
    assert result.exit_code == 1
    assert "FLOWHOOK_SECRET_KEY is not set" in result.output
    assert "flowhook secrets generate-key" in result.output


def test_sqlite_without_a_key_uses_its_key_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowhook.db'}"
    result = runner.invoke(
        cli, ["migrate", "--database-url", url], env={"FLOWHOOK_SECRET_KEY": None}
    )
    assert result.exit_code == 0, result.output
    ep = asyncio.run(_seed(url, None))
    key = (tmp_path / "flowhook.db.key").read_text().strip()
    got, stored = asyncio.run(_read(url, key))  # the file's key is the one in use
    assert got is not None and got.secret == ep.secret
    assert all(v.startswith(PREFIX) for v in stored)
    with pytest.raises(SecretKeyError):
        asyncio.run(_read(url, generate_key()))
