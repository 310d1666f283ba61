"""Many rows of history, fast: shared by bench/overview.py, bench/growth.py and the disk test.

``write`` puts rows in a table the quickest way each backend has: on SQLite the store's bulk
insert (``sqlite3`` executemany, one transaction per ``CHUNK`` rows), on PostgreSQL ``COPY``.

``grow`` writes copies of one real finished run with all its history (the run, its steps, its
events, their deliveries and the deliveries' attempts), read back from the database, so the
rows have the sizes and shapes the engine writes: each copy gets ids of its own made at its
own time (spread evenly over ``days`` before now, so ids and times stay in the same order as
real ones), times shifted by as much, and the event bodies rewritten to name the copy's run.
On PostgreSQL it then runs ``VACUUM ANALYZE`` on those tables, as autovacuum would after a
load (index-only scans need the visibility map, the planner the statistics).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
from sqlalchemy import JSON, Table, select

from flowhook.ids import pack_id
from flowhook.store import bulk
from flowhook.store.db import Database
from flowhook.store.tables import deliveries, delivery_attempts, events, run_steps, runs
from flowhook.store.types import IdType

__all__ = ["CHUNK", "write", "Template", "read_template", "grow", "HISTORY_TABLES"]

CHUNK = 20_000
"""Rows per transaction (SQLite) or per COPY (PostgreSQL)."""

HISTORY_TABLES = (runs, run_steps, events, deliveries, delivery_attempts)

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _head(ms: int) -> str:
    """The first 10 characters of an id made at Unix millisecond ``ms`` (flowhook.ids)."""
    value = ms  # the top 50 of the 130 bits 26 characters hold: the 48-bit millisecond
    out = []
    for _ in range(10):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def _pg_value(column: Any, value: Any) -> Any:
    if value is not None and isinstance(column.type, JSON):
        return orjson.dumps(value).decode()  # jsonb goes through COPY as its text
    if value is not None and isinstance(column.type, IdType):
        return pack_id(value)  # bytea: the id as the store keeps it
    return value


async def write(db: Database, table: Table, rows: Iterable[dict[str, Any]], url: str) -> int:
    """Insert ``rows`` (dicts of column values as the store takes them) into ``table``; the
    number written."""
    pg = None if db.is_sqlite else await asyncpg.connect(url)
    written = 0
    try:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) == CHUNK:
                await _flush(db, pg, table, batch)
                written += len(batch)
                batch = []
        await _flush(db, pg, table, batch)
        written += len(batch)
    finally:
        if pg is not None:
            await pg.close()
    return written


async def _flush(
    db: Database, pg: asyncpg.Connection | None, table: Table, batch: list[dict[str, Any]]
) -> None:
    if not batch:
        return
    if pg is None:
        async with db.transaction() as conn:
            await bulk.insert(conn, table, batch)
        return
    names = list(batch[0])
    columns = [table.c[n] for n in names]
    records = [
        tuple(_pg_value(c, row[n]) for c, n in zip(columns, names, strict=True)) for row in batch
    ]
    await pg.copy_records_to_table(table.name, records=records, columns=names)


@dataclass
class Template:
    """One finished run's rows in every history table, as the store reads them."""

    run: dict[str, Any]
    steps: list[dict[str, Any]]
    events: list[dict[str, Any]]
    deliveries: list[dict[str, Any]]
    attempts: list[dict[str, Any]]

    @property
    def rows_per_run(self) -> int:
        return 1 + len(self.steps) + len(self.events) + len(self.deliveries) + len(self.attempts)

    def with_steps_copied(self, times: int) -> Template:
        """This run with its steps repeated ``times`` over (``sync`` becomes ``sync``,
        ``sync_2``, … at indexes of their own), as a long flow or a fan-out writes them:
        heavy runs, for what a batch of the retention pass holds when runs are not small."""
        if times < 1:
            raise ValueError("times must be at least 1")
        width = len(self.steps)
        steps = [
            {
                **s,
                "idx": copy * width + s["idx"],
                "step_id": s["step_id"] if copy == 0 else f"{s['step_id']}_{copy + 1}",
            }
            for copy in range(times)
            for s in self.steps
        ]
        return replace(self, steps=steps)


async def read_template(db: Database, run_id: str | None = None) -> Template:
    """The rows of ``run_id``, or of the latest completed run that has a delivery."""
    async with db.read() as conn:
        if run_id is None:
            run_id = await conn.scalar(
                select(deliveries.c.run_id)
                .join(runs, runs.c.run_id == deliveries.c.run_id)
                .where(runs.c.status == "completed", deliveries.c.status == "succeeded")
                .order_by(deliveries.c.id.desc())
                .limit(1)
            )
            if run_id is None:
                raise RuntimeError("no completed run with a succeeded delivery to copy")

        async def rows(table: Table, where: Any) -> list[dict[str, Any]]:
            return [dict(r._mapping) for r in (await conn.execute(select(table).where(where)))]

        run = (await rows(runs, runs.c.run_id == run_id))[0]
        found_deliveries = await rows(deliveries, deliveries.c.run_id == run_id)
        return Template(
            run=run,
            steps=await rows(run_steps, run_steps.c.run_id == run_id),
            events=await rows(events, events.c.run_id == run_id),
            deliveries=found_deliveries,
            attempts=await rows(
                delivery_attempts,
                delivery_attempts.c.delivery_id.in_([d["id"] for d in found_deliveries]),
            ),
        )


def _shifted(row: dict[str, Any], by: timedelta, **changes: Any) -> dict[str, Any]:
    out = {k: (v + by if isinstance(v, datetime) else v) for k, v in row.items()}
    out.update(changes)
    return out


def _copies(
    t: Template, first: int, n: int, start: datetime, step: timedelta
) -> Iterator[tuple[Table, dict[str, Any]]]:
    origin = t.run["queued_at"]
    run_id = t.run["run_id"].encode()
    for i in range(first, first + n):
        at = start + step * i
        head = _head(int(at.timestamp() * 1000))
        tail = f"{i:015d}"
        rid = f"run_{head}{tail}0"
        by = at - origin
        yield runs, _shifted(t.run, by, run_id=rid, idempotency_key=None, request_hash=None)
        for s in t.steps:
            yield run_steps, _shifted(s, by, run_id=rid)
        event_ids = {}
        for k, e in enumerate(t.events):
            eid = event_ids[e["id"]] = f"evt_{head}{tail}{k}"
            # The envelope is rebuilt from the row (``body`` is NULL unless it would not be);
            # the payload may name the run too.
            body = None if e["body"] is None else e["body"].replace(run_id, rid.encode())
            payload = e["payload"].replace(run_id, rid.encode())
            yield events, _shifted(e, by, id=eid, run_id=rid, body=body, payload=payload)
        delivery_ids = {}
        for k, d in enumerate(t.deliveries):
            did = delivery_ids[d["id"]] = f"dlv_{head}{tail}{k}"
            yield (
                deliveries,
                _shifted(
                    d, by, id=did, run_id=rid, event_id=event_ids.get(d["event_id"], d["event_id"])
                ),
            )
        for a in t.attempts:
            yield delivery_attempts, _shifted(a, by, delivery_id=delivery_ids[a["delivery_id"]])


async def grow(
    db: Database,
    url: str,
    template: Template,
    n: int,
    *,
    days: float = 30.0,
    now: datetime | None = None,
) -> float:
    """Write ``n`` copies of ``template`` spread over the ``days`` before ``now`` (oldest
    first); the seconds it took (with PostgreSQL's VACUUM ANALYZE)."""
    began = time.perf_counter()
    now = now or datetime.now(UTC)
    start = now - timedelta(days=days)
    step = timedelta(days=days) / max(1, n)
    per_chunk = max(1, CHUNK // template.rows_per_run)
    pg = None if db.is_sqlite else await asyncpg.connect(url)
    try:
        for first in range(0, n, per_chunk):
            by_table: dict[Table, list[dict[str, Any]]] = {t: [] for t in HISTORY_TABLES}
            for table, row in _copies(template, first, min(per_chunk, n - first), start, step):
                by_table[table].append(row)
            if pg is None:
                async with db.transaction() as conn:  # the chunk's rows in one transaction
                    for table, rows in by_table.items():
                        if rows:
                            await bulk.insert(conn, table, rows)
            else:
                for table, rows in by_table.items():
                    await _flush(db, pg, table, rows)
        if pg is not None:
            for table in HISTORY_TABLES:
                await pg.execute(f"VACUUM ANALYZE {table.name}")
    finally:
        if pg is not None:
            await pg.close()
    return time.perf_counter() - began
