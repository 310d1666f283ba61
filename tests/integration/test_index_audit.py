"""Migration 0022 (issue 20, the indexes a run pays for), on SQLite and PostgreSQL: a database
written at 0020 is upgraded with its rows kept; the Idempotency-Key's unique index is
partial and still refuses a key used twice; a run's deliveries are found through its events
now that ``ix_deliveries_run_id`` is gone, and the API reads back what it read before."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from flowhook.app import create_app
from flowhook.clock import SystemClock
from flowhook.events import make_event
from flowhook.ids import new_id
from flowhook.service import Services
from flowhook.store import events as events_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.tables import run_steps, runs
from flowhook.store.wakeup import Wakeup
from tests.conftest import Receiver
from tests.integration.conftest import text_ids
from tests.integration.test_compact_storage import _settings

NOW = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
UQ = "uq_runs_workspace_id_mode_idempotency_key"


async def _write_at_0020(url: str, receiver_url: str) -> dict[str, Any]:
    """:func:`_write_at_0020_text_ids` with the code of the time: ids as text (0023 packs
    them)."""
    with text_ids():
        return await _write_at_0020_text_ids(url, receiver_url)


async def _write_at_0020_text_ids(url: str, receiver_url: str) -> dict[str, Any]:
    """Three runs as 0020 stored them (one started with an Idempotency-Key, one with a step),
    each with a ``flow.completed`` event delivered to an endpoint; what the API read then."""
    settings = _settings(url)
    db = Database(url, secret_key=settings.secret_key)
    await migrate(db, "0020")
    services = Services(db, SystemClock(), settings, Wakeup())
    created = await services.keys.create(Mode.TEST, "acme")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    await services.webhooks.create_endpoint(who, url=receiver_url, events=["flow.completed"])
    flow = await services.flows.create(
        who, {"name": "f", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}
    )
    body = {"n": 1}
    keyed = await services.runs.start(who, flow_id=flow.flow_id, payload=body, idempotency_key="k1")
    plain = [
        (await services.runs.start(who, flow_id=flow.flow_id, payload={"n": n})).run.run_id
        for n in (2, 3)
    ]
    run_ids = [keyed.run.run_id, *plain]
    async with db.transaction() as conn:  # they ran and completed, as 0020 stored it
        await conn.execute(
            sa.update(runs)
            .where(runs.c.run_id.in_(run_ids))
            .values(
                status="completed",
                steps_executed=1,
                next_step=1,
                output={"x": 1},
                started_at=NOW,
                finished_at=NOW,
                duration_ms=3,
            )
        )
        await conn.execute(
            run_steps.insert().values(
                run_id=plain[0],
                idx=0,
                step_id="a",
                type="transform",
                status="completed",
                attempts=1,
                started_at=NOW,
                finished_at=NOW,
                duration_ms=3,
                output={"x": 1},
                reused=False,
            )
        )
        made = [
            make_event(
                "flow.completed",
                workspace_id=who.workspace_id,
                mode=Mode.TEST,
                flow_id=flow.flow_id,
                run_id=run_id,
                payload={"x": i},
                now=NOW,
            )
            for i, run_id in enumerate(run_ids)
        ]
        assert await events_store.insert_events(conn, made) == 3
    before = {
        run_id: (
            await services.runs.get(who, run_id),
            [
                d.id
                for d in (
                    await services.webhooks.list_deliveries(
                        who, limit=10, cursor=None, run_id=run_id
                    )
                ).data
            ],
        )
        for run_id in run_ids
    }
    await db.dispose()
    return {"key": created.key, "flow_id": flow.flow_id, "body": body, "before": before}


async def _schema(url: str) -> dict[str, str]:
    """Each index of runs and deliveries with its definition."""
    if url.startswith("sqlite"):
        raw = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            rows = raw.execute(
                "SELECT name, coalesce(sql, '') FROM sqlite_schema WHERE type IN ('index', 'table')"
                " AND tbl_name IN ('runs', 'deliveries')"
            ).fetchall()
            assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        finally:
            raw.close()
        return dict(rows)
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('runs', 'deliveries')"
        )
        unique = await conn.fetch("SELECT conname FROM pg_constraint WHERE contype = 'u'")
        assert UQ not in [r["conname"] for r in unique]
    finally:
        await conn.close()
    return {name: sql for name, sql in rows}


async def test_0022_keeps_the_rows_and_the_reads(empty_url: str, receiver: Receiver) -> None:
    old = await _write_at_0020(empty_url, receiver.url)
    app = create_app(_settings(empty_url))  # migrates to the head on start
    async with app.router.lifespan_context(app):
        services: Services = app.state.services
        who = await services.keys.authenticate(f"Bearer {old['key']}")
        for run_id, (run, delivered) in old["before"].items():
            assert await services.runs.get(who, run_id) == run
            listed = await services.webhooks.list_deliveries(
                who, limit=10, cursor=None, run_id=run_id
            )
            assert [d.id for d in listed.data] == delivered and len(delivered) == 1
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://flowhook.test",
            headers={"Authorization": f"Bearer {old['key']}"},
        ) as client:
            for run_id, (_, delivered) in old["before"].items():
                r = await client.get("/api/v1/webhooks/deliveries", params={"run_id": run_id})
                assert [d["id"] for d in r.json()["data"]] == delivered
            # The key still names its run, and another body under it is still refused.
            execute = {"flow_id": old["flow_id"], "payload": old["body"]}
            keyed = next(iter(old["before"]))
            r = await client.post(
                "/api/v1/flows/execute", json=execute, headers={"Idempotency-Key": "k1"}
            )
            assert r.status_code == 202 and r.json()["run_id"] == keyed
            assert r.headers.get("idempotent-replayed") == "true"
            other = {**execute, "payload": {"n": 9}}
            r = await client.post(
                "/api/v1/flows/execute", json=other, headers={"Idempotency-Key": "k1"}
            )
            assert (r.status_code, r.json()["code"]) == (409, "idempotency_conflict")
            # Runs without a key are as many as were sent.
            fresh = {
                (await client.post("/api/v1/flows/execute", json=execute)).json()["run_id"]
                for _ in range(2)
            }
            assert len(fresh) == 2 and keyed not in fresh
        # The index alone refuses a key taken meanwhile (what a concurrent accept meets).
        run = await services.runs.get(who, keyed)
        twin = replace(run, run_id=new_id("run"), steps=[])
        with pytest.raises(sa_exc.IntegrityError):
            async with services.db.transaction() as conn:
                await runs_store.insert_run(conn, twin, idempotency_key="k1", request_hash="x")
    schema = await _schema(empty_url)
    assert "ix_deliveries_run_id" not in schema
    assert "ix_deliveries_event_id" in schema and "ix_runs_finished" in schema
    assert "idempotency_key IS NOT NULL" in schema[UQ] and "UNIQUE" in schema[UQ].upper()
    if empty_url.startswith("sqlite"):
        assert "UNIQUE" not in schema["runs"].upper()
        assert not any(name.startswith("sqlite_autoindex_runs_2") for name in schema)
