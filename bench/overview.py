"""The overview page's queries with a million runs in the table.

    .venv/bin/python bench/overview.py                          # both backends, 1,000,000 runs
    .venv/bin/python bench/overview.py --backends sqlite --runs 100000

On a fresh database it writes, for one workspace's sandbox: ``--runs`` runs queued over the
last 24 hours across 8 flows (most completed, some failed or cancelled, the last minute's
running or queued; 3 % of them parts of a ``map`` step, which the page leaves out), a
backlog of 2,000 queued runs due now and 500 held back, 4 endpoints with ``--deliveries``
deliveries over the day (1,000 of them pending); and another workspace with a tenth as many
runs, which the page must not read. SQLite through the store's bulk insert, PostgreSQL
through COPY, then on PostgreSQL ``VACUUM ANALYZE`` (what autovacuum does after a load: the
page's reads are index-only scans, which need the visibility map). It then times each of
the page's reads and the whole page's (``OverviewService.get``: two connections at once), the
median of ``--repeat`` rounds, and the longest the event loop waited during one page (on
SQLite the statements run on it), and prints them. Target: the whole page well under a
second.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from flowhook.clock import SystemClock
from flowhook.config import Settings
from flowhook.service import Principal, Services
from flowhook.service.overview import DAY, HOUR, MINUTE, bucket_starts
from flowhook.store import overview as store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.tables import deliveries, runs
from flowhook.store.wakeup import Wakeup

sys.path.insert(0, str(Path(__file__).parent))
import history
from harness import fresh_database, secret_key_for

FLOWS = 8
T = TypeVar("T")
FLOW = {"name": "bench", "steps": [{"id": "a", "type": "transform", "output": {}}]}


def _runs(
    who_ws: str, flow_ids: list[str], n: int, now: datetime, seed: int
) -> Iterator[dict[str, Any]]:
    rnd = random.Random(seed)
    for i in range(n):
        queued = now - timedelta(seconds=rnd.random() * 86_400)
        age = (now - queued).total_seconds()
        k = i % len(flow_ids)
        x = rnd.random()
        if age < 5:
            status = "queued"
        elif age < 60:
            status = "running"
        else:
            status = "completed" if x < 0.9 else "failed" if x < 0.97 else "cancelled"
        took = int(rnd.lognormvariate(5 + k * 0.3, 0.8))
        ended = status in ("completed", "failed", "cancelled")
        yield _run(f"run_{seed}x{i:09d}", who_ws, flow_ids[k], status, queued,
                   queued + timedelta(milliseconds=took) if ended else None,
                   took if ended else None, part=f"run_{seed}p" if i % 33 == 0 else None)  # fmt: skip


def _run(
    run_id: str,
    workspace_id: str,
    flow_id: str,
    status: str,
    queued: datetime,
    finished: datetime | None,
    took: int | None,
    *,
    due: datetime | None = None,
    part: str | None = None,
) -> dict[str, Any]:
    return {
        "run_id": run_id, "workspace_id": workspace_id, "mode": "test", "flow_id": flow_id,
        "flow_version": 1, "trigger": "api", "status": status, "payload": {},
        "queued_at": queued, "available_at": due or queued, "due_at": due or queued,
        "started_at": queued if status != "queued" else None, "finished_at": finished,
        "duration_ms": took, "root_run_id": part, "parent_run_id": part,
    }  # fmt: skip


def _deliveries(
    workspace_id: str, endpoint_ids: list[str], n: int, now: datetime
) -> Iterator[dict[str, Any]]:
    rnd = random.Random(3)
    for i in range(n):
        created = now - timedelta(seconds=rnd.random() * 86_400)
        x = rnd.random()
        status = "pending" if i < 1000 else "succeeded" if x < 0.97 else "failed"
        yield {
            "id": f"dlv_b{i:09d}", "event_id": f"evt_b{i:09d}",
            "endpoint_id": endpoint_ids[i % len(endpoint_ids)], "workspace_id": workspace_id,
            "mode": "test", "event_type": "flow.completed", "status": status,
            "attempts": 1, "next_attempt_at": created, "due_at": created, "created_at": created,
        }  # fmt: skip


async def _write(db: Database, table: Any, rows: Iterator[dict[str, Any]], url: str) -> None:
    """Many rows: the store's bulk insert on SQLite, COPY on PostgreSQL (bench/history.py)."""
    await history.write(db, table, rows, url)


async def _seed(services: Services, url: str, total: int, sent: int) -> Principal:
    now = datetime.now(UTC)
    keys = services.keys
    who = await keys.authenticate(f"Bearer {(await keys.create(Mode.TEST, 'bench')).key}")
    other = await keys.authenticate(f"Bearer {(await keys.create(Mode.TEST, 'other')).key}")
    flow_ids = [
        (await services.flows.create(who, {**FLOW, "name": f"flow-{i}"})).flow_id
        for i in range(FLOWS)
    ]
    theirs = (await services.flows.create(other, FLOW)).flow_id
    endpoints = [
        (
            await services.webhooks.create_endpoint(
                who, url=f"https://example.com/hook/{i}", events=["flow.completed"]
            )
        ).id
        for i in range(4)
    ]
    db = services.db
    began = time.perf_counter()
    await _write(db, runs, _runs(who.workspace_id, flow_ids, total, now, 1), url)
    await _write(db, runs, _runs(other.workspace_id, [theirs], total // 10, now, 2), url)
    backlog = [
        _run(
            f"run_q{i:06d}",
            who.workspace_id,
            flow_ids[i % FLOWS],
            "queued",
            now - timedelta(seconds=i % 300),
            None,
            None,
            due=datetime(9999, 1, 1, tzinfo=UTC) if i % 5 == 0 else None,
        )
        for i in range(2500)
    ]
    await _write(db, runs, iter(backlog), url)
    await _write(db, deliveries, _deliveries(who.workspace_id, endpoints, sent, now), url)
    if not db.is_sqlite:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("VACUUM ANALYZE runs")
            await conn.execute("VACUUM ANALYZE deliveries")
        finally:
            await conn.close()
    print(f"  wrote {total + total // 10 + 2500:,} runs and {sent:,} deliveries in "
          f"{time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
    return who


async def _median(work: Callable[[], Awaitable[object]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        await work()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


async def _stall(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result, and the longest the event loop went without a turn meanwhile (ms):
    what a request or the engine in the same process would wait."""
    longest, running = 0.0, True

    async def tick() -> None:
        nonlocal longest
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        return await work, longest * 1000
    finally:
        running = False
        await ticker


async def one_backend(url: str, total: int, sent: int, repeat: int) -> dict[str, float]:
    db = Database(url, secret_key=secret_key_for(url))
    await migrate(db)
    settings = Settings(database_url=url, secret_key=secret_key_for(url))
    services = Services(db, SystemClock(), settings, Wakeup())
    try:
        who = await _seed(services, url, total, sent)
        ws, mode, now = who.workspace_id, who.mode, datetime.now(UTC)

        def read(
            fn: Callable[..., Awaitable[object]], *args: Any
        ) -> Callable[[], Awaitable[object]]:
            async def go() -> object:
                async with db.read() as conn:
                    return await fn(conn, ws, mode, *args)

            return go

        reads = {
            "runs per minute, last hour": read(store.run_buckets, bucket_starts(now, MINUTE, 60), MINUTE),
            "runs per hour, last day": read(store.run_buckets, bucket_starts(now, HOUR, 24), HOUR),
            "p50/p95 by flow, last day": read(store.flow_durations, now - DAY),
            "delivery success by endpoint": read(store.endpoint_rates, now - DAY),
            "queue depth and ages": read(store.backlog, now),
        }  # fmt: skip
        figures = {name: await _median(go, repeat) for name, go in reads.items()}
        figures["whole page (two connections at once)"] = await _median(
            lambda: services.overview.get(who), repeat
        )
        page, figures["longest event-loop stall in the page"] = await _stall(
            services.overview.get(who)
        )
        assert sum(b.total for b in page.last_day) > total * 0.9, "the day's runs were not seen"
        return figures
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--deliveries", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    results = {}
    for backend in args.backends.split(","):
        print(f"{backend}:", flush=True)
        with (
            tempfile.TemporaryDirectory() as workdir,
            fresh_database(backend, Path(workdir), args.postgres_url) as url,
        ):
            results[backend] = asyncio.run(
                one_backend(url, args.runs, args.deliveries, args.repeat)
            )
        for name, ms in results[backend].items():
            print(f"  {name:<36} {ms:8.1f} ms", flush=True)
    print(f"\nmedian of {args.repeat}, ms, {args.runs:,} runs in the workspace over 24 h")
    names = list(next(iter(results.values())))
    print(f"| read | {' | '.join(results)} |\n|---|{'---|' * len(results)}")
    for name in names:
        print(f"| {name} | {' | '.join(f'{r[name]:.0f}' for r in results.values())} |")


if __name__ == "__main__":
    main()
