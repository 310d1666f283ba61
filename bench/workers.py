"""Worker scaling on PostgreSQL: completed runs/s with 1, 2 and 4 `flowhook worker` processes.

Queues N runs of a three-transform flow in a fresh database, starts K workers, and measures
from the first run started to the last one finished (from the runs' own timestamps).

    .venv/bin/python bench/workers.py --server postgresql://postgres@127.0.0.1:5432 [--runs 3000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg

from flowhook.clock import SystemClock
from flowhook.config import Settings
from flowhook.ids import new_id
from flowhook.service import Services
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode, Run, RunStatus
from flowhook.store.wakeup import Wakeup

sys.path.insert(0, str(Path(__file__).parent))
from harness import BENCH_SECRET_KEY, FLOW, FLOWHOOK


async def one_round(server: str, runs: int, workers: int) -> float:
    name = f"flowhook_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(f"{server}/postgres")
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        db = Database(url, secret_key=BENCH_SECRET_KEY)
        await migrate(db)
        clock = SystemClock()
        services = Services(db, clock, Settings(database_url=url), Wakeup())
        key = await services.keys.create(Mode.TEST, "bench")
        who = await services.keys.authenticate(f"Bearer {key.key}")
        flow = await services.flows.create(who, FLOW)
        for start in range(0, runs, 1000):
            batch = [
                (
                    Run(
                        new_id("run"),
                        who.workspace_id,
                        who.mode,
                        flow.flow_id,
                        1,
                        "api",
                        RunStatus.QUEUED,
                        {"n": i},
                        clock.now(),
                    ),
                    None,
                    None,
                )
                for i in range(start, min(start + 1000, runs))
            ]
            async with db.transaction() as conn:
                await runs_store.insert_runs(conn, batch)
        env = {
            **os.environ,
            "FLOWHOOK_DATABASE_URL": url,
            "FLOWHOOK_SECRET_KEY": BENCH_SECRET_KEY,
            "FLOWHOOK_LOG_LEVEL": "warning",
        }
        procs = [
            subprocess.Popen(
                [FLOWHOOK, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for _ in range(workers)
        ]
        conn = await asyncpg.connect(url)
        try:
            for _ in range(6000):
                done = await conn.fetchval("SELECT count(*) FROM runs WHERE status = 'completed'")
                if done >= runs:
                    break
                await asyncio.sleep(0.1)
            span = await conn.fetchval(
                "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM runs"
            )
        finally:
            await conn.close()
        await db.dispose()
        return runs / float(span)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--server",
        default="postgresql://postgres@127.0.0.1:5432",
        help="a PostgreSQL server (no database)",
    )
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    print(
        f"workers: {args.runs} queued runs of a 3-transform flow, PostgreSQL, first start → last finish"
    )
    for k in [int(x) for x in args.workers.split(",")]:
        rates = [asyncio.run(one_round(args.server, args.runs, k)) for _ in range(args.repeat)]
        print(
            f"  {k} worker(s): median {statistics.median(rates):6.0f} completed runs/s   rounds {' / '.join(f'{r:.0f}' for r in rates)}"
        )


if __name__ == "__main__":
    main()
