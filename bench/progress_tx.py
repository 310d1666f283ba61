"""One run's trip through the store, timed on an idle machine: its claim, then its progress.

    .venv/bin/python bench/progress_tx.py --backends postgresql          # 1,500 runs
    PYTHONPATH=<checkout> .venv/bin/python bench/progress_tx.py --backends postgresql

For each of ``--runs`` runs of a three-step flow (one endpoint subscribed to its events), on
a fresh database: the run is started as the API starts it, claimed alone (the engine's
``claim_runs`` in a statement of its own), and its progress written as the executor writes
a run that finished (``apply_progress``: the run's move, its three steps, three events
and their deliveries, in one transaction). Prints the p50 and p90 wall time of the claim
and of the progress transaction, leaving out the first 100 runs (the statements are
prepared then). No server and no HTTP: the store's own share of an idle run's latency
(bench/suite.py's idle figure), counted in round trips more than in CPU.

Compare two commits by running it against each checkout, alternating, and comparing the
medians: a single pair moves by ±15 % on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import direct_store, fresh_database

from flowhook.events import make_event
from flowhook.store import runs as runs_store
from flowhook.store.models import RunStatus, RunStep, StepStatus

FLOW = {
    "name": "progress",
    "steps": [{"id": s, "type": "transform", "output": {"x": 1}} for s in "abc"],
}
WARM = 100


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    return f"p50 {statistics.median(ordered):.3f} ms, p90 {ordered[int(len(ordered) * 0.9)]:.3f} ms"


async def _measure(url: str, count: int) -> tuple[list[float], list[float]]:
    async with direct_store(url) as (db, services, who):
        flow = await services.flows.create(who, FLOW)
        await services.webhooks.create_endpoint(
            who, url="http://127.0.0.1:9/hook", events=["flow.started", "flow.completed"]
        )
        clock = services.runs._clock
        claims: list[float] = []
        writes: list[float] = []
        for n in range(count + WARM):
            await services.runs.start(who, flow_id=flow.flow_id, payload={"n": n})
            now = clock.now()
            began = time.perf_counter()
            async with db.statement() as conn:
                [run] = await runs_store.claim_runs(
                    conn, owner="bench", now=now, lease_until=now + timedelta(seconds=30), limit=64
                )
            claimed = time.perf_counter()
            events = [
                make_event(
                    kind, workspace_id=who.workspace_id, mode=who.mode, flow_id=flow.flow_id,
                    run_id=run.run_id, payload={"status": "completed"}, now=now,
                )
                for kind in ("flow.started", "flow.step_completed", "flow.completed")
            ]  # fmt: skip
            steps = [
                RunStep(i, s, "transform", StepStatus.COMPLETED, 1, now, now, 0, {"x": i})
                for i, s in enumerate("abc")
            ]
            progress = runs_store.Progress(
                run.run_id,
                (
                    runs_store.StatusChange(RunStatus.RUNNING, {"started_at": now}),
                    runs_store.StatusChange(
                        RunStatus.COMPLETED, {"finished_at": now, "output": {"n": n}}
                    ),
                ),
                steps,
                events,
            )
            written = time.perf_counter()
            async with db.transaction() as conn:
                [applied] = await runs_store.apply_progress(conn, [progress], owner="bench")
            done = time.perf_counter()
            if not applied:
                raise RuntimeError(f"the progress of {run.run_id} was refused")
            if n >= WARM:
                claims.append((claimed - began) * 1000)
                writes.append((done - written) * 1000)
        return claims, writes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument(
        "--postgres-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where a database per round is created and dropped",
    )
    args = parser.parse_args()
    for backend in args.backends.split(","):
        with fresh_database(backend, Path(tempfile.mkdtemp()), args.postgres_url) as url:
            claims, writes = asyncio.run(_measure(url, args.runs))
        print(f"{backend}: claim {_quantiles(claims)}; progress transaction {_quantiles(writes)}")


if __name__ == "__main__":
    main()
