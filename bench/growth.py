"""Cost as history grows: accept and end to end on an empty database and on one holding
``--runs`` finished runs with all their history, both backends; then pruning it all while
the API is asked for things.

    .venv/bin/python bench/growth.py                       # both backends, 1,000,000 runs
    .venv/bin/python bench/growth.py --backends sqlite --runs 200000 --repeat 1
    .venv/bin/python bench/growth.py --smoke               # small and once: checks it runs
    .venv/bin/python bench/growth.py --backends sqlite --runs 5000 --step-copies 100 --repeat 1

Each round starts a real ``flowhook serve`` (``FLOWHOOK_RATE_LIMIT=0``) on the database and
measures, as bench/suite.py does: accept (``POST /api/v1/flows/execute`` under wrk at c64 for
``--duration`` s, while the engine executes what it accepts), waits for the queue to drain,
then end to end (``--e2e-runs`` runs of the three-transform flow, ``flow.completed`` delivered
to a local receiver that checks every signature: completed runs/s, and execute → webhook
p50/p99 at ``--e2e-rate``). Empty: a fresh database per round. Grown: the last empty round's
database, to which ``bench/history.py`` then adds ``--runs`` copies of one of its real
finished runs (the run, 3 steps, 5 events, 1 delivery, 1 attempt: 11 rows each), spread over
the ``--days`` before now (under the 7 days after which delivered bodies are cleared, so the
server's retention pass at start has nothing to do), in bulk (SQLite: the store's bulk
insert, 20,000 rows a transaction; PostgreSQL: COPY, then VACUUM ANALYZE), and waits until
the build's writes are on disk (``sync``; PostgreSQL a CHECKPOINT first). Every grown round
runs on that same database. ``--step-copies N`` makes the copies heavy runs: each holds its
run's steps N times over (``--step-copies 100``: 308 rows a run), as long flows and fan-outs
write them, which is what a retention batch holds when runs are not small. The ratio
grown / empty is printed beside the target (within 15 %).

With ``--prune`` (default on) it then prunes everything (``days=0``, as ``flowhook prune
--days 0``) in this process while a client asks the running server for a flow and executes
a run, over and over: the longest this process's event loop waited for a statement (what
requests to ``flowhook serve`` would wait when its own hourly retention runs), the API's
longest answer meanwhile and its failures, and the database's size before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
import history
from harness import (
    Server,
    client,
    create_flow,
    fresh_database,
    secret_key_for,
    wait_healthy,
    wrk_post,
)
from suite import _e2e

Figures = dict[str, float]

TARGET = 0.15
"""Grown within 15 % of empty: at least 0.85× a rate, at most 1.15× a latency."""

LABELS = {
    "accept_c64_rps": "accept c64, runs/s",
    "accept_c64_p99": "accept c64, p99 ms",
    "e2e_rps": "end to end, completed runs/s",
    "e2e_p50": "execute → webhook p50 ms",
    "e2e_p99": "execute → webhook p99 ms",
}


def measure(url: str, workdir: Path, args: argparse.Namespace) -> Figures:
    server = Server(url, workdir)
    server.start()
    try:
        wait_healthy(server)
        return asyncio.run(_measure(server, args))
    finally:
        server.stop()


async def _measure(server: Server, args: argparse.Namespace) -> Figures:
    async with client(server) as http:
        flow_id = await create_flow(http)
    body = orjson.dumps({"flow_id": flow_id, "trigger": "api", "payload": {"n": 1}})
    r = await asyncio.to_thread(
        wrk_post, f"{server.base}/api/v1/flows/execute", body, server.auth, 64, args.duration
    )
    if r["non2xx"]:
        raise RuntimeError(f"accept: {r['non2xx']:.0f} answers were not 202")
    await _drained(server)
    figures = {"accept_c64_rps": r["rps"], "accept_c64_p99": r["p99"]}
    figures.update(await _e2e(server, args))
    figures.pop("e2e_retries", None)
    async with client(server) as http:  # the round's endpoint goes with its receiver
        async with http.get("/api/v1/webhooks/endpoints") as got:
            for endpoint in (await got.json())["data"]:
                async with http.delete(f"/api/v1/webhooks/endpoints/{endpoint['id']}") as gone:
                    assert gone.status in (200, 204), await gone.text()
        await _drained(server)
    return figures


async def _drained(server: Server, timeout: float = 300) -> None:
    """Wait until no run is queued and no delivery pending (``/metrics``)."""
    async with client(server) as http:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with http.get("/metrics") as r:
                text = await r.text()
            values = {
                line.split()[0]: float(line.split()[1])
                for line in text.splitlines()
                if line.startswith(("flowhook_queue_depth ", "flowhook_webhook_oldest_pending"))
            }
            if not any(values.values()):
                return
            await asyncio.sleep(0.5)
    raise RuntimeError("the queue did not drain")


async def grow(url: str, runs: int, days: float, step_copies: int = 1) -> tuple[float, int]:
    from flowhook.store.db import Database

    db = Database(url, secret_key=secret_key_for(url))
    try:
        template = (await history.read_template(db)).with_steps_copied(step_copies)
        took = await history.grow(db, url, template, runs, days=days)
        await settle(db, url)
        return took, template.rows_per_run
    finally:
        await db.dispose()


async def settle(db: Any, url: str) -> None:
    """Let the build's writes reach the disk before the grown rounds: a real history grows
    over days, its pages long written, while a bulk build may leave gigabytes of dirty pages
    for the kernel and, on PostgreSQL, its WAL for checkpoints (on this machine's defaults,
    1 GB ``max_wal_size``, the build started one every ~23 s, each spread over up to a minute
    and a half). So neither falls into what the rounds measure. PostgreSQL: a CHECKPOINT,
    then ``sync``; SQLite: ``sync`` (0 s on this machine, whose disk kept up)."""
    began = time.perf_counter()
    if not db.is_sqlite:
        import asyncpg

        pg = await asyncpg.connect(url)
        try:
            await pg.execute("CHECKPOINT")
        finally:
            await pg.close()
    await asyncio.to_thread(os.sync)
    print(f"  settled: the build's writes on disk in {time.perf_counter() - began:.0f} s",
          flush=True)  # fmt: skip


def _files(url: str) -> int:
    if not url.startswith("sqlite"):
        return 0
    path = Path(url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def prune_under_load(server: Server) -> Figures:
    """Prune everything here while a client asks the server; see the module's docstring."""
    from flowhook.clock import SystemClock
    from flowhook.gctune import tune_for_server
    from flowhook.service.retention import RetentionService
    from flowhook.store import space
    from flowhook.store.db import Database

    tune_for_server()  # as in `serve`'s engine process and `flowhook prune`
    url = server.database_url
    db = Database(url, secret_key=secret_key_for(url))
    async with db.read() as conn:
        size_before = (await space.storage(conn)).size_bytes
    files_before = _files(url)
    latencies: list[float] = []
    failures = 0
    pruning = True
    longest_stall = 0.0

    async def ask() -> None:
        nonlocal failures
        async with client(server, 4) as http:
            flow_id = await create_flow(http)
            n = 0
            while pruning:
                n += 1
                for method, path, body in (
                    ("GET", f"/api/v1/flows/{flow_id}", None),
                    ("POST", "/api/v1/flows/execute", {"flow_id": flow_id, "payload": {"n": n}}),
                ):
                    began = time.perf_counter()
                    try:
                        async with http.request(method, path, json=body) as r:
                            await r.read()
                            failures += r.status not in (200, 202)
                    except Exception:  # counted; the loop goes on
                        failures += 1
                    latencies.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(0.01)

    async def tick() -> None:
        nonlocal longest_stall
        last = time.perf_counter()
        while pruning:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest_stall, last = max(longest_stall, now - last), now

    asking, ticking = asyncio.create_task(ask()), asyncio.create_task(tick())
    began = time.perf_counter()
    try:
        done = await RetentionService(db, SystemClock(), 30.0, 7.0).prune_all(days=0)
    finally:
        took = time.perf_counter() - began
        pruning = False
        await asyncio.gather(asking, ticking)
    async with db.read() as conn:
        size_after = (await space.storage(conn)).size_bytes
    await db.dispose()
    return {
        "pruned_runs": done.runs,
        "prune_s": took,
        "prune_loop_stall_ms": longest_stall * 1000,
        "prune_api_max_ms": max(latencies, default=float("nan")),
        "prune_api_p99_ms": statistics.quantiles(latencies, n=100)[98]
        if len(latencies) > 100
        else float("nan"),
        "prune_api_requests": len(latencies),
        "prune_api_failures": failures,
        "size_before_mb": size_before / 2**20,
        "size_after_mb": size_after / 2**20,
        "files_before_mb": files_before / 2**20,
        "files_after_mb": _files(url) / 2**20,
    }


def one_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    empty: list[Figures] = []
    grown: list[Figures] = []
    out: dict[str, Any] = {}
    for i in range(args.repeat):
        workdir = Path(tempfile.mkdtemp(prefix="flowhook-growth-"))
        try:
            with fresh_database(backend, workdir, args.postgres_url) as url:
                empty.append(measure(url, workdir, args))
                print(f"  {backend} empty round {i + 1}: {_show(empty[-1])}", flush=True)
                if i < args.repeat - 1:
                    continue
                took, per_run = asyncio.run(grow(url, args.runs, args.days, args.step_copies))
                out["build_s"] = took
                print(f"  {backend}: wrote {args.runs:,} runs ({args.runs * per_run:,} rows) "
                      f"in {took:.0f} s; {_files(url) / 2**20:,.0f} MiB of SQLite files"
                      if backend == "sqlite" else
                      f"  {backend}: wrote {args.runs:,} runs ({args.runs * per_run:,} rows) "
                      f"in {took:.0f} s (with VACUUM ANALYZE)", flush=True)  # fmt: skip
                for j in range(args.repeat):
                    grown.append(measure(url, workdir, args))
                    print(f"  {backend} grown round {j + 1}: {_show(grown[-1])}", flush=True)
                if args.prune:
                    server = Server(url, workdir)
                    server.start()
                    try:
                        wait_healthy(server)
                        out["prune"] = asyncio.run(prune_under_load(server))
                    finally:
                        server.stop()
                    print(f"  {backend} prune: {out['prune']}", flush=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    out["empty"] = {k: statistics.median(r[k] for r in empty) for k in LABELS}
    out["grown"] = {k: statistics.median(r[k] for r in grown) for k in LABELS}
    return out


def _show(figures: Figures) -> str:
    return ", ".join(f"{LABELS[k]} {figures[k]:,.1f}" for k in LABELS)


def print_table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nmedians of {args.repeat}; grown: {args.runs:,} finished runs with their history")
    print("| backend | figure | empty | grown | grown / empty | target |")
    print("|---|---|---|---|---|---|")
    for backend, r in results.items():
        for key, label in LABELS.items():
            e, g = r["empty"][key], r["grown"][key]
            ratio = g / e if e else float("nan")
            rate = key.endswith("rps")
            ok = ratio >= 1 - TARGET if rate else ratio <= 1 + TARGET
            goal = f"{'≥' if rate else '≤'} {1 - TARGET if rate else 1 + TARGET:.2f}"
            print(f"| {backend} | {label} | {e:,.1f} | {g:,.1f} | {ratio:.2f} | "
                  f"{goal} {'met' if ok else 'not met'} |")  # fmt: skip
    for backend, r in results.items():
        if "prune" in r:
            p = r["prune"]
            print(
                f"{backend}: pruned {p['pruned_runs']:,.0f} runs in {p['prune_s']:.0f} s; longest "
                f"event-loop stall {p['prune_loop_stall_ms']:.0f} ms (target ≤ 50); API meanwhile: "
                f"{p['prune_api_requests']:.0f} requests, {p['prune_api_failures']:.0f} failed, "
                f"p99 {p['prune_api_p99_ms']:.0f} ms, max {p['prune_api_max_ms']:.0f} ms; "
                f"database {p['size_before_mb']:,.0f} → {p['size_after_mb']:,.0f} MiB"
                + (f", files {p['files_before_mb']:,.0f} → {p['files_after_mb']:,.0f} MiB"
                   if backend == "sqlite" else "")
            )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=1_000_000, help="history to build")
    parser.add_argument("--days", type=float, default=6.0, help="spread over this many days")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of wrk")
    parser.add_argument("--e2e-runs", type=int, default=3000)
    parser.add_argument("--e2e-rate", type=float, default=200.0, help="runs/s for latency")
    parser.add_argument(
        "--step-copies",
        type=int,
        default=1,
        help="heavy runs: each copied run holds its steps this many times over",
    )
    parser.add_argument("--no-prune", dest="prune", action="store_false")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "FLOWHOOK_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--smoke", action="store_true", help="small and once: checks it runs")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.repeat, args.duration, args.e2e_runs, args.e2e_rate = (
            2000, 1, 2.0, 200, 50.0,
        )  # fmt: skip
    results = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(f"{backend}:", flush=True)
        results[backend] = one_backend(backend, args)
    print_table(results, args)
    print(f"\n(when: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
          f"load {os.getloadavg()[0]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
