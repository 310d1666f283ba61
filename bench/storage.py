"""What a run costs on disk, by table and by index, on SQLite and PostgreSQL.

    .venv/bin/python bench/storage.py                                  # both backends, 10,000 runs
    .venv/bin/python bench/storage.py --backends sqlite --runs 20000

Each backend gets a fresh database and a real `flowhook serve`, with one endpoint on a local
receiver (which checks every signature) subscribed to ``flow.completed``; ``--runs`` runs of
the three-transform flow (bench/harness.py's FLOW) are executed through the API, 64 at a
time, until every webhook arrived: a typical run, with its three steps, five events
(``flow.started``, three ``flow.step_completed``, ``flow.completed``), one delivery and one
attempt. The server then stops (it finishes what it holds), and the database's own figures
are read and divided by the number of runs:

  SQLite      the ``dbstat`` virtual table after a WAL checkpoint: the pages of each table and
              index (``pgsize``, what the file holds) and the bytes of those pages in use;
              then the file's size.
  PostgreSQL  ``pg_relation_size`` of each table (with its TOAST) and of each index. A run's
              updates leave dead row versions until (auto)vacuum makes their space
              reusable, so the figure is what a run costs once vacuum keeps up: after the
              first ``--runs``, a plain ``VACUUM`` (what autovacuum does), then ``--runs``
              more, and how much each relation grew while they ran, per run. Then, with
              ``VACUUM FULL``, what the live rows take; and the whole database's size over
              every run, as written (dead versions of the first batch included).

Only the tables and indexes a run writes to are listed; the rows each table holds per run
are printed too, so a different run shape shows. Target (issue 20): at most 3 KB a run on
SQLite and 4 KB on PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).parent))
from harness import Receiver, Server, client, create_flow, fresh_database, subscribe

TABLES = ("runs", "run_steps", "events", "deliveries", "delivery_attempts")
"""What a run writes (in this order in the tables printed)."""

TARGETS = {"sqlite": 3072, "postgresql": 4096}


async def _push(server: Server, runs: int, between: Any = None) -> None:
    """``runs`` runs through the API, until every webhook arrived and every delivery's
    outcome is written; with ``between`` (a coroutine function), that is awaited and then
    ``runs`` more are pushed the same way."""
    async with Receiver() as receiver, client(server) as http:
        flow_id = await create_flow(http)
        await subscribe(http, receiver, ["flow.completed"])
        for batch in (0, 1) if between is not None else (0,):
            if batch:
                await between()
            todo = iter(range(runs))

            async def submitter(todo: Any = todo) -> None:
                for n in todo:  # no Idempotency-Key: most callers send none
                    body = {"flow_id": flow_id, "payload": {"n": n}}
                    async with http.post("/api/v1/flows/execute", json=body) as r:
                        if r.status != 202:
                            raise RuntimeError(f"execute answered {r.status}: {await r.text()}")

            await asyncio.gather(*(submitter() for _ in range(64)))
            await receiver.wait_for_count(runs * (batch + 1), timeout=max(180, runs / 20))
            if receiver.bad_signatures:
                raise RuntimeError(f"{receiver.bad_signatures} webhooks had a bad signature")
            await _settled(http)


async def _settled(http: Any) -> None:
    """The delivery's outcome is written just after the receiver answered: wait for it."""
    for _ in range(600):
        async with http.get(
            "/api/v1/webhooks/deliveries", params={"status": "pending", "limit": 1}
        ) as r:
            if r.status == 200 and not (await r.json())["data"]:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("deliveries still pending a minute after the last webhook arrived")


Sizes = dict[str, tuple[float, float]]
"""name → (bytes a run, second figure: in use on SQLite, after VACUUM FULL on PostgreSQL)."""


def _sqlite_sizes(path: Path) -> tuple[dict[str, str], Sizes, dict[str, int], float]:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        owners = dict(
            db.execute(
                "SELECT name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')"
            ).fetchall()
        )
        rows = {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in TABLES}
        sizes = {
            name: (float(pg), float(used))
            for name, pg, used in db.execute(
                "SELECT name, sum(pgsize), sum(pgsize - unused) FROM dbstat GROUP BY name"
            ).fetchall()
        }
    finally:
        db.close()
    return owners, sizes, rows, float(os.path.getsize(path))


_PG_SIZES = (
    "SELECT c.relname AS name, pg_relation_size(c.oid)"
    " + CASE WHEN c.reltoastrelid <> 0"
    "   THEN pg_total_relation_size(c.reltoastrelid) ELSE 0 END AS size"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i')"
)
"""A table's own pages and its TOAST (with the TOAST's index); an index's pages."""


async def _pg_measure(conn: asyncpg.Connection) -> dict[str, float]:
    return {r["name"]: float(r["size"]) for r in await conn.fetch(_PG_SIZES)}


async def _postgres_sizes(
    url: str, after_vacuum: dict[str, float], runs: int
) -> tuple[dict[str, str], Sizes, dict[str, int], float]:
    """Per relation: (growth while the second batch of ``runs`` ran, over the sizes after
    the VACUUM that followed the first; size after VACUUM FULL, both batches); sizes are
    divided by the runs they hold by the caller, so the growth is doubled here."""
    conn = await asyncpg.connect(url)
    try:
        owners = {
            r["name"]: r["owner"]
            for r in await conn.fetch(
                "SELECT c.relname AS name, coalesce(t.relname, c.relname) AS owner"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " LEFT JOIN pg_index i ON i.indexrelid = c.oid"
                " LEFT JOIN pg_class t ON t.oid = i.indrelid"
                " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i')"
            )
        }
        written = await _pg_measure(conn)
        rows = {t: int(await conn.fetchval(f'SELECT count(*) FROM "{t}"')) for t in TABLES}
        total = float(await conn.fetchval("SELECT pg_database_size(current_database())"))
        for t in TABLES:
            await conn.execute(f'VACUUM FULL "{t}"')
        compact = await _pg_measure(conn)
    finally:
        await conn.close()
    grown = {n: 2 * (written[n] - after_vacuum.get(n, 0.0)) for n in written}
    return owners, {n: (grown[n], compact.get(n, 0.0)) for n in written}, rows, total


async def _pg_vacuum(url: str) -> dict[str, float]:
    """VACUUM (what autovacuum does: dead row versions' space reusable, the files as they
    are) the tables a run writes; their sizes then."""
    conn = await asyncpg.connect(url)
    try:
        for t in TABLES:
            await conn.execute(f'VACUUM "{t}"')
        return await _pg_measure(conn)
    finally:
        await conn.close()


def _table(
    backend: str, runs: int, owners: dict[str, str], sizes: Sizes, rows: dict[str, int],
    whole: float,
) -> float:  # fmt: skip
    second = "in use" if backend == "sqlite" else "after VACUUM FULL"
    first = "on disk" if backend == "sqlite" else "grown after VACUUM"
    print(f"\n{backend}: {runs} runs; bytes a run ({first}; {second})")
    print(f"  {'table / index':<42}{'rows/run':>9}{'bytes/run':>11}{second:>19}")
    total = [0.0, 0.0]
    for table in TABLES:
        names = [table, *sorted(n for n, t in owners.items() if t == table and n != table)]
        sub = [0.0, 0.0]
        for name in names:
            disk, other = sizes.get(name, (0.0, 0.0))
            sub[0] += disk
            sub[1] += other
            label = table if name == table else f"  {name}"
            count = f"{rows[table] / runs:.2f}" if name == table else ""
            print(f"  {label:<42}{count:>9}{disk / runs:>11.0f}{other / runs:>19.0f}")
        print(f"  {'  = ' + table:<42}{'':>9}{sub[0] / runs:>11.0f}{sub[1] / runs:>19.0f}")
        total[0] += sub[0]
        total[1] += sub[1]
    what = "file" if backend == "sqlite" else "database"
    target = TARGETS[backend]
    print(f"  {'TOTAL a run':<42}{'':>9}{total[0] / runs:>11.0f}{total[1] / runs:>19.0f}")
    print(f"  {'whole ' + what + ' / runs':<42}{'':>9}{whole / runs:>11.0f}")
    verdict = "met" if total[0] / runs <= target else "NOT met"
    print(f"  target: at most {target} bytes a run on disk: {verdict}")
    return total[0] / runs


def run_backend(backend: str, args: argparse.Namespace) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-storage-"))
    try:
        with fresh_database(backend, workdir, args.postgres_url) as url:
            server = Server(url, workdir).start()
            started = time.perf_counter()
            vacuumed: dict[str, float] = {}

            async def vacuum() -> None:
                vacuumed.update(await _pg_vacuum(url))

            try:
                asyncio.run(_push(server, args.runs, vacuum if backend != "sqlite" else None))
            finally:
                server.stop()
            took = time.perf_counter() - started
            runs = args.runs if backend == "sqlite" else 2 * args.runs
            print(f"\n{backend}: {runs} runs executed and delivered in {took:.0f} s")
            if backend == "sqlite":
                found = _sqlite_sizes(workdir / "bench.db")
            else:
                found = asyncio.run(_postgres_sizes(url, vacuumed, args.runs))
            return _table(backend, runs, *found)
    finally:
        if args.keep:
            print(f"  kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument(
        "--keep", action="store_true", help="keep the SQLite file (its path is printed)"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "FLOWHOOK_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a server where a database is created and dropped",
    )
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for backend in backends:
        if backend not in TARGETS:
            parser.error(f"unknown backend {backend!r}: sqlite or postgresql")
    import flowhook

    print(f"Flowhook storage per run, code from {Path(flowhook.__file__).parent}")
    results: dict[str, Any] = {b: run_backend(b, args) for b in backends}
    print("\n" + ", ".join(f"{b}: {v:.0f} bytes a run" for b, v in results.items()))


if __name__ == "__main__":
    main()
