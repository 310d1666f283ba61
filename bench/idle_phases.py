"""Where an idle run's time goes, run by run, and which runs make the slow tail.

    .venv/bin/python bench/idle_phases.py --backends postgresql --runs 300
    PYTHONPATH=<checkout> .venv/bin/python bench/idle_phases.py   # another checkout

The same round as bench/suite.py's idle figure (`flowhook serve`, one run at a time, a run
every 20 ms after the last one's webhook), and then each run's phases from the server's own
timestamps (milliseconds, whole on the server's side):

- *answered*: the execute request, as the client timed it;
- *accepted*: from sending the request to the run's ``queued_at``;
- *claimed*: ``queued_at`` to ``started_at`` (the engine woken, the run claimed);
- *executed*: ``started_at`` to ``finished_at``;
- *delivered*: ``finished_at`` to the receiver's arrival of ``flow.completed`` (the
  delivery claimed, signed and sent).

It prints p50, p99 and the slowest runs with their phases and when they came (seconds
after the first run). The slow ones tell a cold start (the first runs after the server
started), a one-off (statistics gathered at the 100th row written) and noise apart.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from harness import Receiver, client, create_flow, percentile, running_server, subscribe

PHASES = ("total", "answered", "accepted", "claimed", "executed", "delivered")


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def _measure(server: Any, runs: int) -> list[dict[str, float]]:
    sent: list[tuple[str, float, float, float, float]] = []
    async with Receiver() as receiver, client(server) as http:
        flow_id = await create_flow(http)
        await subscribe(http, receiver, ["flow.completed"])
        for n in range(runs):
            wall, began = time.time(), time.perf_counter()
            body = {"flow_id": flow_id, "payload": {"n": n}}
            async with http.post("/api/v1/flows/execute", json=body) as r:
                if r.status != 202:
                    raise RuntimeError(f"execute answered {r.status}: {await r.text()}")
                run_id = (await r.json())["run_id"]
            answered = time.perf_counter()
            arrived = await asyncio.wait_for(receiver.expect(run_id), timeout=30)
            sent.append((run_id, wall, began, answered, arrived))
            await asyncio.sleep(0.02)  # idle again before the next one
        rows = []
        for run_id, wall, began, answered, arrived in sent:
            async with http.get(f"/api/v1/flows/runs/{run_id}") as r:
                run = await r.json()
            queued, started, finished = (
                _at(run[k]) for k in ("queued_at", "started_at", "finished_at")
            )
            rows.append(
                {
                    "total": (arrived - began) * 1000,
                    "answered": (answered - began) * 1000,
                    "accepted": (queued - wall) * 1000,
                    "claimed": (started - queued) * 1000,
                    "executed": (finished - started) * 1000,
                    "delivered": (wall + arrived - began - finished) * 1000,
                    "after": wall - sent[0][1],
                }
            )
    return rows


def report(backend: str, rows: list[dict[str, float]], slowest: int) -> None:
    totals = [r["total"] for r in rows]
    print(
        f"{backend}: {len(rows)} runs, p50 {percentile(totals, 50):.1f} ms, "
        f"p99 {percentile(totals, 99):.1f} ms, first run {totals[0]:.1f} ms"
    )
    print("  " + "".join(f"{p:>11}" for p in PHASES) + "   after")
    for row in sorted(rows, key=lambda r: -r["total"])[:slowest]:
        print("  " + "".join(f"{row[p]:11.1f}" for p in PHASES) + f"  {row['after']:5.2f} s")
    medians = [statistics.median(r[p] for r in rows) for p in PHASES]
    print("  " + "".join(f"{m:11.1f}" for m in medians) + "   (medians)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--slowest", type=int, default=8, help="how many slow runs to show")
    parser.add_argument(
        "--postgres-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where a database per round is created and dropped",
    )
    args = parser.parse_args()
    for backend in (b.strip() for b in args.backends.split(",") if b.strip()):
        with running_server(backend, args.postgres_url) as server:
            rows = asyncio.run(_measure(server, args.runs))
        report(backend, rows, args.slowest)


if __name__ == "__main__":
    main()
