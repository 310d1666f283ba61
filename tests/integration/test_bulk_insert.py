"""SQLite's bulk path stores exactly what SQLAlchemy's executemany stores, byte for byte, for
inserts, upserts and updates, and raises the same errors (an idempotency race still surfaces
as an IntegrityError)."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc as sa_exc

from flowhook.store import bulk
from flowhook.store.db import Database
from flowhook.store.tables import events, run_steps, runs

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
            "idempotency_key": None if i else "key-0", "request_hash": None,
        }
        for i in range(3)
    ]  # fmt: skip


def _steps(status: str) -> list[dict[str, Any]]:
    return [
        {
            "run_id": "run_1", "idx": i, "step_id": f"s{i}", "type": "transform",
            "status": status, "attempts": 1, "started_at": NOW,
            "finished_at": None if i else NOW, "duration_ms": 3,
            "output": None if i == 1 else {"x": i}, "error": None,
        }
        for i in range(3)
    ]  # fmt: skip


def _events() -> list[dict[str, Any]]:
    return [
        {
            "id": f"evt_{i}", "workspace_id": "ws_1", "mode": "test", "type": "flow.started",
            "flow_id": "wf_1", "run_id": "run_1", "created_at": NOW, "body": b'{"a":"\\u00e9"}',
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


def _dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as raw:
        return {
            t: raw.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
            for t in ("runs", "run_steps", "events")
        }


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
        m.setattr(bulk, "raw_sqlite", lambda _conn: None)  # SQLAlchemy's executemany
        db = Database(f"sqlite:///{slow}")
        await _write(db)
        await db.dispose()
    stored = _dump(fast)
    assert stored == _dump(slow)
    assert [r[4] for r in stored["run_steps"]] == ["completed"] * 3  # the upsert replaced them
    assert [r[6] for r in stored["runs"]] == ["completed"] * 3  # the updates reached each run


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
    assert [r[0] for r in _dump(path)["runs"]] == ["run_0"]
