"""Waiting runs at scale: 10,000 runs wait for a signal; one broadcast resumes the right 100.

    .venv/bin/python bench/signals.py                          # both backends
    .venv/bin/python bench/signals.py --backends sqlite --runs 2000

In one process (API and engine, as ``flowhook serve``), through the real app over httpx's
ASGI transport: a flow whose first step waits for ``order.paid`` matching the run's
``batch`` (100 runs per batch), then completes. It prints how long the runs took to reach
their ``wait``; the process's CPU while they all wait (the engine should be idle: a waiting
run holds no worker and nothing polls it); the signal's answer time (``matched`` must be
100) and how long until those 100 runs completed; and that the other runs still wait. It
exits 1 when the signal resumed other than the 100 runs of its batch.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import func, select

from flowhook.api.app import create_app
from flowhook.config import Settings
from flowhook.store.models import Mode
from flowhook.store.tables import runs, waits

sys.path.insert(0, str(Path(__file__).parent))
from harness import fresh_database, secret_key_for

BURST = 64
PER_BATCH = 100
FLOW = {
    "name": "bench-wait",
    "timeout_seconds": 86400,
    "steps": [
        {
            "id": "paid",
            "type": "wait",
            "signal": "order.paid",
            "match": {"batch": "{{ payload.batch }}"},
        },
        {"id": "done", "type": "transform", "output": {"ok": True}},
    ],
}


async def _count(app: object, query: object) -> int:
    db = app.state.services.db  # type: ignore[attr-defined]
    async with db.read() as conn:
        return int((await conn.execute(query)).scalar_one())


async def one_round(database_url: str, total: int) -> dict[str, float]:
    settings = Settings(
        database_url=database_url, rate_limit=0, secret_key=secret_key_for(database_url)
    )
    app = create_app(settings)
    open_waits = select(func.count()).select_from(waits).where(waits.c.resolved_at.is_(None))
    completed = select(func.count()).select_from(runs).where(runs.c.status == "completed")
    async with app.router.lifespan_context(app):
        key = (await app.state.services.keys.create(Mode.TEST, "bench")).key
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://flowhook.bench",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        ) as http:
            flow_id = (await http.post("/api/v1/flows", json=FLOW)).json()["flow_id"]
            began = time.perf_counter()
            batches = max(1, total // PER_BATCH)
            for start in range(0, total, BURST):
                answers = await asyncio.gather(
                    *(
                        http.post(
                            "/api/v1/flows/execute",
                            json={"flow_id": flow_id, "payload": {"batch": f"b{i % batches}"}},
                        )
                        for i in range(start, min(total, start + BURST))
                    )
                )
                assert all(a.status_code == 202 for a in answers), answers[0].text
            while await _count(app, open_waits) < total:
                await asyncio.sleep(0.2)
            parked = time.perf_counter() - began

            cpu = time.process_time()
            await asyncio.sleep(3.0)
            idle_cpu = (time.process_time() - cpu) / 3.0

            # warm-up: the route's first call compiles its validation and SQL (~200 ms)
            await http.post("/api/v1/signals", json={"name": "warm-up", "data": {}})
            sent_at = time.perf_counter()
            answer = await http.post(
                "/api/v1/signals",
                json={"name": "order.paid", "data": {"batch": f"b{batches // 2}"}},
            )
            answered = time.perf_counter() - sent_at
            assert answer.status_code == 202, answer.text
            matched = answer.json()["matched"]
            while await _count(app, completed) < matched:
                await asyncio.sleep(0.005)
            resumed = time.perf_counter() - sent_at
            still = await _count(app, open_waits)
    return {
        "parked_s": parked,
        "idle_cpu": idle_cpu,
        "answer_ms": answered * 1000,
        "matched": matched,
        "resumed_ms": resumed * 1000,
        "still_waiting": still,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        with (
            tempfile.TemporaryDirectory() as workdir,
            fresh_database(backend, Path(workdir), args.postgres_url) as url,
        ):
            r = asyncio.run(one_round(url, args.runs))
        print(
            f"{backend}: {args.runs:,} runs waiting after {r['parked_s']:.1f} s; "
            f"idle CPU while they wait {r['idle_cpu'] * 100:.1f} %; one broadcast answered in "
            f"{r['answer_ms']:.0f} ms matching {r['matched']:.0f}, all {r['matched']:.0f} "
            f"completed {r['resumed_ms']:.0f} ms after it was sent; "
            f"{r['still_waiting']:,.0f} still waiting",
            flush=True,
        )
        wanted = min(PER_BATCH, args.runs)
        if r["matched"] != wanted or r["still_waiting"] != args.runs - wanted:
            sys.exit(f"{backend}: the signal resumed {r['matched']:.0f} runs, not {wanted}")


if __name__ == "__main__":
    main()
