"""The benchmark suite: one command, both backends, a table of medians and a chart.

    .venv/bin/python bench/suite.py                 # SQLite and PostgreSQL, medians of 3 (~15 min)
    .venv/bin/python bench/suite.py --smoke         # every benchmark once, small (CI runs this)
    .venv/bin/python bench/suite.py --backends sqlite --only accept,idle --repeat 5

Each round starts a fresh database and a real `flowhook serve` (as a newcomer runs it: on
either backend the API and an engine process beside it) and drives it from this machine over
127.0.0.1:

  accept      POST /api/v1/flows/execute under wrk at each --connections for --duration s:
              runs/s accepted (each durable before its 202), p50, p99; and in the same round
              an empty endpoint on the same stack (bench/reference_app.py), giving the ratio.
              The worker executes the accepted runs meanwhile, as it would in production;
              `flowhook api` alone (no engine in the process) at the highest --connections
              shows the accept path's own capacity.
  e2e         --e2e-runs runs of a three-transform flow, one endpoint subscribed to
              flow.completed on a local receiver that checks every signature: completed
              runs/s from the first submission until the last webhook arrived; then
              execute → webhook latency p50/p99 at a fixed --e2e-rate for --duration s.
  deliveries  --deliveries deliveries queued beforehand (events fanned out to --endpoints
              endpoints on the receiver, default settings: 8 requests in flight per
              endpoint to begin with, up to 16 while it answers fast): signed deliveries/s
              from the first arrival to the last, every attempt logged.
  idle        --idle-runs runs one after another on an idle server: execute → flow.completed
              received, p50 and p99.

Prints every round, then a table of medians with the targets of issue 18 (scaled by this
machine's ceiling, see ``verdicts``), and writes
bench/results/latest.json and bench/results/latest.png (the chart).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).parent))
from harness import (
    BIN,
    FLOWHOOK,
    ROOT,
    Receiver,
    Server,
    client,
    create_flow,
    direct_store,
    fresh_database,
    percentile,
    queue_events,
    running_server,
    subscribe,
    wrk_post,
)

Figures = dict[str, float]

TARGETS: dict[str, tuple[str, float]] = {
    "accept_c64_rps": (">=", 6000),
    "accept_c64_p99": ("<=", 50),
    "api_only_rps": (">=", 5000),
    "api_only_p99": ("<=", 50),
    "e2e_rps": (">=", 2000),
    "deliveries_rps": (">=", 5000),
    "idle_p50": ("<=", 10),
    "idle_p99": ("<=", 30),
}
"""Issue 18's targets for SQLite ``serve`` (the API process alone keeps issue 8's); PostgreSQL's
is 0.8× SQLite's figure (at least 0.8× a throughput, at most 1.25× a latency)."""

REFERENCE_API_ONLY = 9700.0
"""`flowhook api` alone, runs/s, on the machine issue 18's targets were set on. A throughput
target is scaled by this run's own figure over it (never up): the machine's ceiling measured
in the same run, so a slower machine is judged by what it can do."""

POSTGRES_SHARE = 0.8

LABELS: dict[str, str] = {
    "accept_c16_rps": "accept c16, runs/s",
    "accept_c16_p50": "accept c16, p50 ms",
    "accept_c16_p99": "accept c16, p99 ms",
    "accept_c64_rps": "accept c64, runs/s",
    "accept_c64_p50": "accept c64, p50 ms",
    "accept_c64_p99": "accept c64, p99 ms",
    "api_only_rps": "accept c64, API process alone, runs/s",
    "api_only_p99": "accept c64, API process alone, p99 ms",
    "empty_c16_rps": "empty endpoint c16, req/s",
    "empty_c64_rps": "empty endpoint c64, req/s",
    "ratio_c16": "accept / empty, c16",
    "ratio_c64": "accept / empty, c64",
    "ratio_api_only": "API process alone / empty, c64",
    "e2e_rps": "end to end, completed runs/s",
    "e2e_p50": "execute → webhook p50 ms",
    "e2e_p99": "execute → webhook p99 ms",
    "e2e_retries": "end to end, executes sent again after a reset",
    "deliveries_rps": "deliveries/s",
    "idle_p50": "idle execute → webhook p50 ms",
    "idle_p99": "idle execute → webhook p99 ms",
}


# -- the benchmarks --------------------------------------------------------------------------


def bench_accept(backend: str, args: argparse.Namespace) -> Figures:
    figures: Figures = {}
    for connections in args.connections:
        with running_server(backend, args.postgres_url) as server:
            flow_id = asyncio.run(_flow_for(server))
            body = orjson.dumps({"flow_id": flow_id, "trigger": "api", "payload": {"n": 1}})
            r = wrk_post(
                f"{server.base}/api/v1/flows/execute",
                body,
                server.auth,
                connections,
                args.duration,
            )
        if r["non2xx"]:
            raise RuntimeError(f"accept c{connections}: {r['non2xx']:.0f} answers were not 202")
        figures[f"accept_c{connections}_rps"] = r["rps"]
        figures[f"accept_c{connections}_p50"] = r["p50"]
        figures[f"accept_c{connections}_p99"] = r["p99"]
    # The accept path's own capacity: `flowhook api` (HTTP only, no engine in the process).
    top = max(args.connections)
    with running_server(backend, args.postgres_url, command=[FLOWHOOK, "api"]) as server:
        flow_id = asyncio.run(_flow_for(server))
        body = orjson.dumps({"flow_id": flow_id, "trigger": "api", "payload": {"n": 1}})
        r = wrk_post(f"{server.base}/api/v1/flows/execute", body, server.auth, top, args.duration)
        figures["api_only_rps"], figures["api_only_p99"] = r["rps"], r["p99"]
    reference = [str(BIN / "python"), str(ROOT / "bench" / "reference_app.py")]
    with running_server(backend, args.postgres_url, command=reference) as server:
        body = orjson.dumps({"flow_id": "wf_0", "trigger": "api", "payload": {"n": 1}})
        for connections in args.connections:
            r = wrk_post(f"{server.base}/bench/empty", body, {}, connections, args.duration)
            figures[f"empty_c{connections}_rps"] = r["rps"]
            figures[f"ratio_c{connections}"] = figures[f"accept_c{connections}_rps"] / r["rps"]
        figures["ratio_api_only"] = figures["api_only_rps"] / figures[f"empty_c{top}_rps"]
    return figures


async def _flow_for(server: Any) -> str:
    async with client(server) as http:
        return await create_flow(http)


# A connection the client's own load starved (reset, closed while it waited to write): the
# execute is sent again with the same Idempotency-Key, so a run the server did accept is
# answered again rather than started twice, and the retry is counted, not fatal.
_RESETS = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)


async def _execute(
    http: aiohttp.ClientSession, flow_id: str, n: int, retries: list[str] | None = None
) -> str:
    """Execute a run; with ``retries`` (a list the retries' causes are added to), under an
    ``Idempotency-Key`` so it is safe to send again after a reset connection."""
    headers = {"Idempotency-Key": f"bench-{id(retries)}-{n}"} if retries is not None else None
    body = {"flow_id": flow_id, "payload": {"n": n}}
    for attempt in range(6):
        try:
            async with http.post("/api/v1/flows/execute", json=body, headers=headers) as r:
                if r.status not in (200, 202):  # 200: the same key answered again
                    raise RuntimeError(f"execute answered {r.status}: {await r.text()}")
                return str((await r.json())["run_id"])
        except _RESETS as exc:
            if retries is None or attempt == 5:
                raise
            retries.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def _against_serve(
    backend: str,
    args: argparse.Namespace,
    measure: Callable[[Any, argparse.Namespace], Coroutine[Any, Any, Figures]],
) -> Figures:
    with running_server(backend, args.postgres_url) as server:
        return asyncio.run(measure(server, args))


def bench_e2e(backend: str, args: argparse.Namespace) -> Figures:
    return _against_serve(backend, args, _e2e)


async def _e2e(server: Any, args: argparse.Namespace) -> Figures:
    async with Receiver() as receiver, client(server) as http:
        flow_id = await create_flow(http)
        await subscribe(http, receiver, ["flow.completed"])
        # Throughput: submit every run as fast as 64 connections go, until every webhook is in.
        runs = args.e2e_runs
        todo = iter(range(runs))
        started = time.perf_counter()

        retries: list[str] = []

        async def submitter() -> None:
            for n in todo:
                await _execute(http, flow_id, n, retries)

        await asyncio.gather(*(submitter() for _ in range(64)))
        await receiver.wait_for_count(runs, timeout=max(120, runs / 50))
        throughput = runs / (receiver.last - started)
        if retries:
            print(f"  e2e: {len(retries)} executes sent again after a reset, e.g. {retries[0]}")
        if receiver.bad_signatures:
            raise RuntimeError(f"{receiver.bad_signatures} webhooks had a bad signature")
        # Latency at a fixed, moderate rate (open loop: sends do not wait for answers).
        receiver.reset()
        sent: dict[str, float] = {}
        count = max(1, round(args.e2e_rate * args.duration))
        begin = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, begin + i / args.e2e_rate - time.perf_counter()))
            at = time.perf_counter()
            sent[await _execute(http, flow_id, i)] = at

        await asyncio.gather(*(one(i) for i in range(count)))
        await receiver.wait_for_count(count, timeout=120)
        latencies = [(receiver.arrived[r] - at) * 1000 for r, at in sent.items()]
    return {
        "e2e_retries": float(len(retries)),
        "e2e_rps": throughput,
        "e2e_p50": percentile(latencies, 50),
        "e2e_p99": percentile(latencies, 99),
    }


def bench_deliveries(backend: str, args: argparse.Namespace) -> Figures:
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-bench-"))
    with fresh_database(backend, workdir, args.postgres_url) as url:
        return asyncio.run(_deliveries(Server(url, workdir), args))


async def _deliveries(server: Any, args: argparse.Namespace) -> Figures:
    async with Receiver() as receiver:
        # Queue the events (one delivery each) before the server starts, then time it.
        events = args.deliveries // args.endpoints
        async with direct_store(server.database_url) as (db, services, who):
            for n in range(args.endpoints):
                endpoint = await services.webhooks.create_endpoint(
                    who, url=receiver.url(n), events=["flow.completed"]
                )
                receiver.secrets[f"/hook/{n}"] = endpoint.secret.encode()
            await queue_events(db, who, "flow.completed", events)
        await asyncio.to_thread(server.start)
        try:
            total = events * args.endpoints
            await receiver.wait_for_count(total, timeout=max(120, total / 50))
        finally:
            await asyncio.to_thread(server.stop)
        if receiver.bad_signatures:
            raise RuntimeError(f"{receiver.bad_signatures} deliveries had a bad signature")
        rate = total / max(receiver.last - receiver.first, 1e-9)
    return {"deliveries_rps": rate}


def bench_idle(backend: str, args: argparse.Namespace) -> Figures:
    return _against_serve(backend, args, _idle)


async def _idle(server: Any, args: argparse.Namespace) -> Figures:
    async with Receiver() as receiver, client(server) as http:
        flow_id = await create_flow(http)
        await subscribe(http, receiver, ["flow.completed"])
        latencies = []
        for i in range(args.idle_runs):
            at = time.perf_counter()
            run_id = await _execute(http, flow_id, i)
            arrived = await asyncio.wait_for(receiver.expect(run_id), timeout=30)
            latencies.append((arrived - at) * 1000)
            await asyncio.sleep(0.02)  # idle again before the next one
    return {"idle_p50": percentile(latencies, 50), "idle_p99": percentile(latencies, 99)}


BENCHMARKS: dict[str, Callable[[str, argparse.Namespace], Figures]] = {
    "accept": bench_accept,
    "e2e": bench_e2e,
    "deliveries": bench_deliveries,
    "idle": bench_idle,
}


# -- the report ------------------------------------------------------------------------------


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "—"
    if key.startswith("ratio"):
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def verdicts(medians: dict[str, Figures]) -> dict[str, dict[str, str]]:
    """Per backend and target figure: 'met' or 'not met'. SQLite's throughput targets are
    scaled by this run's API-alone figure over :data:`REFERENCE_API_ONLY` (at most 1);
    PostgreSQL's goal is :data:`POSTGRES_SHARE` of SQLite's figure (a latency: SQLite's
    divided by it)."""
    out: dict[str, dict[str, str]] = {}
    sqlite = medians.get("sqlite", {})
    for backend, figures in medians.items():
        out[backend] = {}
        scale = min(1.0, figures.get("api_only_rps", REFERENCE_API_ONLY) / REFERENCE_API_ONLY)
        for key, (op, goal) in TARGETS.items():
            if key not in figures:
                continue
            value = figures[key]
            note = ""
            if backend == "postgresql":
                if key not in sqlite:
                    continue
                goal = sqlite[key] * POSTGRES_SHARE if op == ">=" else sqlite[key] / POSTGRES_SHARE
            elif op == ">=" and key != "api_only_rps" and scale < 1.0:
                note = f" = {goal:,.0f} × {scale:.2f}"
                goal *= scale
            ok = value >= goal if op == ">=" else value <= goal
            out[backend][key] = f"{'met' if ok else 'not met'} ({op} {_fmt(key, goal)}{note})"
    return out


def print_table(medians: dict[str, Figures], repeat: int) -> None:
    backends = list(medians)
    keys = [k for k in LABELS if any(k in medians[b] for b in backends)]
    judged = verdicts(medians)
    head = [
        "figure",
        *[f"{b} (median of {repeat})" for b in backends],
        *[f"{b} target" for b in backends],
    ]
    rows = [
        [
            LABELS[k],
            *[_fmt(k, medians[b].get(k)) for b in backends],
            *[judged[b].get(k, "") for b in backends],
        ]
        for k in keys
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print(line)
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print(line)


def write_chart(medians: dict[str, Figures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [
        ("Throughput (per second)", ["accept_c16_rps", "accept_c64_rps", "api_only_rps",
                                     "empty_c64_rps", "e2e_rps", "deliveries_rps"]),
        ("Latency (ms)", ["accept_c16_p99", "accept_c64_p99", "e2e_p50", "e2e_p99",
                          "idle_p50", "idle_p99"]),
    ]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    backends = list(medians)
    for ax, (title, keys) in zip(axes, groups, strict=True):
        keys = [k for k in keys if any(k in medians[b] for b in backends)]
        width = 0.8 / max(1, len(backends))
        for i, backend in enumerate(backends):
            xs = [j + i * width for j in range(len(keys))]
            values = [medians[backend].get(k, 0.0) for k in keys]
            bars = ax.bar(xs, values, width, label=backend)
            ax.bar_label(bars, labels=[_fmt(k, v) for k, v in zip(keys, values, strict=True)],
                         fontsize=7)  # fmt: skip
        for j, key in enumerate(keys):
            if key in TARGETS:
                goal = TARGETS[key][1]
                ax.hlines(goal, j - 0.1, j + 0.8, colors="red", linestyles="dashed", linewidth=1)
        ax.set_xticks([j + width * (len(backends) - 1) / 2 for j in range(len(keys))])
        ax.set_xticklabels([textwrap.fill(LABELS[k], 14) for k in keys], fontsize=7)
        ax.set_title(title)
        ax.legend()
    fig.suptitle("Flowhook benchmarks (medians; red dashes: issue 18 targets for SQLite)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="which benchmarks")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per load run")
    parser.add_argument("--connections", default="16,64")
    parser.add_argument("--e2e-runs", type=int, default=10000)
    parser.add_argument("--e2e-rate", type=float, default=200.0, help="runs/s for latency")
    parser.add_argument("--deliveries", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=8, help="for the deliveries")
    parser.add_argument("--idle-runs", type=int, default=200)
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(
            "FLOWHOOK_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a server where a database per round is created and dropped",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--smoke", action="store_true", help="every benchmark once and small: checks it runs"
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeat, args.duration, args.e2e_runs, args.e2e_rate = 1, 2.0, 300, 50.0
        args.deliveries, args.idle_runs = 300, 20
    args.connections = [int(c) for c in args.connections.split(",")]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    chosen = [b.strip() for b in args.only.split(",") if b.strip()]
    for name in chosen:
        if name not in BENCHMARKS:
            parser.error(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    for backend in backends:
        if backend not in ("sqlite", "postgresql"):
            parser.error(f"unknown backend {backend!r}: sqlite or postgresql")

    print(
        f"Flowhook benchmarks: {', '.join(chosen)} on {', '.join(backends)}; "
        f"{args.repeat} round(s); {os.cpu_count()} cores; Python {platform.python_version()}",
        flush=True,
    )
    rounds: dict[str, list[Figures]] = {b: [] for b in backends}
    for backend in backends:
        for i in range(args.repeat):
            figures: Figures = {}
            for name in chosen:
                started = time.perf_counter()
                got = BENCHMARKS[name](backend, args)
                figures.update(got)
                shown = ", ".join(f"{LABELS[k]} {_fmt(k, v)}" for k, v in got.items())
                print(
                    f"  {backend} round {i + 1} {name} ({time.perf_counter() - started:.0f} s): {shown}",
                    flush=True,
                )
            rounds[backend].append(figures)
    medians = {
        b: {k: statistics.median(r[k] for r in rs if k in r) for k in rs[0]}
        for b, rs in rounds.items()
        if rs
    }
    print()
    print_table(medians, args.repeat)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
            ).stdout.strip(),
        },
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "postgres_url")},
        "rounds": rounds,
        "medians": medians,
        "targets": verdicts(medians),
    }
    (args.out / "latest.json").write_text(json.dumps(report, indent=2, default=str))
    write_chart(medians, args.out / "latest.png")
    print(f"\nwrote {args.out / 'latest.json'} and {args.out / 'latest.png'}")


if __name__ == "__main__":
    main()
