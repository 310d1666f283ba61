"""Tasks run by workers in your own code, against Celery: throughput and the idle round trip.

    .venv/bin/python bench/tasks.py                       # SQLite and PostgreSQL, and Celery
    .venv/bin/python bench/tasks.py --backends sqlite --runs 2000 --idle 200

For each backend, a real `flowhook serve` and one SDK worker process (`flowhook tasks serve`,
concurrency 32) on the same machine, running a flow of three `task` steps whose functions do
nothing:

- throughput: ``--runs`` runs are queued first, then the worker starts; task completions per
  second from its start to the last run's end (three tasks a run);
- idle round trip: ``--idle`` runs one after another, nothing else going on; per task, from
  the task being ready (queued in the commit that puts its run to sleep) to the next task of
  the run being ready: claimed, run, completed, the run woken, the next step reached (read
  from the tasks' own timestamps), p50 and p99.

Beside them, Celery 5 with Redis (``redis://127.0.0.1:6379/15``, flushed first) running the
same jobs as chains of three no-op tasks with a prefork worker of two processes: chained jobs
per second, and the idle round trip per task. The targets (issue 53), scaled to the machine as
``bench/suite.py`` does: 1,500 task completions/s on SQLite, 1,200 on PostgreSQL, an idle
round trip p50 of at most 5 ms, and more jobs/s than Celery. Needs ``pip install
'celery[redis]'`` for the reference (skipped, and said so, without it).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from flowhook.store.db import Database
from flowhook.store.tables import tasks

sys.path.insert(0, str(Path(__file__).parent))
from harness import FLOWHOOK, percentile, running_server, secret_key_for

FLOW = {
    "name": "three tasks",
    "steps": [
        {"id": f"t{i}", "type": "task", "task": "noop", "input": {"n": "{{ payload.n }}"}}
        for i in (1, 2, 3)
    ],
}
WORKER = """
import os
from flowhook import Worker

worker = Worker(os.environ["FLOWHOOK_URL"], os.environ["FLOWHOOK_API_KEY"], concurrency=32)


@worker.task("noop")
async def noop(value, ctx):
    return value
"""
CELERY_APP = """
from celery import Celery

app = Celery("bench", broker="redis://127.0.0.1:6379/15", backend="redis://127.0.0.1:6379/15")
app.conf.update(worker_prefetch_multiplier=4, task_acks_late=False, result_expires=600)


@app.task
def noop(value):
    return value
"""


def _start_worker(folder: Path, base: str, key: str) -> subprocess.Popen[bytes]:
    (folder / "benchworker.py").write_text(textwrap.dedent(WORKER))
    env = {**os.environ, "FLOWHOOK_URL": base, "FLOWHOOK_API_KEY": key, "PYTHONPATH": str(folder)}
    return subprocess.Popen(
        [FLOWHOOK, "tasks", "serve", "benchworker:worker"], cwd=folder, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _execute(http: httpx.Client, flow_id: str, n: int) -> str:
    r = http.post("/api/v1/flows/execute", json={"flow_id": flow_id, "payload": {"n": n}})
    r.raise_for_status()
    return str(r.json()["run_id"])


def _ended(http: httpx.Client, run_id: str) -> dict[str, Any]:
    while True:
        run: dict[str, Any] = http.get(f"/api/v1/flows/runs/{run_id}", params={"wait": 30}).json()
        if run["status"] in ("completed", "failed", "cancelled"):
            if run["status"] != "completed":
                raise RuntimeError(f"run {run_id} {run['status']}: {run.get('error')}")
            return run


async def _round_trips(database_url: str, run_ids: list[str]) -> list[float]:
    """Milliseconds from each task being ready to its run's next task being ready."""
    db = Database(database_url, secret_key=secret_key_for(database_url))
    try:
        gaps: list[float] = []
        async with db.read() as conn:
            for run_id in run_ids:
                q = select(tasks.c.created_at).where(tasks.c.root_run_id == run_id)
                ready = sorted(r.created_at for r in (await conn.execute(q)).all())
                gaps += [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(ready)]
        return gaps
    finally:
        await db.dispose()


def flowhook_round(backend: str, runs: int, idle: int, postgres_url: str) -> dict[str, float]:
    with running_server(backend, postgres_url) as server:
        folder = Path(tempfile.mkdtemp(prefix="flowhook-tasks-"))
        try:
            with httpx.Client(base_url=server.base, headers=server.auth, timeout=60) as http:
                flow_id = http.post("/api/v1/flows", json=FLOW).json()["flow_id"]
                queued = [_execute(http, flow_id, n) for n in range(runs)]
                worker = _start_worker(folder, server.base, server.key)
                try:
                    started = time.monotonic()
                    for run_id in queued:
                        _ended(http, run_id)
                    took = time.monotonic() - started
                    for n in range(20):  # warm, then idle: one run at a time
                        _ended(http, _execute(http, flow_id, n))
                    alone = []
                    for n in range(idle):
                        run_id = _execute(http, flow_id, n)
                        _ended(http, run_id)
                        alone.append(run_id)
                finally:
                    _stop(worker)
            gaps = asyncio.run(_round_trips(server.database_url, alone))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return {
        "tasks_per_s": 3 * runs / took,
        "runs_per_s": runs / took,
        "idle_p50_ms": statistics.median(gaps),
        "idle_p99_ms": percentile(gaps, 99),
    }


def celery_round(runs: int, idle: int) -> dict[str, float] | None:
    try:
        import celery  # noqa: F401
        import redis
    except ImportError:
        return None
    folder = Path(tempfile.mkdtemp(prefix="flowhook-celery-"))
    (folder / "benchcelery.py").write_text(textwrap.dedent(CELERY_APP))
    redis.Redis(host="127.0.0.1", port=6379, db=15).flushdb()
    sys.path.insert(0, str(folder))
    from benchcelery import app, noop  # type: ignore[import-not-found]
    from celery import chain

    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchcelery", "worker", "--pool", "prefork",
         "--concurrency", "2", "--loglevel", "warning", "--without-gossip", "--without-mingle"],
        cwd=folder, env={**os.environ, "PYTHONPATH": str(folder)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        chain(noop.s(0), noop.s(), noop.s()).apply_async().get(timeout=60)  # started
        started = time.monotonic()
        results = [chain(noop.s(n), noop.s(), noop.s()).apply_async() for n in range(runs)]
        for r in results:
            r.get(timeout=300)
        took = time.monotonic() - started
        per_task = []
        for n in range(idle):
            began = time.perf_counter()
            chain(noop.s(n), noop.s(), noop.s()).apply_async().get(timeout=60)
            per_task.append((time.perf_counter() - began) * 1000 / 3)
    finally:
        _stop(proc)  # type: ignore[arg-type]
        app.close()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "tasks_per_s": 3 * runs / took,
        "runs_per_s": runs / took,
        "idle_p50_ms": statistics.median(per_task),
        "idle_p99_ms": percentile(per_task, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=2000, help="runs queued for throughput")
    parser.add_argument("--idle", type=int, default=200, help="runs one at a time")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--no-celery", action="store_true")
    args = parser.parse_args()
    rows: list[tuple[str, dict[str, float] | None]] = []
    for backend in args.backends.split(","):
        rows.append(
            (
                f"flowhook {backend}",
                flowhook_round(backend, args.runs, args.idle, args.postgres_url),
            )
        )
        print(f"{rows[-1][0]}: {rows[-1][1]}", flush=True)
    if not args.no_celery:
        rows.append(("celery 5 + redis", celery_round(args.runs, args.idle)))
    print()
    print(f"{'':22} {'tasks/s':>9} {'jobs/s':>8} {'idle p50 ms':>12} {'idle p99 ms':>12}")
    for name, f in rows:
        if f is None:
            print(f"{name:22} not measured: pip install 'celery[redis]'")
            continue
        print(
            f"{name:22} {f['tasks_per_s']:9,.0f} {f['runs_per_s']:8,.0f} "
            f"{f['idle_p50_ms']:12.2f} {f['idle_p99_ms']:12.2f}"
        )


if __name__ == "__main__":
    main()
