"""CPU time per accepted run, in process: the accept path's own cost, without the network.

    .venv/bin/python bench/accept_cpu.py                       # both backends, 5 rounds each
    .venv/bin/python bench/accept_cpu.py --backends sqlite --rounds 9 --accepts 4000

Wall-clock throughput on a shared 2-core machine moves by ±30 % from round to round (see
README.md). This counts the process's CPU seconds (``time.process_time``, so time spent
waiting for the database or for other processes is left out) per ``POST
/api/v1/flows/execute`` answered 202, driven through httpx's ASGI transport in bursts of 64
concurrent requests: the app, its middleware, validation, the service and the store's
write, with no worker in the process (as ``flowhook api``). PostgreSQL's own CPU is not
counted, SQLite's is (it runs in this process). Compare two commits by running this script
from each checkout, alternating, and comparing the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from flowhook.api.app import create_app
from flowhook.config import Settings
from flowhook.store.models import Mode

sys.path.insert(0, str(Path(__file__).parent))
from harness import FLOW, fresh_database, secret_key_for

BURST = 64


async def one_round(database_url: str, accepts: int) -> tuple[float, float]:
    """Microseconds of CPU per accepted run over ``accepts`` runs (after a warm-up), and
    the accepted runs per wall-clock second meanwhile."""
    settings = Settings(
        database_url=database_url, rate_limit=0, secret_key=secret_key_for(database_url)
    )
    app = create_app(settings, run_worker=False)
    async with app.router.lifespan_context(app):
        key = (await app.state.services.keys.create(Mode.TEST, "bench")).key
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://flowhook.bench",
            headers={"Authorization": f"Bearer {key}"},
        ) as http:
            created = await http.post("/api/v1/flows", json=FLOW)
            assert created.status_code == 201, created.text
            flow_id = created.json()["flow_id"]
            body = {"flow_id": flow_id, "payload": {"n": 1}}

            async def burst() -> None:
                answers = await asyncio.gather(
                    *(http.post("/api/v1/flows/execute", json=body) for _ in range(BURST))
                )
                assert all(a.status_code == 202 for a in answers), answers[0].text

            for _ in range(4):  # warm-up: caches, prepared statements, pools
                await burst()
            bursts = max(1, accepts // BURST)
            started, wall = time.process_time(), time.perf_counter()
            for _ in range(bursts):
                await burst()
            cpu, wall = time.process_time() - started, time.perf_counter() - wall
            return cpu / (bursts * BURST) * 1e6, bursts * BURST / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--accepts", type=int, default=3000, help="accepted runs per round")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        figures, rates = [], []
        for _ in range(args.rounds):
            with (
                tempfile.TemporaryDirectory() as workdir,
                fresh_database(backend, Path(workdir), args.postgres_url) as url,
            ):
                cpu, rate = asyncio.run(one_round(url, args.accepts))
            figures.append(cpu)
            rates.append(rate)
            print(f"{backend}: {cpu:.0f} µs CPU per accept, {rate:,.0f} accepts/s", flush=True)
        rounds = ", ".join(f"{f:.0f}" for f in figures)
        per_s = ", ".join(f"{r:,.0f}" for r in rates)
        print(
            f"{backend}: median {statistics.median(figures):.0f} µs [{rounds}], "
            f"{statistics.median(rates):,.0f} accepts/s [{per_s}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
