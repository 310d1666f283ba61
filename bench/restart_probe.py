"""Accepts across a PostgreSQL restart: `flowhook api` + N `flowhook worker` processes on a
PRIVATE PostgreSQL cluster, open-loop load of ``POST /api/v1/flows/execute`` (each request
with its own Idempotency-Key, as a careful client sends them), each run's ``http`` step
POSTing to a local counting target, and ``pg_ctl restart`` of the cluster in the middle.

It prints, per second, the requests sent, the 202s, 503s and client timeouts, and the median
and p99 time to an answer of the requests sent in that second; then the accept rate before
and after the restart, and samples of ``pg_stat_activity`` (non-idle backends, their wait
events and queries) taken after the restart. Issue 19, finding 2.

Never point it at a shared cluster: it restarts the server. Make a private one first::

    mkdir -p /tmp/pgc && chown postgres /tmp/pgc
    su postgres -c "/usr/lib/postgresql/15/bin/initdb -D /tmp/pgc/data -A trust -U postgres"
    su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D /tmp/pgc/data -l /tmp/pgc/log \\
        -o '-p 55433 -c listen_addresses=127.0.0.1 -c unix_socket_directories=/tmp/pgc' start"

then (as root, so that ``pg_ctl`` runs as the user postgres; or as postgres itself)::

    .venv/bin/python bench/restart_probe.py --pgdata /tmp/pgc/data \\
        --url postgresql://postgres@127.0.0.1:55433/postgres \\
        --duration 70 --rate 200 --restart-at 25 --mode immediate

``--mode fast`` is a clean restart; ``--mode immediate`` makes the server crash-recover (the
closest to a restart with a checkpoint in progress). ``--json FILE`` writes the figures.
The exit status is 1 when the accept rate is not back within ``--recover-within`` seconds of
the server answering again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web
from harness import FLOWHOOK, Server, free_port, fresh_database, percentile


@dataclass
class Answer:
    sent: float
    latency: float
    status: int
    """HTTP status; 0 for a client timeout, -1 for a transport error."""


@dataclass
class Probe:
    start: float = 0.0
    restart_begun: float = 0.0
    restart_done: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    activity: list[dict[str, Any]] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    url: str = ""
    statements_before: dict[str, dict[str, float]] = field(default_factory=dict)
    statements_after: dict[str, dict[str, float]] = field(default_factory=dict)


# -- the counting target ---------------------------------------------------------------------


class Target:
    """Counts the POSTs of each run's http step, on its own thread and event loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.calls: dict[str, int] = defaultdict(int)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> Target:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve(self) -> None:
        async def count(request: web.Request) -> web.Response:
            body = await request.json()
            self.calls[str(body.get("run_id"))] += 1
            return web.json_response({"ok": True})

        async def setup() -> None:
            app = web.Application()
            app.router.add_post("/count", count)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port, backlog=1024).start()

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(setup())
        self._ready.set()
        self._loop.run_forever()


def probe_flow(target: Target) -> dict[str, Any]:
    return {
        "name": "restart-probe",
        "steps": [
            {
                "id": "call",
                "type": "http",
                "request": {
                    "method": "POST",
                    "url": f"http://127.0.0.1:{target.port}/count",
                    "json": {"run_id": "{{ run.id }}"},
                },
            }
        ],
    }


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_ctl(pgdata: str, *args: str) -> None:
    """Run pg_ctl on the private cluster, as the user postgres when we are root. The server's
    log goes to ``<pgdata>/restart_probe.log`` (a server that kept our stdout would keep
    pg_ctl's caller waiting)."""
    binary = shutil.which("pg_ctl") or str(
        sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
    )
    command = [binary, "-D", pgdata, "-l", f"{pgdata}/restart_probe.log", *args]
    if os.geteuid() == 0:
        command = ["su", "postgres", "-c", " ".join(command)]
    subprocess.run(
        command, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip


async def sample_activity(url: str, probe: Probe, stop: asyncio.Event) -> None:
    """Every second: the non-idle backends of the database (besides this one)."""
    conn: Any = None
    while not stop.is_set():
        try:
            if conn is None or conn.is_closed():
                conn = await asyncpg.connect(url, timeout=2)
            rows = await conn.fetch(
                "SELECT state, wait_event_type, wait_event, left(query, 120) AS query,"
                " now() - query_start AS running FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND state <> 'idle'"
            )
            probe.activity.append(
                {
                    "t": time.monotonic() - probe.start,
                    "backends": [
                        {**dict(r), "running": r["running"].total_seconds() if r["running"] else 0}
                        for r in rows
                    ],
                }
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            conn = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    if conn is not None:
        await conn.close()


async def statements(url: str) -> dict[str, dict[str, float]]:
    """pg_stat_statements of the database, when the extension is there: per statement, calls
    and total and mean execution time (ms). Empty otherwise."""
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return {}
    try:
        rows = await conn.fetch(
            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS q, sum(calls) AS calls,"
            " sum(total_exec_time) AS total, sum(total_plan_time) AS plan,"
            " sum(shared_blks_hit + shared_blks_read) AS blocks"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = current_database() GROUP BY 1"
        )
    except asyncpg.PostgresError:
        return {}
    finally:
        await conn.close()
    return {
        r["q"]: {
            "calls": float(r["calls"]),
            "total_ms": float(r["total"]),
            "plan_ms": float(r["plan"]),
            "blocks": float(r["blocks"]),
        }
        for r in rows
    }


async def prefill(url: str, n: int) -> None:
    """``n`` finished runs with Idempotency-Keys in the probe's workspace, as a database
    holds after a while of load (written by SQL, so nothing analyzes the table)."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO runs (run_id, workspace_id, mode, flow_id, flow_version, trigger,"
            " status, payload, queued_at, available_at, due_at, idempotency_key, request_hash)"
            " SELECT 'run_prefill' || lpad(i::text, 20, '0'), k.workspace_id, k.mode,"
            " 'wf_prefill', 1, 'api', 'completed', '{}', now(), now(), now(), md5(i::text),"
            " md5(i::text) FROM generate_series(1, $1) i,"
            " (SELECT workspace_id, mode FROM api_keys LIMIT 1) k",
            n,
        )
    finally:
        await conn.close()


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def sample_cpu(pids: dict[str, int], probe: Probe, stop: asyncio.Event) -> None:
    last = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        now = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        probe.cpu.append(
            {"t": time.monotonic() - probe.start, **{k: now[k] - last[k] for k in now}}
        )
        last = now


# -- the load --------------------------------------------------------------------------------


async def load(
    http: aiohttp.ClientSession, flow_id: str, probe: Probe, rate: float, duration: float
) -> None:
    """Open loop: one request every 1/rate s whatever the answers, each with its own key."""
    tasks: set[asyncio.Task[None]] = set()

    async def one(sent: float) -> None:
        body = {"flow_id": flow_id, "payload": {"n": 1}}
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        try:
            async with http.post("/api/v1/flows/execute", json=body, headers=headers) as r:
                await r.read()
                status = r.status
        except TimeoutError:
            status = 0
        except aiohttp.ClientError:
            status = -1
        probe.answers.append(Answer(sent - probe.start, time.monotonic() - sent, status))

    n = 0
    while True:
        due = probe.start + n / rate
        if due - probe.start >= duration:
            break
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(time.monotonic()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    if tasks:
        await asyncio.wait(tasks)


async def restart_later(pgdata: str, mode: str, at: float, probe: Probe) -> None:
    await asyncio.sleep(max(0.0, probe.start + at - time.monotonic()))
    probe.statements_before = await statements(probe.url)
    probe.restart_begun = time.monotonic() - probe.start
    await asyncio.to_thread(pg_ctl, pgdata, "restart", "-m", mode, "-w")
    probe.restart_done = time.monotonic() - probe.start


# -- the report ------------------------------------------------------------------------------


def per_second(probe: Probe) -> list[dict[str, Any]]:
    """Answers grouped by the second their request was sent."""
    seconds: dict[int, list[Answer]] = defaultdict(list)
    for a in probe.answers:
        seconds[int(a.sent)].append(a)
    rows = []
    for s in sorted(seconds):
        group = seconds[s]
        ok = [a.latency for a in group if a.status == 202]
        rows.append(
            {
                "second": s,
                "sent": len(group),
                "accepted": len(ok),
                "unavailable": sum(a.status == 503 for a in group),
                "timeouts": sum(a.status == 0 for a in group),
                "other": sum(a.status not in (0, 202, 503) for a in group),
                "p50": statistics.median(ok) if ok else float("nan"),
                "p99": percentile(ok, 99),
            }
        )
    return rows


def accepted_per_second(probe: Probe, start: float, end: float) -> float:
    """202s answered between ``start`` and ``end`` (seconds since the load began), per second."""
    done = [a.sent + a.latency for a in probe.answers if a.status == 202]
    return sum(start <= t < end for t in done) / max(end - start, 1e-9)


def recovery_time(probe: Probe, rate: float) -> float:
    """Seconds from the server's restart until requests sent are again answered with 202 in
    under a second, for 3 consecutive seconds (inf when never)."""
    good = 0
    for row in per_second(probe):
        if row["second"] < probe.restart_done:
            continue
        fine = row["accepted"] >= 0.9 * row["sent"] and row["p99"] < 1.0
        good = good + 1 if fine else 0
        if good == 3:
            return max(0.0, row["second"] - 2 - probe.restart_done)
    return float("inf")


def report(probe: Probe, rate: float, duration: float) -> dict[str, Any]:
    rows = per_second(probe)
    print(" sec  sent  202  503  t/o  other   p50 s   p99 s")
    for r in rows:
        mark = " <- restart" if int(probe.restart_begun) == r["second"] else ""
        print(
            f"{r['second']:4d} {r['sent']:5d} {r['accepted']:4d} {r['unavailable']:4d}"
            f" {r['timeouts']:4d} {r['other']:6d} {r['p50']:7.3f} {r['p99']:7.3f}{mark}"
        )
    before = accepted_per_second(probe, 3, probe.restart_begun)
    after = accepted_per_second(probe, probe.restart_done + 5, duration)
    recovered = recovery_time(probe, rate)
    after_lat = [
        a.latency for a in probe.answers if a.status == 202 and a.sent > probe.restart_done + 5
    ]
    summary = {
        "restart": [round(probe.restart_begun, 2), round(probe.restart_done, 2)],
        "accepts_per_s_before": round(before, 1),
        "accepts_per_s_after": round(after, 1),
        "median_latency_after": round(statistics.median(after_lat), 3) if after_lat else None,
        "timeouts": sum(a.status == 0 for a in probe.answers),
        "recovered_after_s": recovered,
    }
    print(json.dumps(summary))
    waits: dict[str, int] = defaultdict(int)
    for sample in probe.activity:
        if sample["t"] < probe.restart_done:
            continue
        for b in sample["backends"]:
            waits[f"{b['wait_event_type']}:{b['wait_event']} {b['state']} {b['query'][:70]!r}"] += 1
    print("pg_stat_activity after the restart (samples of non-idle backends):")
    for what, n in sorted(waits.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {n:5d}  {what}")
    if probe.statements_after:
        print("statements, before the restart / after it: calls, mean ms, blocks per call")
        before_s, after_s = probe.statements_before, probe.statements_after
        crashed = sum(v["calls"] for v in after_s.values()) < sum(
            v["calls"] for v in before_s.values()
        )  # an immediate restart discards the counts
        top = sorted(after_s.items(), key=lambda kv: -kv[1]["total_ms"])[:12]
        for q, a in top:
            b = before_s.get(q, {"calls": 0.0, "total_ms": 0.0, "blocks": 0.0})
            if not crashed:
                a = {k: a[k] - b.get(k, 0.0) for k in a}
            print(
                f"  {b['calls']:7.0f} {b['total_ms'] / max(b['calls'], 1):7.2f}"
                f" {b['blocks'] / max(b['calls'], 1):7.1f} | {a['calls']:7.0f}"
                f" {a['total_ms'] / max(a['calls'], 1):7.2f} {a['blocks'] / max(a['calls'], 1):7.1f}"
                f"  {q[:80]}"
            )
    if probe.cpu:
        print("CPU (cores) before / after the restart:")
        for name in probe.cpu[0]:
            if name == "t":
                continue
            b = [c[name] for c in probe.cpu if 3 <= c["t"] < probe.restart_begun]
            a = [c[name] for c in probe.cpu if c["t"] > probe.restart_done + 5]
            print(
                f"  {name:10s} {statistics.fmean(b or [0]):.2f} / {statistics.fmean(a or [0]):.2f}"
            )
    return {"summary": summary, "seconds": rows, "activity": probe.activity, "cpu": probe.cpu}


# -- main ------------------------------------------------------------------------------------


async def run_probe(
    args: argparse.Namespace, url: str, server: Server, workers: list[int]
) -> Probe:
    probe = Probe(url=url)
    timeout = aiohttp.ClientTimeout(total=args.client_timeout)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        base_url=server.base, headers=server.auth, timeout=timeout, connector=connector
    ) as http:
        async with http.post("/api/v1/flows", json=probe_flow(args.target)) as r:
            assert r.status == 201, await r.text()
            flow_id = (await r.json())["flow_id"]
        if args.prefill:
            await prefill(url, args.prefill)
        stop = asyncio.Event()
        assert server.process is not None
        pids = {"api": server.process.pid, **{f"worker{i}": p for i, p in enumerate(workers)}}
        probe.start = time.monotonic()
        samplers = [
            asyncio.create_task(sample_activity(url, probe, stop)),
            asyncio.create_task(sample_cpu(pids, probe, stop)),
        ]
        restart = asyncio.create_task(restart_later(args.pgdata, args.mode, args.restart_at, probe))
        await load(http, flow_id, probe, args.rate, args.duration)
        await restart
        probe.statements_after = await statements(url)
        stop.set()
        await asyncio.gather(*samplers)
    return probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="admin URL of the PRIVATE cluster")
    parser.add_argument("--pgdata", required=True, help="its data directory (for pg_ctl)")
    parser.add_argument("--duration", type=float, default=70.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--restart-at", type=float, default=25.0)
    parser.add_argument("--mode", choices=["fast", "immediate", "smart"], default="immediate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lease-seconds", default="3")
    parser.add_argument("--client-timeout", type=float, default=30.0)
    parser.add_argument("--recover-within", type=float, default=5.0)
    parser.add_argument("--prefill", type=int, default=0, help="finished runs to start with")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--log", type=Path, default=Path("restart_probe.log"), help="workers' stderr"
    )
    args = parser.parse_args(argv)
    env = {"FLOWHOOK_LEASE_SECONDS": args.lease_seconds}
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-restart-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with Target() as target, fresh_database("postgresql", workdir, args.url) as url:
            args.target = target
            server = Server(url, workdir, command=[FLOWHOOK, "api"], env=env)
            log = open(args.log, "ab")  # noqa: SIM115 - the workers' stderr, closed below
            server.start()
            try:
                time.sleep(1.0)
                for _ in range(args.workers):
                    procs.append(
                        subprocess.Popen(
                            [FLOWHOOK, "worker"], env=server.environment(), cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=log,
                        )
                    )  # fmt: skip
                time.sleep(2.0)
                probe = asyncio.run(run_probe(args, url, server, [p.pid for p in procs]))
            finally:
                for p in procs:
                    p.send_signal(signal.SIGTERM)
                for p in procs:
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                server.stop()
                log.close()
            figures = report(probe, args.rate, args.duration)
            figures["side_effects"] = {
                "runs_called": len(target.calls),
                "called_twice": sum(n > 1 for n in target.calls.values()),
            }
            print(json.dumps(figures["side_effects"]))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
    return 0 if figures["summary"]["recovered_after_s"] <= args.recover_within else 1


if __name__ == "__main__":
    sys.exit(main())
