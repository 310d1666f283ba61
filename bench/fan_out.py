"""Fan-out at scale: one run maps a ``transform`` over 1,000 items.

    .venv/bin/python bench/fan_out.py                          # both backends, median of 3
    .venv/bin/python bench/fan_out.py --backends sqlite --items 200 --repeat 1

In one process (API and engine, as ``flowhook serve``), through the real app over httpx's
ASGI transport: a flow whose ``map`` step runs one ``transform`` per item, then sums the
outputs. Each item is a part (a row of the run queue, claimed like a run), so this measures
the cost of a part end to end: queued, claimed, its step run and committed, the next item
released, and the run woken when the last ends. It prints the time from execute until the
run completed, for ``concurrency`` 1000 (every item at once) and 10 (the default), and a
plain flow of three transforms beside it as a reference.
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
from harness import fresh_database, secret_key_for


def map_flow(concurrency: int) -> dict[str, object]:
    return {
        "name": f"bench-map-{concurrency}",
        "steps": [
            {
                "id": "each",
                "type": "map",
                "items": "{{ payload.items }}",
                "concurrency": concurrency,
                "steps": [{"id": "double", "type": "transform", "output": {"v": "{{ item * 2 }}"}}],
            },
            {"id": "sum", "type": "transform",
             "output": {"total": "{{ steps.each.output | sum(attribute='v') }}"}},
        ],
        "output": {"total": "{{ steps.sum.output.total }}"},
    }  # fmt: skip


PLAIN = {
    "name": "bench-plain",
    "steps": [
        {"id": f"t{i}", "type": "transform", "output": {"v": "{{ payload.n }}"}} for i in range(3)
    ],
}


async def _finished(http: httpx.AsyncClient, run_id: str) -> dict[str, object]:
    while True:
        body = (await http.get(f"/api/v1/flows/runs/{run_id}", params={"wait": 5})).json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return dict(body)


async def one_round(database_url: str, items: int) -> dict[str, float]:
    settings = Settings(
        database_url=database_url, rate_limit=0, secret_key=secret_key_for(database_url),
        max_map_items=max(items, 1000),
    )  # fmt: skip
    app = create_app(settings)
    figures: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        key = (await app.state.services.keys.create(Mode.TEST, "bench")).key
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://flowhook.bench",
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        ) as http:
            plain = (await http.post("/api/v1/flows", json=PLAIN)).json()["flow_id"]
            await _finished(http, (await http.post("/api/v1/flows/execute", json={"flow_id": plain, "payload": {"n": 1}})).json()["run_id"])  # warm-up  # fmt: skip
            began = time.perf_counter()
            body = {"flow_id": plain, "payload": {"n": 1}}
            run = (await http.post("/api/v1/flows/execute", json=body)).json()["run_id"]
            assert (await _finished(http, run))["status"] == "completed"
            figures["plain_ms"] = (time.perf_counter() - began) * 1000
            for concurrency in (1000, 10):
                flow_id = (await http.post("/api/v1/flows", json=map_flow(concurrency))).json()[
                    "flow_id"
                ]
                body = {"flow_id": flow_id, "payload": {"items": list(range(items))}}
                began = time.perf_counter()
                run = (await http.post("/api/v1/flows/execute", json=body)).json()["run_id"]
                done = await _finished(http, run)
                figures[f"map_c{concurrency}_s"] = time.perf_counter() - began
                assert done["status"] == "completed", done
                assert done["output"] == {"total": items * (items - 1)}, done["output"]
                assert done["steps_executed"] == items + 2
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--items", type=int, default=1000)
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
                rounds.append(asyncio.run(one_round(url, args.items)))
            print(f"  {backend} round: {rounds[-1]}", flush=True)
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        print(
            f"{backend}: map over {args.items:,} items of one transform completed in "
            f"{med['map_c1000_s']:.2f} s with concurrency 1000, {med['map_c10_s']:.2f} s with "
            f"concurrency 10 (median of {args.repeat}); a plain three-transform run: "
            f"{med['plain_ms']:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
