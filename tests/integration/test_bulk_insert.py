"""SQLite's bulk path stores exactly what SQLAlchemy's executemany stores, byte for byte, for
inserts, upserts and updates of every table the store writes through it, and raises the same
errors (an idempotency race still surfaces as an IntegrityError). A column type it has no
conversion for fails the write instead of storing something else."""

from __future__ import annotations

import ast
import shutil
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy.exc as sa_exc
from sqlalchemy import Column, Enum, MetaData, Numeric, String, Table

from flowhook.ids import pack_id
from flowhook.store import bulk, driver, pg_driver, sqlite_driver
from flowhook.store import tables as store_tables
from flowhook.store.db import Database
from flowhook.store.tables import (
    approvals,
    deliveries,
    delivery_attempts,
    events,
    run_steps,
    runs,
    signals,
    tasks,
    waits,
)
from flowhook.store.types import to_micros

STORE = Path(bulk.__file__).parent

NOW = datetime(2026, 11, 22, 10, 15, 30, 123456, tzinfo=UTC)
ELSEWHERE = timezone(timedelta(hours=-5))


def _runs() -> list[dict[str, Any]]:
    return [
        {
            "run_id": f"run_{i}", "workspace_id": "ws_1", "mode": "test", "flow_id": "wf_1",
            "flow_version": 1, "trigger": "api", "status": "queued",
            "payload": {"n": i, "text": "é ✓", "nested": [1, 2.5, None, True]},
            "queued_at": NOW + timedelta(seconds=i),
            "available_at": (NOW + timedelta(microseconds=-NOW.microsecond)).astimezone(ELSEWHERE),
            "due_at": NOW,
            "idempotency_key": None if i else "key-0", "request_hash": None,
            "next_step": i, "rerun_of": "run_x" if i == 2 else None,
            # flow control's columns (SmallInteger among them)
            "priority": i - 1, "concurrency_key": "cus_42" if i else "",
            "throttle_key": None, "debounce_key": "d" if i == 2 else None,
            "held": "debounce" if i == 2 else None,
        }
        for i in range(3)
    ]  # fmt: skip


def _steps(status: str) -> list[dict[str, Any]]:
    return [
        {
            "run_id": "run_1", "idx": i, "step_id": f"s{i}", "type": "transform",
            "status": status, "attempts": 1, "started_at": NOW,
            "finished_at": None if i else NOW, "duration_ms": 3,
            "output": None if i == 1 else {"x": i}, "error": None, "reused": i == 2,
        }
        for i in range(3)
    ]  # fmt: skip


def _events() -> list[dict[str, Any]]:
    return [
        {
            "id": f"evt_{i}", "workspace_id": "ws_1", "mode": "test", "type": "flow.started",
            "flow_id": "wf_1", "run_id": "run_1", "created_at": NOW, "payload": b'{"a":"\\u00e9"}',
            "body": None if i == 0 else b'{"kept": true}',
        }
        for i in range(2)
    ]  # fmt: skip


async def _write(db: Database) -> None:
    async with db.transaction() as conn:
        await bulk.insert(conn, runs, _runs())
        await bulk.insert(conn, run_steps, _steps("running"), update_on_conflict=("run_id", "idx"))
        await bulk.insert(conn, events, _events())
    async with db.transaction() as conn:  # an upsert over existing rows, and updates by key
        await bulk.insert(
            conn, run_steps, _steps("completed"), update_on_conflict=("run_id", "idx")
        )
        await bulk.update(
            conn,
            runs,
            [
                (
                    {"status": "completed", "finished_at": NOW.astimezone(ELSEWHERE),
                     "output": None if i else {"z": [i]}, "error": None, "lease_owner": None},
                    {"run_id": f"run_{i}", "status": "queued"},
                )
                for i in range(3)
            ],
        )  # fmt: skip
    await _write_deliveries(db)
    await _write_waiting(db)


async def _write_waiting(db: Database) -> None:
    """As signals, ``wait`` steps and ``approval`` steps write them."""
    async with db.transaction() as conn:
        await bulk.insert(conn, signals, [
            {"id": f"sig_{i}", "workspace_id": "ws_1", "mode": "test", "name": "order.paid",
             "data": {"order_id": f"o{i}", "amount": 2.5, "note": "é ✓", "none": None},
             "run_id": "run_1" if i else None, "dedup_key": None if i else "evt-0",
             "created_at": NOW.astimezone(ELSEWHERE)}
            for i in range(2)
        ])  # fmt: skip
        rows = [
            {"run_id": f"run_{i}", "idx": 1, "workspace_id": "ws_1", "mode": "test",
             "name": "order.paid", "match_keys": '["order_id"]', "match_digest": "ab" * 32,
             "created_at": NOW, "until": None if i else NOW.astimezone(ELSEWHERE),
             "signal_id": None, "resolved_at": None}
            for i in range(2)
        ]  # fmt: skip
        await bulk.insert(conn, waits, rows)
        await bulk.insert(conn, waits, rows[:1], update_on_conflict=("run_id", "idx"))
        await bulk.update(
            conn, waits, [({"signal_id": "sig_0", "resolved_at": NOW}, {"run_id": "run_0", "idx": 1})]
        )  # fmt: skip
        await bulk.insert(conn, approvals, [
            {"run_id": "run_1", "idx": 2, "workspace_id": "ws_1", "mode": "test",
             "step_id": "manager", "message": "Refund 40 € ?", "created_at": NOW,
             "expires_at": NOW.astimezone(ELSEWHERE), "approve_hash": "a" * 64,
             "reject_hash": "b" * 64}
        ])  # fmt: skip
        await bulk.insert(conn, tasks, [
            {"task_id": f"tsk_{i}", "run_id": f"run_{i}", "idx": 3, "workspace_id": "ws_1",
             "mode": "test", "task": "payments.charge", "root_run_id": "run_0",
             "flow_id": "flw_1", "step_id": "charge", "input": {"amount": 2.5, "é": [i]},
             "status": "queued", "attempt": 0, "available_at": NOW.astimezone(ELSEWHERE),
             "heartbeat_seconds": 30.0, "timeout_seconds": None if i else 1.5,
             "created_at": NOW, "interrupted": [1] if i else None, "worker_id": None,
             "lease_expires_at": None, "attempt_deadline": None, "retryable": bool(i),
             "output": None, "error": None if i else {"message": "m"},
             "traceparent": None, "claimed_at": None, "finished_at": None}
            for i in range(2)
        ])  # fmt: skip


def _deliveries() -> list[dict[str, Any]]:
    return [
        {
            "id": f"dlv_{i}", "event_id": "evt_0", "endpoint_id": "we_1", "workspace_id": "ws_1",
            "mode": "test", "event_type": "flow.started", "run_id": None if i else "run_1",
            "status": "pending", "attempts": 0, "next_attempt_at": NOW.astimezone(ELSEWHERE),
            "due_at": NOW + timedelta(seconds=i), "created_at": NOW, "lease_owner": "w1",
            "lease_expires_at": NOW + timedelta(seconds=30),
        }
        for i in range(3)
    ]  # fmt: skip


async def _write_deliveries(db: Database) -> None:
    """As the outbox writes them: queued (here already leased), an attempt line each, then
    finished by the lease's owner."""
    async with db.transaction() as conn:
        await bulk.insert(conn, deliveries, _deliveries())
        await bulk.insert(
            conn,
            delivery_attempts,
            [{"delivery_id": f"dlv_{i}", "number": 1, "started_at": NOW} for i in range(3)],
        )
    async with db.transaction() as conn:
        await bulk.update(
            conn,
            deliveries,
            [
                (
                    {"status": "delivered" if i else "pending", "last_status_code": 200 if i else None,
                     "last_error": None if i else "answered 503 ✗", "next_attempt_at": NOW,
                     "due_at": NOW, "finished_at": NOW if i else None, "lease_owner": None,
                     "lease_expires_at": None},
                    {"id": f"dlv_{i}", "lease_owner": "w1"},
                )
                for i in range(3)
            ],
        )  # fmt: skip
        await bulk.update(
            conn,
            delivery_attempts,
            [
                (
                    {"started_at": NOW, "finished_at": NOW.astimezone(ELSEWHERE),
                     "duration_ms": 2**40 + i, "address": "127.0.0.1" if i else None,
                     "status_code": 200 if i else None, "response_excerpt": "ok é" if i else "",
                     "error_class": None if i else "timeout", "error_detail": None,
                     "next_attempt_at": None if i else NOW},
                    {"delivery_id": f"dlv_{i}", "number": 1},
                )
                for i in range(3)
            ],
        )  # fmt: skip


WRITTEN = (
    *("runs", "run_steps", "events", "deliveries", "delivery_attempts"),
    *("signals", "waits", "approvals", "tasks"),
)
"""The tables the comparison writes: every one the store writes through ``bulk``."""


ORDER = {"run_steps": "run_id, idx", "events": "id", "delivery_attempts": "delivery_id, number"}
"""The tables without rowids (migration 0019), in their primary key's order."""


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as raw:
        return {
            t: raw.execute(f"SELECT * FROM {t} ORDER BY {ORDER.get(t, 'rowid')}").fetchall()
            for t in WRITTEN
        }


def _timestamp_types(path: Path) -> set[str]:
    """SQLite's types of every timestamp the written tables hold (Python's ``==`` would not
    tell an integer from a float)."""
    found = set()
    with sqlite3.connect(path) as raw:
        for t in WRITTEN:
            for row in raw.execute(f"PRAGMA table_info({t})").fetchall():
                if row[2] == "DATETIME":
                    found |= {k for (k,) in raw.execute(f"SELECT typeof({row[1]}) FROM {t}")}
    return found


async def test_the_sqlite_bulk_path_stores_what_sqlalchemy_stores(
    tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, slow = tmp_path / "fast.db", tmp_path / "slow.db"
    shutil.copy(sqlite_template, fast)
    shutil.copy(sqlite_template, slow)
    db = Database(f"sqlite:///{fast}")
    await _write(db)
    await db.dispose()
    with monkeypatch.context() as m:
        m.setattr(sqlite_driver, "raw_sqlite", lambda _conn: None)  # SQLAlchemy's executemany
        db = Database(f"sqlite:///{slow}")
        await _write(db)
        await db.dispose()
    stored = _dump(fast)
    assert stored == _dump(slow)
    # Timestamps as integer microseconds since the epoch (migration 0021), on both paths.
    assert _timestamp_types(fast) == _timestamp_types(slow) == {"integer", "null"}
    with sqlite3.connect(fast) as raw:
        [(queued, available)] = raw.execute(
            "SELECT queued_at, available_at FROM runs WHERE run_id = ?", (pack_id("run_0"),)
        ).fetchall()
    assert queued == to_micros(NOW) == 1795342530123456  # 2026-11-22 10:15:30.123456 UTC
    assert available == queued - 123456  # given at UTC-5: the same instant
    assert [r[4] for r in stored["run_steps"]] == ["completed"] * 3  # the upsert replaced them
    assert [r[6] for r in stored["runs"]] == ["completed"] * 3  # the updates reached each run
    assert [r[7] for r in stored["deliveries"]] == ["pending", "delivered", "delivered"]
    assert [r[4] for r in stored["delivery_attempts"]] == [2**40, 2**40 + 1, 2**40 + 2]


async def _pg_dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every written table's rows in primary key order; the tables emptied after."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        dumped = {}
        for name in WRITTEN:
            key = ", ".join(c.name for c in store_tables.metadata.tables[name].primary_key)
            rows = await conn.fetch(f"SELECT * FROM {name} ORDER BY {key}")
            dumped[name] = [tuple(r) for r in rows]
        await conn.execute(f"TRUNCATE {', '.join(WRITTEN)} CASCADE")
        return dumped
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_the_postgres_bulk_path_stores_what_sqlalchemy_stores(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's inserts are one ``INSERT … FROM unnest(…)`` on the driver (an upsert
    keeping, of rows that share a key, the last): the rows are those of SQLAlchemy's own
    executemany."""
    await _pg_dump(pg_url)  # whatever an earlier test left
    db = Database(pg_url)
    await _write(db)
    fast = await _pg_dump(pg_url)

    async def through_sqlalchemy(conn: Any, table: Any, columns: Any, conflict: Any, rows: Any):  # type: ignore[no-untyped-def]
        stmt = driver.insert_statement(table, columns, conflict, "postgresql")
        await conn.execute(stmt, list(rows))

    with monkeypatch.context() as m:
        m.setattr(pg_driver, "_insert_pg", through_sqlalchemy)
        await _write(db)
    await db.dispose()
    slow = await _pg_dump(pg_url)
    assert fast == slow
    assert all(fast[name] for name in WRITTEN)
    assert [r[4] for r in fast["run_steps"]] == ["completed"] * 3  # the upsert replaced them


async def test_a_duplicate_key_is_an_integrity_error_and_rolls_back(
    tmp_path: Path, sqlite_template: Path
) -> None:
    path = tmp_path / "dup.db"
    shutil.copy(sqlite_template, path)
    db = Database(f"sqlite:///{path}")
    async with db.transaction() as conn:
        await bulk.insert(conn, runs, _runs()[:1])

    async def new_rows_then_a_duplicate() -> None:
        async with db.transaction() as conn:
            await bulk.insert(conn, runs, _runs()[1:])  # written, then rolled back with…
            await bulk.insert(conn, runs, _runs()[:1])  # …the duplicate

    with pytest.raises(sa_exc.IntegrityError):
        await new_rows_then_a_duplicate()
    await db.dispose()
    assert [r[0] for r in _dump(path)["runs"]] == [pack_id("run_0")]  # ids stored packed


def _bulk_written_tables() -> set[str]:
    """The tables the store's modules pass to ``bulk.insert`` / ``bulk.update``."""
    found: set[str] = set()
    for path in STORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "bulk"
                and node.func.attr in ("insert", "update")
            ):
                table = node.args[1]
                assert isinstance(table, ast.Name), f"{path.name}: name the table plainly"
                found.add(getattr(store_tables, table.id).name)
    return found


def test_the_comparison_covers_every_table_bulk_writes() -> None:
    written = _bulk_written_tables()
    assert written and written <= set(WRITTEN), f"compare these too: {written - set(WRITTEN)}"


def test_every_column_of_those_tables_has_a_conversion() -> None:
    for name in WRITTEN:
        table = store_tables.metadata.tables[name]
        columns = tuple(c.name for c in table.columns)
        sqlite_driver._plan(table, columns, ())
        sqlite_driver._update_plan(table, columns, columns[:1])


@pytest.mark.parametrize("kind", [Numeric(10, 2), Enum("a", "b")])
async def test_a_column_type_with_no_known_conversion_fails_before_writing(
    tmp_path: Path, sqlite_template: Path, kind: Any
) -> None:
    odd = Table("odd", MetaData(), Column("id", String(8), primary_key=True), Column("v", kind))
    path = tmp_path / "odd.db"
    shutil.copy(sqlite_template, path)
    db = Database(f"sqlite:///{path}")
    async with db.transaction() as conn:
        await conn.exec_driver_sql("CREATE TABLE odd (id TEXT PRIMARY KEY, v)")
        with pytest.raises(TypeError, match=r"odd\.v"):
            await bulk.insert(conn, odd, [{"id": "x", "v": "a"}])
        with pytest.raises(TypeError, match=r"odd\.v"):
            await bulk.update(conn, odd, [({"v": "a"}, {"id": "x"})])
    await db.dispose()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM odd").fetchone() == (0,)
