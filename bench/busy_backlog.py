"""A healthy endpoint's deliveries/s beside a rate-limited endpoint with a due backlog.

    .venv/bin/python bench/busy_backlog.py                       # backlog 30,000, then none
    .venv/bin/python bench/busy_backlog.py --backlog 30000 --healthy 5000

Queues ``--backlog`` deliveries to endpoint A (``rate_limit`` 2 a second, so the dispatcher
holds as many of A's as it may and A stays busy) and ``--healthy`` to endpoint B, on a fresh
SQLite database, then starts a real `flowhook serve` and times B's deliveries from the
start. With nothing behind A the figure is the dispatcher's plain rate; the gap between the
two is what A's backlog costs everyone else (the dispatcher's reads past busy endpoints).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import Receiver, Server, secret_key_for


async def _round(backlog: int, healthy: int) -> float:
    from flowhook.clock import SystemClock
    from flowhook.config import Settings
    from flowhook.events import make_event
    from flowhook.service import Services
    from flowhook.store import events as events_store
    from flowhook.store.db import Database
    from flowhook.store.migrate import migrate
    from flowhook.store.models import Mode
    from flowhook.store.wakeup import Wakeup

    work = Path(tempfile.mkdtemp(prefix="flowhook-busy-"))
    url = f"sqlite:///{work / 'bench.db'}"
    server = Server(database_url=url, workdir=work)
    async with Receiver() as slow, Receiver() as quick:
        db = Database(url, secret_key=secret_key_for(url))
        await migrate(db)
        settings = Settings(database_url=url, allow_private_targets=True)
        services = Services(db, SystemClock(), settings, Wakeup())
        created = await services.keys.create(Mode.TEST, "bench")
        who = await services.keys.authenticate(f"Bearer {created.key}")
        a = await services.webhooks.create_endpoint(
            who, url=slow.url(0), events=["flow.failed"], rate_limit=2
        )
        b = await services.webhooks.create_endpoint(
            who, url=quick.url(0), events=["flow.completed"]
        )
        slow.secrets["/hook/0"], quick.secrets["/hook/0"] = a.secret.encode(), b.secret.encode()
        clock = SystemClock()
        for kind, count in (("flow.failed", backlog), ("flow.completed", healthy)):
            for start in range(0, count, 1000):
                batch = [
                    make_event(
                        kind, workspace_id=who.workspace_id, mode=who.mode, flow_id="wf_bench",
                        run_id=f"run_{kind}_{i}", payload={"i": i}, now=clock.now(),
                    )
                    for i in range(start, min(start + 1000, count))
                ]  # fmt: skip
                async with db.transaction() as conn:
                    await events_store.insert_events(conn, batch)
        await db.dispose()
        await asyncio.to_thread(server.start)
        started = time.perf_counter()
        try:
            await quick.wait_for_count(healthy, timeout=max(120, healthy / 50))
            took = time.perf_counter() - started
        finally:
            await asyncio.to_thread(server.stop)
        if quick.bad_signatures or slow.bad_signatures:
            raise RuntimeError("a delivery had a bad signature")
    return healthy / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=30_000)
    parser.add_argument("--healthy", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for backlog in (args.backlog, 0):
        rates = sorted(asyncio.run(_round(backlog, args.healthy)) for _ in range(args.rounds))
        print(
            f"{backlog:,} behind a rate-limited endpoint: the healthy endpoint's "
            f"{args.healthy:,} deliveries at {rates[len(rates) // 2]:,.0f}/s from the start"
        )


if __name__ == "__main__":
    main()
