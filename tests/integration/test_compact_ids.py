"""Migration 0023 (issue 20, ids stored packed), on SQLite and PostgreSQL: a database written
at 0022 with text ids is migrated; every row of every table reads back the same through the
store, the API finds the run, its events and deliveries by their ids, the id columns hold
``pack_id``'s bytes (``bytea`` on PostgreSQL, whose function computes exactly those bytes),
the indexes and foreign keys are all still there, and a downgrade gives the text back."""

from __future__ import annotations

import importlib.util
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa

from flowhook.app import create_app
from flowhook.clock import SystemClock
from flowhook.events import make_event
from flowhook.ids import PREFIXES, new_id, new_secret_id, pack_id
from flowhook.service import Services
from flowhook.store import events as events_store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.tables import (
    deliveries,
    delivery_attempts,
    inbound_dedup,
    run_steps,
    runs,
    signals,
    waits,
)
from flowhook.store.wakeup import Wakeup
from tests.conftest import PG_URL, Receiver
from tests.integration.conftest import text_ids
from tests.integration.test_compact_storage import _downgrade, _everything, _settings

NOW = datetime(2026, 11, 25, 10, 0, 0, 123456, tzinfo=UTC)
_VERSIONS = Path(__file__).parents[2] / "flowhook/store/migrations/versions"


def migration_0023() -> ModuleType:
    """The migration's module (its file name is no Python name)."""
    spec = importlib.util.spec_from_file_location("_m0023", _VERSIONS / "0023_compact_ids.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


M = migration_0023()


def awkward_ids() -> list[str]:
    """Ids of every kind and strings that are none: each form of ``pack_id``."""
    found = [new_id(p) for p in sorted(PREFIXES) for _ in range(20)]
    found += [new_secret_id(p) for p in sorted(PREFIXES) for _ in range(5)]
    found += [f"{p}_{'0' * 26}" for p in PREFIXES] + [f"{p}_7{'z' * 25}" for p in PREFIXES]
    found += [f"{p}_{'z' * 36}" for p in PREFIXES] + [f"hk_{'0' * 36}"]
    found += [
        "", "_", "run", "run_", "run_1", "ws", "wf_x", "fl_1", "ep_1", "hk_1",
        f"run_8{'0' * 25}",  # first digit past 7: 131 bits
        f"run_{'0' * 27}", f"run_{'0' * 35}", f"run_{'0' * 37}",
        f"run_{'i' * 26}", f"run_{'l' * 26}", f"run_{'o' * 26}", f"run_{'u' * 26}",  # not digits
        f"RUN_{'0' * 26}", f"run_{'A' * 26}", f"xyz_{'0' * 26}", f"run__{'0' * 26}",
        f"run_{'0' * 26}\n", f"run_{'0' * 25}\n", f" run_{'0' * 26}",
        "é", "日本_01", "run_😀", "a_b_c", "run_01m89es1rzemqrhvwn9zytakky_x",
    ]  # fmt: skip
    return found


async def _write_at_0022(url: str, receiver_url: str) -> dict[str, Any]:
    """A workspace with a key, an endpoint, a flow, a completed run with a step, its events
    and their deliveries (one with an attempt), a hook with a dedup row, a signal and a
    wait, all written as 0022's code wrote them (text ids); every row as read then."""
    settings = _settings(url)
    with text_ids():
        db = Database(url, secret_key=settings.secret_key)
        await migrate(db, "0022")
        services = Services(db, SystemClock(), settings, Wakeup())
        created = await services.keys.create(Mode.TEST, "acme")
        who = await services.keys.authenticate(f"Bearer {created.key}")
        await services.webhooks.create_endpoint(who, url=receiver_url, events=["flow.completed"])
        flow = await services.flows.create(
            who, {"name": "f", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}
        )
        run_id = (await services.runs.start(who, flow_id=flow.flow_id, payload={"n": 1})).run.run_id
        hook = await services.hooks.create(who, flow_id=flow.flow_id)
        async with db.transaction() as conn:
            await conn.execute(
                sa.update(runs)
                .where(runs.c.run_id == run_id)
                .values(status="completed", steps_executed=1, next_step=1, output={"x": 1},
                        started_at=NOW, finished_at=NOW, duration_ms=3)
            )  # fmt: skip
            await conn.execute(
                run_steps.insert().values(
                    run_id=run_id, idx=0, step_id="a", type="transform", status="completed",
                    attempts=1, started_at=NOW, finished_at=NOW, duration_ms=3,
                    output={"x": 1}, reused=False,
                )
            )  # fmt: skip
            made = [
                make_event("flow.completed", workspace_id=who.workspace_id, mode=Mode.TEST,
                           flow_id=flow.flow_id, run_id=run_id, payload={"x": 1}, now=NOW)
            ]  # fmt: skip
            assert await events_store.insert_events(conn, made) == 1
            await conn.execute(inbound_dedup.insert().values(
                hook_id=hook.id, delivery_key="d1", run_id=run_id, created_at=NOW
            ))  # fmt: skip
            signal_id = new_id("sig")
            await conn.execute(signals.insert().values(
                id=signal_id, workspace_id=who.workspace_id, mode="test", name="go",
                data={}, created_at=NOW, run_id=run_id,
            ))  # fmt: skip
            await conn.execute(waits.insert().values(
                run_id=run_id, idx=0, workspace_id=who.workspace_id, mode="test", name="go",
                match_keys="[]", match_digest="d" * 64, created_at=NOW, signal_id=signal_id,
            ))  # fmt: skip
        listed = await services.webhooks.list_deliveries(who, limit=10, cursor=None, run_id=run_id)
        delivery_id = listed.data[0].id
        async with db.transaction() as conn:
            await conn.execute(delivery_attempts.insert().values(
                delivery_id=delivery_id, number=1, started_at=NOW, finished_at=NOW,
                duration_ms=2, status_code=200,
            ))  # fmt: skip
            await conn.execute(  # delivered: the dispatcher leaves it alone
                sa.update(deliveries)
                .where(deliveries.c.id == delivery_id)
                .values(status="succeeded", attempts=1)
            )
        rows = await _everything(db)
        await db.dispose()
    return {
        "key": created.key, "run_id": run_id, "flow_id": flow.flow_id, "hook_id": hook.id,
        "delivery_id": delivery_id, "rows": rows, "workspace_id": who.workspace_id,
    }  # fmt: skip


async def _stored(url: str) -> dict[str, dict[str, set[str]]]:
    """Each listed column's stored kinds of value (``typeof`` on SQLite, the column's type on
    PostgreSQL), and the names of the indexes and foreign keys."""
    found: dict[str, dict[str, set[str]]] = {}
    if url.startswith("sqlite"):
        raw = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            for table, columns in M.COLUMNS.items():
                found[table] = {
                    c: {r[0] for r in raw.execute(f'SELECT DISTINCT typeof("{c}") FROM "{table}"')}
                    for c in columns
                }
            found["~schema"] = {
                "indexes": {
                    r[0] for r in raw.execute("SELECT name FROM sqlite_schema WHERE type='index'")
                }
            }
            assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        finally:
            raw.close()
        return found
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        for table, columns in M.COLUMNS.items():
            rows = await conn.fetch(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = $1",
                table,
            )
            types = {r["column_name"]: r["data_type"] for r in rows}
            found[table] = {c: {types[c]} for c in columns}
        indexes = await conn.fetch(
            "SELECT indexname || ' ' || indexdef AS d FROM pg_indexes"
            " WHERE schemaname = current_schema()"
        )
        keys = await conn.fetch(
            "SELECT conname || ' ' || pg_get_constraintdef(oid) AS d FROM pg_constraint"
            " WHERE contype IN ('f', 'u', 'p')"
            " AND connamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
        )
        found["~schema"] = {"indexes": {r["d"] for r in indexes}, "keys": {r["d"] for r in keys}}
    finally:
        await conn.close()
    return found


def _kinds(stored: dict[str, dict[str, set[str]]]) -> set[str]:
    return {
        kind
        for table, columns in stored.items()
        if table != "~schema"
        for kinds in columns.values()
        for kind in kinds
    }


async def test_0023_packs_every_id_and_reads_back_the_same(
    empty_url: str, receiver: Receiver
) -> None:
    old = await _write_at_0022(empty_url, receiver.url)
    sqlite = empty_url.startswith("sqlite")
    before = await _stored(empty_url)
    assert _kinds(before) <= ({"text", "null"} if sqlite else {"character varying"})
    db = Database(empty_url, secret_key=_settings(empty_url).secret_key)
    try:
        await migrate(db, "0023")
        after = await _stored(empty_url)
        assert _kinds(after) <= ({"blob", "null"} if sqlite else {"bytea"})
        assert after["~schema"] == before["~schema"]  # every index and key made again
        await migrate(db)  # the later revisions, and the head's checks
        assert await _everything(db) == old["rows"]
        # The bytes are pack_id's.
        async with db.read() as conn:
            stored = (
                await conn.execute(sa.text("SELECT run_id, workspace_id, flow_id FROM runs"))
            ).one()
            hook = (await conn.execute(sa.text("SELECT hook_id FROM inbound_dedup"))).scalar()
        assert tuple(bytes(v) for v in stored) == (
            pack_id(old["run_id"]), pack_id(old["workspace_id"]), pack_id(old["flow_id"])
        )  # fmt: skip
        assert hook is not None and bytes(hook) == pack_id(old["hook_id"])
        assert len(bytes(hook)) == 24  # a secret id
        # Found by their ids through the API.
        app = create_app(_settings(empty_url))
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://flowhook.test",
                headers={"Authorization": f"Bearer {old['key']}"},
            ) as client,
        ):
            r = await client.get(f"/api/v1/flows/runs/{old['run_id']}")
            assert r.status_code == 200 and r.json()["run_id"] == old["run_id"]
            assert r.json()["flow_id"] == old["flow_id"]
            r = await client.get("/api/v1/webhooks/deliveries", params={"run_id": old["run_id"]})
            assert [d["id"] for d in r.json()["data"]] == [old["delivery_id"]]
            r = await client.get(f"/api/v1/hooks/{old['hook_id']}")
            assert r.status_code == 200 and r.json()["id"] == old["hook_id"]
        # Back to 0022: the text again, the same rows.
        await _downgrade(db, "0022")
        await db.dispose()
        back = await _stored(empty_url)
        assert _kinds(back) <= ({"text", "null"} if sqlite else {"character varying"})
        assert back["~schema"] == before["~schema"]
        with text_ids():
            db = Database(empty_url, secret_key=_settings(empty_url).secret_key)
            rows = await _everything(db)
            await db.dispose()
        # The app's start (above) may have noted how far retention cleared events meanwhile.
        assert {**rows, "retention_marks": []} == old["rows"]
    finally:
        await db.dispose()


def _dump(path: Path) -> dict[str, list[Any]]:
    raw = sqlite3.connect(path)
    try:
        return {
            t: sorted(raw.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in M.COLUMNS
        }
    finally:
        raw.close()


async def test_0023_on_sqlite_runs_again_and_leaves_packed_rows_alone(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Run twice (or over rows written packed already, as a process of the new version may
    have done), the SQLite conversion changes nothing more."""
    path = tmp_path / "old.db"
    old = await _write_at_0022(f"sqlite:///{path}", receiver.url)
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:  # one run packed by hand first: a mix of both forms
            conn.exec_driver_sql(
                "UPDATE runs SET run_id = ? WHERE run_id = ?",
                (pack_id(old["run_id"]), old["run_id"]),
            )
            conn.exec_driver_sql(
                "UPDATE run_steps SET run_id = ? WHERE run_id = ?",
                (pack_id(old["run_id"]), old["run_id"]),
            )
        with engine.begin() as conn:
            M.sqlite_convert(conn)
        once = _dump(path)
        with engine.begin() as conn:
            M.sqlite_convert(conn)
        assert _dump(path) == once
        assert not any(
            isinstance(v, str) and (v.startswith("run_") or v.startswith("ws_"))
            for rows in once.values()
            for row in rows
            for v in row
        )
    finally:
        engine.dispose()
    db = Database(f"sqlite:///{path}", secret_key=_settings(f"sqlite:///{path}").secret_key)
    try:
        await migrate(db, "0023")  # 0023 itself, over what is already packed
        assert _dump(path) == once
        assert await _everything(db) == old["rows"]
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_the_postgresql_function_makes_pack_id_s_bytes(pg_url: str) -> None:
    assert PG_URL
    values = awkward_ids()
    conn = await asyncpg.connect(PG_URL.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute(M.PG_PACK)
        await conn.execute(M.PG_UNPACK)
        rows = await conn.fetch(
            "SELECT v, pg_temp.flowhook_pack_id(v) AS packed,"
            " pg_temp.flowhook_unpack_id(pg_temp.flowhook_pack_id(v)) AS back"
            " FROM unnest($1::text[]) AS v",
            values,
        )
    finally:
        await conn.close()
    assert len(rows) == len(values)
    for row in rows:
        assert (row["v"], bytes(row["packed"])) == (row["v"], pack_id(row["v"]))
        assert row["back"] == row["v"]
