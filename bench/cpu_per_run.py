"""CPU time of `flowhook serve` per end-to-end run: accept, execute, webhook delivered.

    .venv/bin/python bench/cpu_per_run.py                      # both backends, 3 rounds each
    .venv/bin/python bench/cpu_per_run.py --backends sqlite --rounds 5 --runs 3000

Each round starts a real `flowhook serve` on a fresh database (bench/harness.py), subscribes
a signature-checking receiver to `flow.completed`, executes ``--runs`` runs of the
three-transform flow from 64 concurrent clients and waits until every run's webhook has
arrived. It prints the CPU seconds (user + system, from /proc) that the server spent over
that time per run, and the end-to-end rate. The server is the `serve` process and every
process under it: on SQLite `serve` is an API process with the engine (executor, webhook
dispatcher, scheduler) in a child process, and both are counted (the engine's share is
printed beside the total). PostgreSQL's own CPU is not counted; SQLite's is (it runs in
the server's processes). The load generator and receiver run in this process, on the same
cores, and are not counted.

Wall-clock throughput on a shared 2-core machine moves by ±30 % from round to round; CPU
per run moves far less. Compare two commits by running this script against each checkout
(``PYTHONPATH=<checkout>``), alternating, and comparing the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import Receiver, Server, client, create_flow, running_server, subscribe

CONCURRENCY = 64
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return found


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of ``pid`` and of every process under it, by pid."""
    seen: dict[int, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen[p] = _cpu(p)
            todo.extend(_children(p))
    return seen


async def one_round(server: Server, runs: int) -> tuple[float, float, float]:
    """Microseconds of server CPU per run (all processes; the children's alone), and runs
    per second, from the first execute to the last webhook."""
    assert server.process is not None
    pid = server.process.pid
    async with Receiver() as receiver, client(server) as http:
        flow_id = await create_flow(http)
        await subscribe(http, receiver, ["flow.completed"])
        before = tree_cpu(pid)
        started = time.perf_counter()
        todo = iter(range(runs))

        async def submit() -> None:
            for n in todo:
                body = {"flow_id": flow_id, "payload": {"n": n}}
                async with http.post("/api/v1/flows/execute", json=body) as r:
                    assert r.status == 202, await r.text()

        await asyncio.gather(*(submit() for _ in range(CONCURRENCY)))
        await receiver.wait_for_count(runs, timeout=300)
        await asyncio.sleep(0.5)  # the last completions' commits
        after = tree_cpu(pid)
        elapsed = receiver.last - started
    spent = {p: after[p] - before.get(p, 0.0) for p in after}
    total = sum(spent.values())
    children = sum(v for p, v in spent.items() if p != pid)
    return 1e6 * total / runs, 1e6 * children / runs, runs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3000, help="runs per round")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        figures, rates = [], []
        for _ in range(args.rounds):
            with running_server(backend, args.postgres_url) as server:
                cpu, engine, rate = asyncio.run(one_round(server, args.runs))
            figures.append(cpu)
            rates.append(rate)
            print(
                f"{backend}: {cpu:.0f} µs server CPU per run "
                f"({engine:.0f} in child processes), {rate:,.0f} runs/s",
                flush=True,
            )
        rounds = ", ".join(f"{f:.0f}" for f in figures)
        per_s = ", ".join(f"{r:,.0f}" for r in rates)
        print(
            f"{backend}: median {statistics.median(figures):.0f} µs per run [{rounds}], "
            f"{statistics.median(rates):,.0f} runs/s [{per_s}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
