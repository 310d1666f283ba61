"""Completion benchmark: how fast runs of a three-transform-step flow finish.

Starts a real `flowhook serve`, submits N runs at a fixed concurrency, and waits until none is
queued or running. Prints completed runs/s over the whole window (submission included) and the
median of the runs' own queued→finished latency.

    .venv/bin/python bench/complete.py                 # SQLite, 2,000 runs, 3 rounds
    .venv/bin/python bench/complete.py --runs 5000 --database-url postgresql://…/bench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from accept import FLOW, FLOWHOOK, free_port


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def one_round(args: argparse.Namespace) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-bench-"))
    port = free_port()
    env = {
        **os.environ,
        "FLOWHOOK_DATABASE_URL": args.database_url or f"sqlite:///{workdir / 'bench.db'}",
        "FLOWHOOK_PORT": str(port),
        "FLOWHOOK_LOG_LEVEL": "warning",
    }
    created = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", "bench", "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    key = json.loads(created.stdout)["key"]
    server = subprocess.Popen([FLOWHOOK, "serve"], env=env, cwd=workdir, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as client:
            for _ in range(100):
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            flow_id = (await client.post("/api/v1/flows", json=FLOW)).json()["flow_id"]
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(args.runs):
                queue.put_nowait(i)
            ids: list[str] = []

            async def submit() -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    r = await client.post(
                        "/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {"n": i}}
                    )
                    assert r.status_code == 202, r.text
                    ids.append(r.json()["run_id"])

            started = time.perf_counter()
            await asyncio.gather(*(submit() for _ in range(args.concurrency)))
            submitted = time.perf_counter() - started
            while True:
                busy = 0
                for status in ("queued", "running"):
                    page = (
                        await client.get(
                            "/api/v1/flows/runs", params={"status": status, "limit": 1}
                        )
                    ).json()
                    busy += len(page["data"])
                if not busy:
                    break
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - started
            sample = ids[:: max(1, len(ids) // 200)]
            latencies = []
            for run_id in sample:
                run = (await client.get(f"/api/v1/flows/runs/{run_id}")).json()
                assert run["status"] == "completed", run
                latencies.append(
                    (_t(run["finished_at"]) - _t(run["queued_at"])).total_seconds() * 1000
                )
        return {
            "rps": args.runs / elapsed,
            "submit_rps": args.runs / submitted,
            "p50": statistics.median(latencies),
        }
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    backend = "PostgreSQL" if args.database_url else "SQLite"
    print(
        f"complete: {args.runs} runs of a 3-transform flow, {backend}, submit concurrency {args.concurrency}"
    )
    rounds = []
    for i in range(args.repeat):
        r = asyncio.run(one_round(args))
        rounds.append(r)
        print(
            f"  round {i + 1}: {r['rps']:7.0f} completed runs/s   (submitted at {r['submit_rps']:.0f}/s)   queued→finished p50 {r['p50']:.0f} ms"
        )
    print(f"  median : {statistics.median(r['rps'] for r in rounds):7.0f} completed runs/s")


if __name__ == "__main__":
    main()
