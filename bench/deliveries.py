"""Delivery benchmark: signed webhook deliveries per second to a local receiver, with every
attempt logged.

Queues N events (each with one delivery) in a fresh database, starts `flowhook serve`, and
times the dispatcher from the first arrival until the receiver (in this process, aiohttp on
127.0.0.1) has them all.

    .venv/bin/python bench/deliveries.py                     # SQLite, 5,000 deliveries, 3 rounds
    .venv/bin/python bench/deliveries.py --database-url postgresql://…/bench
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from flowhook.clock import SystemClock
from flowhook.config import Settings
from flowhook.events import make_event
from flowhook.service import Services
from flowhook.store import events as events_store
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.wakeup import Wakeup

sys.path.insert(0, str(Path(__file__).parent))
from accept import FLOWHOOK, free_port


async def one_round(args: argparse.Namespace) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-bench-"))
    url = args.database_url or f"sqlite:///{workdir / 'bench.db'}"
    received = 0
    first_at = 0.0
    done = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        nonlocal received, first_at
        await request.read()
        received += 1
        if received == 1:
            first_at = time.perf_counter()
        if received >= args.deliveries:
            done.set()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    receiver_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", receiver_port).start()

    settings = Settings(database_url=url, allow_private_targets=True)
    db = Database(url)
    await migrate(db)
    services = Services(db, SystemClock(), settings, Wakeup())
    created = await services.keys.create(Mode.TEST, "bench")
    who = await services.keys.authenticate(f"Bearer {created.key}")
    await services.webhooks.create_endpoint(
        who, url=f"http://127.0.0.1:{receiver_port}/hook", events=["flow.completed"]
    )
    clock = SystemClock()
    for start in range(0, args.deliveries, 500):
        async with db.transaction() as conn:
            for i in range(start, min(start + 500, args.deliveries)):
                event = make_event(
                    "flow.completed", workspace_id=who.workspace_id, mode=who.mode,
                    flow_id="wf_bench", run_id=f"run_{i}", payload={"i": i}, now=clock.now(),
                )  # fmt: skip
                await events_store.insert_events(conn, [event])
    await db.dispose()

    env = {
        **os.environ,
        "FLOWHOOK_DATABASE_URL": url,
        "FLOWHOOK_PORT": str(free_port()),
        "FLOWHOOK_LOG_LEVEL": "warning",
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
    }
    server = subprocess.Popen([FLOWHOOK, "serve"], env=env, cwd=workdir, stdout=subprocess.DEVNULL)
    try:
        await asyncio.wait_for(done.wait(), timeout=600)
        first_to_last = time.perf_counter() - first_at
    finally:
        server.send_signal(signal.SIGTERM)
        await asyncio.to_thread(server.wait, 60)
        await runner.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    return args.deliveries / first_to_last


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url", default=None, help="an empty PostgreSQL database (default: SQLite)"
    )
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    backend = "PostgreSQL" if args.database_url else "SQLite"
    print(
        f"deliveries: {args.deliveries} signed deliveries to a local receiver, {backend} (first arrival to last)"
    )
    rounds = []
    for i in range(args.repeat):
        rate = asyncio.run(one_round(args))
        rounds.append(rate)
        print(f"  round {i + 1}: {rate:7.0f} deliveries/s")
    print(f"  median : {statistics.median(rounds):7.0f} deliveries/s")


if __name__ == "__main__":
    main()
