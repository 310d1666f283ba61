"""``flowhook db copy`` from SQLite to PostgreSQL (issue 54): how long a real history takes.

    .venv/bin/python bench/db_copy.py                 # 100,000 runs (~1.1 M rows)
    .venv/bin/python bench/db_copy.py --runs 2000     # small: checks it runs

Makes a SQLite database holding one real finished run (the three-transform flow, run by the
app in this process, its ``flow.completed`` delivered to a local receiver that checks the
signature), then ``--runs`` copies of it with all their history (the run, 3 steps, its
events, 1 delivery, 1 attempt each) written in bulk by ``bench/history.py``; then runs the
real ``flowhook db copy --from <file> --to <a new PostgreSQL database>`` as a subprocess and
prints its seconds and rows/s (target: at most 60 s for 100,000 runs on this 2-core machine).
Needs ``--postgres-url`` (default ``$FLOWHOOK_TEST_DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))

import history
from harness import FLOW, Receiver, fresh_database

from flowhook.app import create_app
from flowhook.config import Settings
from flowhook.store.models import Mode

TARGET_SECONDS = 60.0


async def one_delivered_run(url: str) -> None:
    """Run the three-transform flow once on ``url`` and wait for its webhook."""
    settings = Settings(database_url=url, allow_private_targets=True, poll_interval=0.5)
    app = create_app(settings)
    async with app.router.lifespan_context(app), Receiver() as receiver:
        key = (await app.state.services.keys.create(Mode.TEST, "bench")).key
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://flowhook.bench", headers=headers
        ) as client:
            made = await client.post(
                "/api/v1/webhooks/endpoints",
                json={"url": receiver.url(), "events": ["flow.completed"]},
            )
            made.raise_for_status()
            receiver.secrets["/hook/0"] = made.json()["secret"].encode()
            flow = await client.post("/api/v1/flows", json=FLOW)
            flow.raise_for_status()
            run = await client.post(
                "/api/v1/flows/execute",
                json={"flow_id": flow.json()["flow_id"], "payload": {"n": 1}},
            )
            run.raise_for_status()
            await asyncio.wait_for(receiver.expect(run.json()["run_id"]), 30)
        assert receiver.bad_signatures == 0
        # the delivery is marked succeeded just after the receiver answered
        db = app.state.services.db
        for _ in range(200):
            try:
                await history.read_template(db)
                return
            except RuntimeError:
                await asyncio.sleep(0.05)
        raise RuntimeError("the delivery was never marked succeeded")


async def grow(url: str, runs: int) -> int:
    from flowhook.store.db import Database

    db = Database(url)
    try:
        template = await history.read_template(db)
        await history.grow(db, url, template, runs, days=20)
        return template.rows_per_run
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--postgres-url", default=os.environ.get("FLOWHOOK_TEST_DATABASE_URL", ""))
    args = parser.parse_args()
    if not args.postgres_url:
        sys.exit("needs --postgres-url or FLOWHOOK_TEST_DATABASE_URL")
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "flowhook.db"
        url = f"sqlite:///{path}"
        asyncio.run(one_delivered_run(url))
        began = time.perf_counter()
        per_run = asyncio.run(grow(url, args.runs))
        size = path.stat().st_size / 1024 / 1024
        print(
            f"source: {args.runs + 1:,} runs ({per_run} rows each), {size:,.0f} MiB, "
            f"built in {time.perf_counter() - began:.0f} s",
            flush=True,
        )
        with fresh_database("postgresql", Path(work), args.postgres_url) as target:
            env = {k: v for k, v in os.environ.items() if k != "FLOWHOOK_SECRET_KEY"}
            began = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "flowhook", "db", "copy", "--from", str(path),
                 "--to", target],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            took = time.perf_counter() - began
        if done.returncode != 0:
            sys.exit(f"flowhook db copy failed ({done.returncode}):\n{done.stderr}")
        rows = next(line for line in done.stdout.splitlines() if line.startswith("copied "))
        total = int(rows.split()[1].replace(",", ""))
        print(done.stdout.strip())
        verdict = "met" if took <= TARGET_SECONDS else "NOT MET"
        print(
            f"db copy: {total:,} rows in {took:.1f} s (the whole command, start to exit): "
            f"{total / took:,.0f} rows/s; target ≤ {TARGET_SECONDS:.0f} s: {verdict}"
        )


if __name__ == "__main__":
    main()
