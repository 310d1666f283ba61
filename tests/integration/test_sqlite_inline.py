"""SQLite on the event loop's thread: another process's write lock is waited for without
blocking the loop, and a lock held too long becomes "store unavailable", not a hang."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flowhook.errors import StoreUnavailable
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.sqlite_inline import BUSY_WAIT, lock_waits
from flowhook.store.tables import workspaces


def _hold_write_lock(path: Path, seconds: float, held: threading.Event) -> None:
    """Another connection (as another process would) holds the write lock for a while."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    held.set()
    threading.Event().wait(seconds)
    conn.execute("COMMIT")
    conn.close()


async def _insert_workspace(db: Database, name: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            workspaces.insert().values(
                id=f"ws_{name}", name=name, created_at=datetime(2026, 1, 1, tzinfo=UTC)
            )
        )


async def test_a_foreign_write_lock_is_waited_for_while_the_loop_runs(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    db = Database(f"sqlite:///{path}")
    await migrate(db)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 0.4, held))
    holder.start()
    await asyncio.to_thread(held.wait)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beat = asyncio.create_task(ticker())
    loop = asyncio.get_running_loop()
    count, seconds = lock_waits.count, lock_waits.seconds
    started = loop.time()
    await _insert_workspace(db, "after-the-lock")
    waited = loop.time() - started
    beat.cancel()
    holder.join()
    assert waited >= 0.2  # it did wait for the lock...
    assert ticks >= 10  # ...and the loop kept running meanwhile (~40 ticks of 10 ms)
    # ...trying again every millisecond, not backing off (a waiter that slept past the other
    # process's commit left its writer idle: a third of serve's accept load, see BUSY_WAIT)
    tries = lock_waits.count - count
    assert tries >= 2
    assert lock_waits.seconds - seconds == pytest.approx(tries * BUSY_WAIT)
    async with db.read() as conn:
        names = [r.name for r in await conn.execute(workspaces.select())]
    assert "after-the-lock" in names
    await db.dispose()


async def test_a_lock_held_past_the_busy_timeout_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "stuck.db"
    db = Database(f"sqlite:///{path}", sqlite_busy_timeout=0.2)
    await migrate(db)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 1.0, held))
    holder.start()
    await asyncio.to_thread(held.wait)
    with pytest.raises(StoreUnavailable):
        await _insert_workspace(db, "never")
    holder.join()
    await _insert_workspace(db, "later")  # the connection is usable again
    await db.dispose()


async def test_the_url_s_sqlite_options_still_apply(tmp_path: Path) -> None:
    path = tmp_path / "options.db"
    db = Database(f"sqlite:///{path}")
    await migrate(db)
    await _insert_workspace(db, "written")
    await db.dispose()
    read_only = Database(f"sqlite:///file:{path}?mode=ro&uri=true")
    async with read_only.read() as conn:
        assert [r.name for r in await conn.execute(workspaces.select())] == ["written"]
    with pytest.raises(StoreUnavailable) as refused:
        await _insert_workspace(read_only, "refused")
    assert "readonly" in str(refused.value.__cause__)  # mode=ro reached sqlite3
    await read_only.dispose()
