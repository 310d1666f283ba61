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
from harness import Receiver, Server, direct_store, queue_events


async def _round(backlog: int, healthy: int) -> float:
    work = Path(tempfile.mkdtemp(prefix="flowhook-busy-"))
    url = f"sqlite:///{work / 'bench.db'}"
    server = Server(database_url=url, workdir=work)
    async with Receiver() as slow, Receiver() as quick:
        async with direct_store(url) as (db, services, who):
            a = await services.webhooks.create_endpoint(
                who, url=slow.url(0), events=["flow.failed"], rate_limit=2
            )
            b = await services.webhooks.create_endpoint(
                who, url=quick.url(0), events=["flow.completed"]
            )
            slow.secrets["/hook/0"] = a.secret.encode()
            quick.secrets["/hook/0"] = b.secret.encode()
            await queue_events(db, who, "flow.failed", backlog)
            await queue_events(db, who, "flow.completed", healthy)
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
