"""Per-key concurrency at scale: end-to-end runs/s with and without it.

    .venv/bin/python bench/flow_control.py                      # both backends, median of 3
    .venv/bin/python bench/flow_control.py --backends sqlite --runs 1000 --repeat 1

In one process (API and engine, as ``flowhook serve``), through the real app over httpx's
ASGI transport: ``--runs`` executes of a three-transform flow are accepted (64 at a time),
then the time until the last completed is measured, for the plain flow and for the same
flow with ``"concurrency": {"limit": 2, "key": "{{ payload.customer }}"}`` over 1,000
customers (so nearly every run takes a slot of its own key, and each end hands it on).
The two alternate within a round so drift on the machine hits both; the ratio is
keyed / plain (1.0 = no cost; the issue asks for at least 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from flowhook.api.app import create_app
from flowhook.config import Settings
from flowhook.store.models import Mode

sys.path.insert(0, str(Path(__file__).parent))
from harness import fresh_database, secret_key_for

KEYS = 1000


def flow(**control: Any) -> dict[str, Any]:
    return {
        "name": "bench-" + ("keyed" if control else "plain"),
        "steps": [
            {"id": f"t{i}", "type": "transform", "output": {"v": "{{ payload.n }}"}}
            for i in range(3)
        ],
        **control,
    }


async def _all_done(http: httpx.AsyncClient, run_ids: list[str]) -> None:
    for run_id in run_ids:
        while True:
            r = await http.get(f"/api/v1/flows/runs/{run_id}", params={"wait": 5})
            status = r.json()["status"]
            if status in ("completed", "failed", "cancelled"):
                assert status == "completed", r.text
                break


async def _measure(http: httpx.AsyncClient, flow_id: str, runs: int) -> float:
    began = time.perf_counter()
    ids: list[str] = []
    for start in range(0, runs, 64):
        batch = [
            http.post("/api/v1/flows/execute",
                      json={"flow_id": flow_id, "payload": {"n": i, "customer": f"cus_{i % KEYS}"}})
            for i in range(start, min(runs, start + 64))
        ]  # fmt: skip
        ids += [r.json()["run_id"] for r in await asyncio.gather(*batch)]
    await _all_done(http, ids)
    return runs / (time.perf_counter() - began)


async def one_round(database_url: str, runs: int) -> dict[str, float]:
    settings = Settings(
        database_url=database_url, rate_limit=0, secret_key=secret_key_for(database_url)
    )
    app = create_app(settings)
    figures: dict[str, list[float]] = {"plain": [], "keyed": []}
    async with app.router.lifespan_context(app):
        key = (await app.state.services.keys.create(Mode.TEST, "bench")).key
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://flowhook.bench",
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        ) as http:
            ids = {
                "plain": (await http.post("/api/v1/flows", json=flow())).json()["flow_id"],
                "keyed": (
                    await http.post(
                        "/api/v1/flows",
                        json=flow(concurrency={"limit": 2, "key": "{{ payload.customer }}"}),
                    )
                ).json()["flow_id"],
            }
            for name in ("plain", "keyed"):  # warm-up
                await _measure(http, ids[name], 64)
            for name in ("plain", "keyed", "keyed", "plain"):  # alternate: drift hits both
                figures[name].append(await _measure(http, ids[name], runs))
    return {name: statistics.mean(values) for name, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        rounds = []
        for _ in range(args.repeat):
            with (
                tempfile.TemporaryDirectory() as workdir,
                fresh_database(backend, Path(workdir), args.postgres_url) as url,
            ):
                rounds.append(asyncio.run(one_round(url, args.runs)))
            r = rounds[-1]
            print(f"  {backend} round: plain {r['plain']:.0f} runs/s, keyed {r['keyed']:.0f} "
                  f"runs/s, ratio {r['keyed'] / r['plain']:.2f}", flush=True)  # fmt: skip
        plain = statistics.median(r["plain"] for r in rounds)
        keyed = statistics.median(r["keyed"] for r in rounds)
        ratio = statistics.median(r["keyed"] / r["plain"] for r in rounds)
        print(
            f"{backend}: {args.runs:,} runs of three transforms end to end: plain "
            f"{plain:.0f} runs/s, per-key concurrency (limit 2, {KEYS:,} keys) {keyed:.0f} "
            f"runs/s; keyed / plain {ratio:.2f} (median of {args.repeat})",
            flush=True,
        )


if __name__ == "__main__":
    main()
