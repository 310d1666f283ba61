"""What a run stores (issue 20), on SQLite and PostgreSQL: an event's body is rebuilt from its
row byte for byte, and migration 0020 converts a database written by the version before it
so that the API reads back the same, and a replay sends (and signs) the same bytes; migration
0021 makes SQLite's timestamps integer microseconds, every one read back the same."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import sqlalchemy as sa
from alembic import command
from standardwebhooks.webhooks import Webhook

from flowhook.app import create_app
from flowhook.clock import SystemClock, isoformat
from flowhook.config import Settings
from flowhook.events import make_event
from flowhook.ids import new_id
from flowhook.service import Services
from flowhook.store import events as events_store
from flowhook.store.db import Database
from flowhook.store.migrate import alembic_config, migrate
from flowhook.store.models import Mode, envelope
from flowhook.store.tables import events, metadata, run_steps, runs
from flowhook.store.types import UTCDateTime, from_micros
from flowhook.store.wakeup import Wakeup
from tests.conftest import Receiver
from tests.integration.conftest import text_ids
from tests.support import secret_key_for

NOW = datetime(2026, 11, 20, 10, 15, 30, 123456, tzinfo=UTC)


def test_the_rebuilt_envelope_is_the_body_make_event_always_wrote() -> None:
    """The body as the store sent it before 0020 (the envelope serialised whole) and the one
    rebuilt around the stored payload are the same bytes, for awkward payloads too."""
    for payload in (
        {},
        {"n": 1, "f": 2.5, "big": 2**63 - 1, "neg": -0.0, "none": None},
        {"text": 'quote " backslash \\ nl \n tab \t é 日本 \u2028 \U0001f600', "list": [1, [2]]},
        {"nested": {"a": {"b": {"c": [True, False, None]}}}},
    ):
        for flow_id, run_id in (("wf_1", "run_1"), (None, None)):
            e = make_event(
                "flow.completed", workspace_id="ws", mode=Mode.TEST, flow_id=flow_id,
                run_id=run_id, payload=payload, now=NOW,
            )  # fmt: skip
            whole = orjson.dumps(
                {
                    "event": "flow.completed",
                    "flow_id": flow_id,
                    "run_id": run_id,
                    "timestamp": isoformat(NOW),
                    "payload": payload,
                }
            )
            assert e.body == whole and e.stored_body is None and e.to_row()["body"] is None
            assert e.payload == orjson.dumps(payload)


async def test_events_read_back_with_the_bytes_written(db: Database) -> None:
    kinds = ("flow.started", "flow.step_completed", "flow.completed")
    written = [
        make_event(
            t,
            workspace_id="ws",
            mode=Mode.TEST,
            flow_id="wf_1",
            run_id="run_1",
            payload={"i": i, "s": "é\n"},
            now=NOW + timedelta(microseconds=i),
        )
        for i, t in enumerate(kinds)
    ]
    async with db.transaction() as conn:
        await events_store.insert_events(conn, written)
    async with db.read() as conn:
        back = await events_store.list_events_for_run(conn, "run_1")
        stored = (await conn.execute(sa.select(events.c.body, events.c.payload))).all()
    assert [e.body for e in back] == [e.body for e in written]
    assert all(row.body is None for row in stored)  # only the payload is stored
    assert sorted(bytes(row.payload) for row in stored) == sorted(e.payload for e in written)


# -- migration 0020 on a database written by the version before it --------------------------


OLD_EVENTS = sa.table(
    "events",
    *(sa.column(c) for c in ("id", "workspace_id", "mode", "type", "flow_id", "run_id")),
    sa.column("created_at", UTCDateTime()),
    sa.column("body", sa.LargeBinary()),
)
"""``events`` as 0018 left it: the whole body stored."""


def _settings(url: str) -> Settings:
    return Settings(
        database_url=url,
        poll_interval=0.2,
        sqlite_synchronous="NORMAL",
        allow_private_targets=True,
        webhook_retry_schedule="0.1",
        webhook_timeout=2.0,
        secret_key=secret_key_for(url),
    )


def _timestamp_columns(raw: sqlite3.Connection) -> list[tuple[str, str]]:
    """(table, column) of every ``DATETIME`` column of a SQLite database."""
    tables = raw.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return [
        (table, row[1])
        for (table,) in tables
        for row in raw.execute(f'PRAGMA table_info("{table}")')
        if row[2] == "DATETIME"
    ]


def timestamps_as_text(path: str) -> None:
    """Every timestamp of a SQLite database (this code writes integer microseconds) made
    the text that versions before 0021 stored (SQLAlchemy's, naive UTC)."""
    raw = sqlite3.connect(path)
    try:
        for table, column in _timestamp_columns(raw):
            for (value,) in raw.execute(
                f'SELECT DISTINCT "{column}" FROM "{table}" WHERE typeof("{column}") = \'integer\''
            ).fetchall():
                text = from_micros(value).replace(tzinfo=None).isoformat(" ", "microseconds")
                raw.execute(
                    f'UPDATE "{table}" SET "{column}" = ? WHERE "{column}" = ?', (text, value)
                )
        raw.commit()
    finally:
        raw.close()


def _stored_types(path: str) -> dict[str, int]:
    """How many timestamps of a SQLite database are stored as each of SQLite's types."""
    raw = sqlite3.connect(path)
    try:
        found: dict[str, int] = {}
        for table, column in _timestamp_columns(raw):
            for kind, n in raw.execute(
                f'SELECT typeof("{column}"), count(*) FROM "{table}" GROUP BY 1'
            ).fetchall():
                found[kind] = found.get(kind, 0) + n
        return found
    finally:
        raw.close()


async def _write_as_0018(url: str, receiver_url: str) -> dict[str, Any]:
    """:func:`_write_as_0018_text_ids` with the code of the time: ids as text (0023 packs
    them)."""
    with text_ids():
        return await _write_as_0018_text_ids(url, receiver_url)


async def _write_as_0018_text_ids(url: str, receiver_url: str) -> dict[str, Any]:
    """A workspace with a completed run's events as the version before 0020 stored them (one
    of them with a body the envelope would not rebuild: kept as it is), a delivery of each
    (one failed after two attempts, with its log), and an endpoint; what was written."""
    settings = _settings(url)
    db = Database(url, secret_key=settings.secret_key)
    await migrate(db, "0018")
    services = Services(db, SystemClock(), settings, Wakeup())
    created = await services.keys.create(Mode.TEST, "acme")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    ep = await services.webhooks.create_endpoint(who, url=receiver_url, events=["flow.completed"])
    flow = await services.flows.create(
        who, {"name": "f", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}
    )
    started = await services.runs.start(who, flow_id=flow.flow_id, payload={"n": 1})
    run_id = started.run.run_id
    async with db.transaction() as conn:  # it ran its step and completed, as 0018 stored it
        await conn.execute(
            sa.update(runs)
            .where(runs.c.run_id == run_id)
            .values(
                status="completed", steps_executed=1, next_step=1, output={"x": 1},
                finished_at=NOW, duration_ms=3,
            )
        )  # fmt: skip
        await conn.execute(
            run_steps.insert().values(
                run_id=run_id, idx=0, step_id="a", type="transform", status="completed",
                attempts=1, started_at=NOW, finished_at=NOW, duration_ms=3, output={"x": 1},
                reused=False,
            )
        )  # fmt: skip
    bodies: dict[str, bytes] = {}
    rows = []
    for i, (kind, payload) in enumerate(
        (
            ("flow.started", {"status": "running", "trigger": "api", "flow_version": 1}),
            ("flow.step_completed", {"step_id": "a", "output": {"x": 1, "é": "日本\n"}}),
            ("flow.completed", {"x": 1, "status": "completed", "steps_executed": 1}),
        )
    ):
        at = NOW + timedelta(milliseconds=i, microseconds=7)
        whole = {
            "event": kind, "flow_id": flow.flow_id, "run_id": run_id,
            "timestamp": isoformat(at), "payload": payload,
        }  # fmt: skip
        event_id = new_id("evt")
        bodies[event_id] = orjson.dumps(whole)
        rows.append((event_id, kind, at))
    # One body not as make_event writes it (spaces after separators): kept byte for byte.
    odd_id = new_id("evt")
    odd_at = NOW + timedelta(milliseconds=9)
    bodies[odd_id] = json.dumps(
        {"event": "flow.completed", "flow_id": flow.flow_id, "run_id": run_id,
         "timestamp": isoformat(odd_at), "payload": {"odd": True}}
    ).encode()  # fmt: skip
    rows.append((odd_id, "flow.completed", odd_at))
    deliveries: dict[str, str] = {}
    async with db.transaction() as conn:
        for event_id, kind, at in rows:
            await conn.execute(
                OLD_EVENTS.insert().values(
                    id=event_id, workspace_id=who.workspace_id, mode="test", type=kind,
                    flow_id=flow.flow_id, run_id=run_id, created_at=at, body=bodies[event_id],
                )
            )  # fmt: skip
            delivery_id = new_id("dlv")
            deliveries[event_id] = delivery_id
            finished = at + timedelta(seconds=1)
            failed = event_id == odd_id
            await conn.execute(
                sa.text(
                    "INSERT INTO deliveries (id, event_id, endpoint_id, workspace_id, mode,"
                    " event_type, run_id, status, attempts, next_attempt_at, due_at,"
                    " last_status_code, created_at, finished_at) VALUES (:id, :event_id,"
                    " :endpoint_id, :ws, 'test', :type, :run_id, :status, :attempts, :next,"
                    " :next, :code, :created, :finished)"
                ).bindparams(
                    sa.bindparam("next", type_=UTCDateTime()),
                    sa.bindparam("created", type_=UTCDateTime()),
                    sa.bindparam("finished", type_=UTCDateTime()),
                ),
                {
                    "id": delivery_id, "event_id": event_id, "endpoint_id": ep.id,
                    "ws": who.workspace_id, "type": kind, "run_id": run_id,
                    "status": "failed" if failed else "succeeded", "attempts": 2 if failed else 1,
                    "next": finished, "code": 500 if failed else 200, "created": at,
                    "finished": finished,
                },
            )  # fmt: skip
            for number in range(1, 3 if failed else 2):
                await conn.execute(
                    sa.text(
                        "INSERT INTO delivery_attempts (delivery_id, number, started_at,"
                        " finished_at, duration_ms, address, status_code, response_excerpt)"
                        " VALUES (:d, :n, :s, :f, 12, '127.0.0.1', :code, :excerpt)"
                    ).bindparams(
                        sa.bindparam("s", type_=UTCDateTime()),
                        sa.bindparam("f", type_=UTCDateTime()),
                    ),
                    {
                        "d": delivery_id, "n": number, "s": at, "f": finished,
                        "code": 500 if failed else 200, "excerpt": f"answer {number}",
                    },
                )  # fmt: skip
    await db.dispose()
    if url.startswith("sqlite"):
        timestamps_as_text(url.removeprefix("sqlite:///"))
    return {
        "key": created.key, "secret": ep.secret, "run_id": run_id, "bodies": bodies,
        "deliveries": deliveries, "odd": odd_id,
    }  # fmt: skip


async def test_0020_converts_events_and_the_api_reads_back_the_same(
    empty_url: str, receiver: Receiver
) -> None:
    old = await _write_as_0018(empty_url, receiver.url)
    app = create_app(_settings(empty_url))  # migrates to the head on start
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://flowhook.test",
            headers={"Authorization": f"Bearer {old['key']}"},
        ) as client:
            for event_id, body in old["bodies"].items():
                r = await client.get(f"/api/v1/events/{event_id}")
                assert r.status_code == 200, r.text
                assert b'"body":' + body + b"}" in r.content  # the exact bytes
                d = await client.get(f"/api/v1/webhooks/deliveries/{old['deliveries'][event_id]}")
                assert d.status_code == 200
                assert d.content.endswith(b'"body":' + body + b"}")
                log = d.json()["attempt_log"]
                assert [a["response_excerpt"] for a in log] == [
                    f"answer {n}" for n in range(1, len(log) + 1)
                ]
                assert log[0]["address"] == "127.0.0.1" and log[0]["duration_ms"] == 12
            run = (await client.get(f"/api/v1/flows/runs/{old['run_id']}")).json()
            assert run["status"] == "completed" and run["output"] == {"x": 1}
            [step] = run["steps"]
            assert step["id"] == "a" and step["output"] == {"x": 1}
            assert step["status"] == "completed" and step["duration_ms"] == 3
            listed = (await client.get("/api/v1/events", params={"run_id": old["run_id"]})).json()
            assert {e["id"] for e in listed["data"]} == set(old["bodies"])
            for e in listed["data"]:
                assert orjson.dumps(e["body"]) == orjson.dumps(orjson.loads(old["bodies"][e["id"]]))
            # A replay of the failed delivery sends the stored bytes, signed as before.
            failed = old["deliveries"][old["odd"]]
            r = await client.post(f"/api/v1/webhooks/deliveries/{failed}/replay")
            assert r.status_code == 202, r.text
            async with asyncio.timeout(10):
                while not receiver.requests:
                    await asyncio.sleep(0.02)
    [sent] = receiver.requests
    assert sent["body"] == old["bodies"][old["odd"]]
    expected = hmac.new(old["secret"].encode(), sent["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(sent["headers"]["X-Service-Signature"], expected)
    assert Webhook(old["secret"]).verify(sent["body"], sent["headers"])
    # Stored: the odd body kept whole, the others as their payload alone.
    db = Database(empty_url, secret_key=_settings(empty_url).secret_key)
    try:
        async with db.read() as conn:
            stored = {r.id: r for r in (await conn.execute(sa.select(events))).all()}
    finally:
        await db.dispose()
    if empty_url.startswith("sqlite"):  # the three keyed tables without rowids now
        raw = sqlite3.connect(empty_url.removeprefix("sqlite:///"))
        try:
            schema = dict(raw.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'table'"))
        finally:
            raw.close()
        for table in ("events", "run_steps", "delivery_attempts"):
            assert schema[table].rstrip().endswith("WITHOUT ROWID"), table
        assert "WITHOUT ROWID" not in schema["runs"]
        kinds = _stored_types(empty_url.removeprefix("sqlite:///"))  # 0021: no text left
        assert set(kinds) <= {"integer", "null"} and kinds["integer"] > 20, kinds
    for event_id, body in old["bodies"].items():
        row = stored[event_id]
        if event_id == old["odd"]:
            assert bytes(row.body) == body
        else:
            assert row.body is None
            assert bytes(row.payload) == orjson.dumps(orjson.loads(body)["payload"])
            rebuilt = envelope(row.type, row.flow_id, row.run_id, row.created_at, row.payload)
            assert rebuilt == body


# -- migration 0021: SQLite's timestamps from text to integer microseconds --------------------


def _due_at_defaults(path: str) -> list[str]:
    """``runs.due_at``'s and ``deliveries.due_at``'s defaults in SQLite's schema (0008 added
    the columns with one); the database checked whole first."""
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return [
            next(row[4] for row in raw.execute(f"PRAGMA table_info({t})") if row[1] == "due_at")
            for t in ("runs", "deliveries")
        ]
    finally:
        raw.close()


async def _downgrade(db: Database, revision: str) -> None:
    def go(sync_conn: Any) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = sync_conn
        command.downgrade(cfg, revision)

    async with db.writer.begin() as conn:
        await conn.run_sync(go)


async def _everything(db: Database) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, by primary key, as the store reads it; without what
    revisions after 0024 added (:data:`ADDED_LATER`), which the tests of older revisions
    compare across their upgrade and downgrade."""
    found = {}
    async with db.read() as conn:
        for table in metadata.sorted_tables:
            if table.name in ADDED_LATER:
                continue
            columns = [c for c in table.c if (table.name, c.name) not in ADDED_LATER]
            q = sa.select(*columns).order_by(*(table.primary_key.columns or table.c))
            found[table.name] = [dict(r._mapping) for r in (await conn.execute(q)).all()]
    return found


ADDED_LATER = {
    "run_trees", ("runs", "tree_run_id"), "tasks", "workers", ("flows", "slug"), "step_secrets",
    ("flows", "paused_at"), ("webhook_endpoints", "paused_at"), ("api_keys", "label"),
    ("api_keys", "last_used_at"),
}  # fmt: skip
"""Tables and (table, column)s of revisions after 0024 (0025: run trees; 0027: tasks; 0028:
flows' slugs; 0029: step secrets; 0030: flows' pause; 0031: endpoints' pause; 0032: keys'
labels and last use)."""


def _unordered(rows: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {table: sorted(found, key=repr) for table, found in rows.items()}


ODD = {
    "2026-01-01": datetime(2026, 1, 1, tzinfo=UTC),  # a date alone
    "2026-11-20 10:15:30": datetime(2026, 11, 20, 10, 15, 30, tzinfo=UTC),  # no fraction
    "2026-11-20T11:15:30.5+01:00": datetime(2026, 11, 20, 10, 15, 30, 500000, tzinfo=UTC),
}
"""Text a hand-made row (or 0008's default) may hold, not in SQLAlchemy's form, and what it is."""


async def test_0021_reads_back_every_timestamp_the_same(empty_url: str, receiver: Receiver) -> None:
    """A database with a delivered run (and a held far-future time, and times before 1970
    and within a microsecond of a second's end), taken back to 0020's text on SQLite and
    migrated again: every row of every table reads back the same, no text is left, and the
    integers sort as the times do. On PostgreSQL, 0021 changes nothing."""
    settings = _settings(empty_url)
    db = Database(empty_url, secret_key=settings.secret_key)
    await migrate(db)
    services = Services(db, SystemClock(), settings, Wakeup())
    created = await services.keys.create(Mode.TEST, "acme")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    await services.webhooks.create_endpoint(who, url=receiver.url, events=["flow.completed"])
    flow = await services.flows.create(
        who, {"name": "f", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}
    )
    await db.dispose()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://flowhook.test",
            headers={"Authorization": f"Bearer {created.key}"},
        ) as client:
            r = await client.post(
                "/api/v1/flows/execute", json={"flow_id": flow.flow_id, "payload": {"n": 1}}
            )
            assert r.status_code == 202, r.text
            async with asyncio.timeout(10):
                while not receiver.requests:
                    await asyncio.sleep(0.02)
                while True:  # the delivery's outcome is written after the answer
                    listed = (await client.get("/api/v1/webhooks/deliveries")).json()["data"]
                    if listed and all(d["status"] == "succeeded" for d in listed):
                        break
                    await asyncio.sleep(0.02)
    db = Database(empty_url, secret_key=settings.secret_key)
    edges = {  # run_id: (queued_at, finished_at)
        "run_held": (datetime(9999, 1, 1, tzinfo=UTC), None),
        "run_1969": (datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC), None),
        "run_edge": (NOW.replace(microsecond=999999), NOW.replace(microsecond=999500)),
    }
    try:
        async with db.transaction() as conn:
            for run_id, (queued, finished) in edges.items():
                await conn.execute(
                    runs.insert().values(
                        run_id=run_id, workspace_id=who.workspace_id, mode="test",
                        flow_id=flow.flow_id, flow_version=1, trigger="api", status="queued",
                        payload={}, queued_at=queued, available_at=queued, due_at=queued,
                        finished_at=finished,
                    )
                )  # fmt: skip
        before = await _everything(db)
        assert len(before["runs"]) == 4 and before["deliveries"] and before["delivery_attempts"]
        assert len(before["events"]) >= 3 and before["run_steps"]
        if not empty_url.startswith("sqlite"):
            await _downgrade(db, "0020")
            await db.dispose()
            with text_ids():  # read as the code of 0020 did: ids as text
                at_0020 = Database(empty_url, secret_key=settings.secret_key)
                try:
                    # The same rows; in the text's order (the test's own run ids such as
                    # ``run_1969`` are no ids: packed, they sort before every real one).
                    assert _unordered(await _everything(at_0020)) == _unordered(before)
                finally:
                    await at_0020.dispose()
            db = Database(empty_url, secret_key=settings.secret_key)
            await migrate(db)
            assert await _everything(db) == before
            return
        path = empty_url.removeprefix("sqlite:///")
        assert set(_stored_types(path)) == {"integer", "null"}
        await _downgrade(db, "0020")
        await db.dispose()
        assert set(_stored_types(path)) == {"text", "null"}
        assert _due_at_defaults(path) == ["'1970-01-01 00:00:00'"] * 2  # 0008's, as it was
        raw = sqlite3.connect(path)
        try:  # the text SQLAlchemy wrote, and odd text it did not write
            assert raw.execute(
                "SELECT queued_at FROM runs WHERE run_id = 'run_edge'"
            ).fetchall() == [("2026-11-20 10:15:30.999999",)]
            for (text, at), run_id in zip(ODD.items(), edges, strict=True):
                raw.execute("UPDATE runs SET started_at = ? WHERE run_id = ?", (text, run_id))
                for row in before["runs"]:
                    if row["run_id"] == run_id:
                        row["started_at"] = at
            raw.commit()
        finally:
            raw.close()
        db = Database(empty_url, secret_key=settings.secret_key)
        await migrate(db)
        assert await _everything(db) == before
        kinds = _stored_types(path)
        assert set(kinds) == {"integer", "null"} and kinds["integer"] > 25, kinds
        assert _due_at_defaults(path) == ["0"] * 2  # the same instant, as an integer
        async with db.read() as conn:  # integers sort as the times
            order = (await conn.execute(sa.select(runs.c.run_id).order_by(runs.c.queued_at))).all()
        by_time = sorted(before["runs"], key=lambda r: r["queued_at"])
        assert [r.run_id for r in order] == [r["run_id"] for r in by_time]
    finally:
        await db.dispose()
