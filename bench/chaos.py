"""Chaos soak: open-loop load with kill -9 of the processes that run the engine, and a
PostgreSQL restart, then a count of what was lost, what ran twice and why.

Each run of the soak's flow makes one `http` step POST its run id to a counting target in this
process; an endpoint subscribed to ``flow.completed`` points at a receiver here that checks
every signature (with ``flowhook.signing``) and counts webhooks per event id.

- sqlite: one `flowhook serve`, killed with SIGKILL ``--kills`` times and restarted at once.
- postgresql: `flowhook api` and two `flowhook worker` on a private PostgreSQL cluster made
  for the soak (initdb into a temporary directory, as user postgres when run as root, on a
  free port of 127.0.0.1); a random worker is killed ``--kills`` times (restarted at once),
  and PostgreSQL is restarted once (``pg_ctl restart -m fast``) in the middle of the load.

Every request carries its own Idempotency-Key and is retried with the same key on a timeout,
a 5xx or a connection error, so a run accepted before a crash is never submitted twice.

    .venv/bin/python bench/chaos.py --seconds 90 --rate 200 --kills 5 [--json out.json]

A *repeated side effect* is a run whose target got more than one call. It is *explained* by
a fault when the process that made the first call (found from the call's TCP source port)
was killed, or PostgreSQL was restarted, while that step could still be in flight: the fault
began no earlier than ``SKEW`` before the first call, no later than ``--inflight-window``
seconds after it, and before the second call; or PostgreSQL was down when the first call
came; never when the engine logged the run's write as dropped. A duplicate webhook (one
event id received twice) is explained when its first attempt is logged as timed out (the
documented retry), or when the attempt log shows it never finished and its sender was
killed (or PostgreSQL restarted) between the two arrivals. Anything else is a defect.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from flowhook.ids import unpack_id
from flowhook.signing import standard_signature, x_service_signature

sys.path.insert(0, str(Path(__file__).parent))
from harness import BENCH_SECRET_KEY, FLOWHOOK, PrivatePostgres, free_port

SKEW = 0.1
"""Seconds a call may reach the target after the kill of the process that sent it (it was
already in the socket)."""

DROPPED = re.compile(r"run (run_[0-9a-z]+): unexpected error in the engine")

LEASE_SECONDS = 3
WEBHOOK_TIMEOUT = 2
"""The webhook request timeout; a delivery's lease is 3 × this + 1 s (7 s), so a delivery cut
by a kill is sent again within the drain."""


# -- faults and their explanation ------------------------------------------------------------


@dataclass
class Fault:
    """A kill (of ``pid``) or a PostgreSQL restart (``pid`` None: every process), from ``at``
    to ``until`` (seconds since the load began)."""

    kind: str
    at: float
    until: float
    pid: int | None = None
    role: str = ""


def explain(
    first_at: float,
    first_pid: int | None,
    second_at: float,
    faults: list[Fault],
    window: float,
) -> Fault | None:
    """The fault that explains a second call (or webhook) at ``second_at`` after a first one
    at ``first_at`` from process ``first_pid`` (None: unknown), or None: a defect."""
    for fault in faults:
        if fault.pid is not None and first_pid is not None and fault.pid != first_pid:
            continue
        if first_at - SKEW <= fault.at <= min(first_at + window, second_at):
            return fault
        if fault.pid is None and fault.at <= first_at <= fault.until:
            return fault
    return None


@dataclass
class Call:
    """One call to the target (or one webhook): when, and from which of our processes."""

    at: float
    pid: int | None = None
    port: int = 0
    attempt: int = 0
    """X-Service-Attempt of a webhook."""


# -- which of our processes made a call ------------------------------------------------------


class PeerMap:
    """Which of our processes (``pids()``) owns each loopback connection to the sink, by the
    connection's source port: ``ss`` (kernel-filtered, a few ms) lists the sink's peers with
    their socket inodes, and /proc/<pid>/fd says whose they are. Looked up off the event loop
    shortly after a call, and before every kill; an unknown caller is None."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self.port = 0
        self.cache: dict[int, int] = {}
        self._pending: list[Call] = []
        self._lock = asyncio.Lock()

    def note(self, call: Call, port: int) -> None:
        """Record ``call`` from ``port``; its pid is filled in now or at the next refresh."""
        call.port = port
        call.pid = self.cache.get(port)
        if call.pid is None:
            self._pending.append(call)

    async def refresh(self) -> None:
        """Resolve every pending call's port (calls whose connection closed stay unknown)."""
        async with self._lock:
            if not self._pending:
                return
            pending, self._pending = self._pending, []
            self.cache.update(await asyncio.to_thread(self._scan))
            for call in pending:
                call.pid = self.cache.get(call.port)

    async def run(self) -> None:
        live: set[int] = set()
        while True:
            await asyncio.sleep(0.05)
            now = set(await asyncio.to_thread(self.pids))
            if now != live:  # a process died: its ports may come back as another's
                live = now
                self.cache = {port: pid for port, pid in self.cache.items() if pid in live}
            await self.refresh()

    def _scan(self) -> dict[int, int]:
        try:
            out = subprocess.run(
                ["ss", "-tneH", "state", "established", f"( dport = :{self.port} )"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return {}
        by_inode: dict[str, int] = {}
        for line in out.splitlines():
            cols = line.split()
            inode = next((c[4:] for c in cols if c.startswith("ino:")), None)
            if len(cols) >= 4 and inode:
                by_inode[inode] = int(cols[2].rsplit(":", 1)[1])
        found: dict[int, int] = {}
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                        port = by_inode.get(link.removeprefix("socket:[").rstrip("]"))
                        if port is not None:
                            found[port] = pid
        return found


# -- the counting target and the webhook receiver --------------------------------------------


class Sink:
    """The counting target and the webhook receiver, in a process of their own (so the load
    generator's CPU does not slow their answers): ``/target`` counts the http step's calls
    per run id, ``/hook`` checks signatures and counts webhooks per event id; ``/control/…``
    sets the endpoint's secret, resolves callers now, and returns everything recorded.
    Times are ``time.monotonic()`` (the same clock in every process)."""

    def __init__(self, port: int, pids_file: Path) -> None:
        self.port = port
        self.peers = PeerMap(lambda: [int(p) for p in json.loads(pids_file.read_text() or "[]")])
        self.peers.port = port
        self.calls: dict[str, list[Call]] = {}
        self.hooks: dict[str, list[Call]] = {}
        self.completed_hooks: set[str] = set()
        self.bad_signatures = 0
        self.secret = ""

    def _record(self, request: web.Request, attempt: int = 0) -> Call:
        call = Call(time.monotonic(), attempt=attempt)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            self.peers.note(call, int(peer[1]))
        return call

    async def _target(self, request: web.Request) -> web.Response:
        body = await request.json()
        call = self._record(request)
        self.calls.setdefault(str(body["run_id"]), []).append(call)
        return web.json_response({"ok": True})

    def _signed(self, body: bytes, h: Any) -> bool:
        legacy = x_service_signature(self.secret, body)
        signed = standard_signature(
            self.secret, h.get("webhook-id", ""), int(h.get("webhook-timestamp", "0")), body
        )
        return (
            hmac.compare_digest(legacy, h.get("X-Service-Signature", ""))
            and signed in h.get("webhook-signature", "").split(" ")
            and h.get("webhook-id") == h.get("X-Service-Event-Id")
        )

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        h = request.headers
        if not self._signed(body, h):
            self.bad_signatures += 1
            return web.Response(status=401)
        call = self._record(request, int(h.get("X-Service-Attempt", "0")))
        self.hooks.setdefault(h.get("X-Service-Event-Id", ""), []).append(call)
        envelope = json.loads(body)
        run_id = envelope.get("run_id") or envelope.get("data", {}).get("run_id")
        if h.get("X-Service-Event") == "flow.completed" and run_id:
            self.completed_hooks.add(str(run_id))
        return web.Response(text="ok")

    async def _secret(self, request: web.Request) -> web.Response:
        self.secret = (await request.json())["secret"]
        return web.Response(text="ok")

    async def _refresh(self, _request: web.Request) -> web.Response:
        await self.peers.refresh()
        return web.Response(text="ok")

    async def _state(self, _request: web.Request) -> web.Response:
        await self.peers.refresh()
        return web.json_response({
            "calls": {k: [asdict(c) for c in v] for k, v in self.calls.items()},
            "hooks": {k: [asdict(c) for c in v] for k, v in self.hooks.items()},
            "completed_hooks": sorted(self.completed_hooks),
            "bad_signatures": self.bad_signatures,
        })  # fmt: skip

    async def serve(self) -> None:
        app = web.Application(client_max_size=1024**2)
        app.router.add_post("/target", self._target)
        app.router.add_post("/hook", self._hook)
        app.router.add_post("/control/secret", self._secret)
        app.router.add_post("/control/refresh", self._refresh)
        app.router.add_get("/control/state", self._state)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, backlog=1024).start()
        resolver = asyncio.create_task(self.peers.run())
        try:
            await asyncio.Event().wait()  # until SIGTERM
        finally:
            resolver.cancel()
            await runner.cleanup()


@dataclass
class SinkState:
    """What the sink recorded, its times made relative to the load's start."""

    calls: dict[str, list[Call]]
    hooks: dict[str, list[Call]]
    completed_hooks: set[str]
    bad_signatures: int


class SinkProcess:
    """Starts the sink (``chaos.py --serve-sink PORT PIDS_FILE``) and talks to it."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.pids_file = workdir / "pids.json"
        self.pids_file.write_text("[]")
        self.process: subprocess.Popen[bytes] | None = None
        self.base = f"http://127.0.0.1:{self.port}"

    @property
    def target_url(self) -> str:
        return f"{self.base}/target"

    @property
    def hook_url(self) -> str:
        return f"{self.base}/hook"

    def publish(self, pids: list[int]) -> None:
        """The pids of our Flowhook processes, for the sink to name its callers."""
        tmp = self.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids))
        tmp.replace(self.pids_file)

    async def __aenter__(self) -> SinkProcess:
        command = [sys.executable, __file__, "--serve-sink", str(self.port), str(self.pids_file)]
        self.process = subprocess.Popen(command)
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as http:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.post(f"{self.base}/control/refresh") as r:
                        if r.status == 200:
                            return self
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("the sink did not start")
                await asyncio.sleep(0.1)

    async def __aexit__(self, *_exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(self.process.wait)

    async def _post(self, path: str, body: Any = None) -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.base}{path}", json=body) as r,
        ):
            r.raise_for_status()

    async def set_secret(self, secret: str) -> None:
        await self._post("/control/secret", {"secret": secret})

    async def refresh(self) -> None:
        await self._post("/control/refresh")

    async def state(self, t0: float) -> SinkState:
        async with aiohttp.ClientSession() as http, http.get(f"{self.base}/control/state") as r:
            raw = await r.json()

        def calls(data: dict[str, list[dict[str, Any]]]) -> dict[str, list[Call]]:
            return {k: [Call(**{**c, "at": c["at"] - t0}) for c in v] for k, v in data.items()}

        return SinkState(
            calls(raw["calls"]), calls(raw["hooks"]), set(raw["completed_hooks"]),
            raw["bad_signatures"],
        )  # fmt: skip


def serve_sink(port: int, pids_file: Path) -> None:
    """The sink process's main: serve until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Sink(port, pids_file).serve())


async def deadlocks(admin_url: str) -> int:
    conn = await asyncpg.connect(admin_url)
    try:
        return int(await conn.fetchval("SELECT coalesce(sum(deadlocks), 0) FROM pg_stat_database"))
    finally:
        await conn.close()


# -- Flowhook's processes --------------------------------------------------------------------


@dataclass
class Proc:
    """One Flowhook process we started (and only kill by its pid)."""

    role: str
    command: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        self.pids.append(self.process.pid)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def flowhook_env(database_url: str, port: int) -> dict[str, str]:
    env = {
        **os.environ,
        "FLOWHOOK_DATABASE_URL": database_url,
        "FLOWHOOK_PORT": str(port),
        "FLOWHOOK_HOST": "127.0.0.1",
        "FLOWHOOK_LOG_LEVEL": "warning",
        "FLOWHOOK_LOG_FORMAT": "text",
        "FLOWHOOK_RATE_LIMIT": "0",
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",  # the target and receiver are on 127.0.0.1
        "FLOWHOOK_LEASE_SECONDS": str(LEASE_SECONDS),
        "FLOWHOOK_WEBHOOK_TIMEOUT": str(WEBHOOK_TIMEOUT),
    }
    if database_url.startswith("postgres"):
        env["FLOWHOOK_SECRET_KEY"] = BENCH_SECRET_KEY
    return env


def create_key(env: dict[str, str]) -> str:
    out = subprocess.run(
        [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", "chaos", "--json"],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return str(json.loads(out.stdout)["key"])


async def wait_healthy(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with http.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{base} never became healthy")


def flow_definition(target_url: str) -> dict[str, Any]:
    return {
        "name": "chaos",
        "steps": [
            {"id": "before", "type": "transform", "output": {"n": "{{ payload.n }}"}},
            {
                "id": "call",
                "type": "http",
                "timeout_seconds": 10,
                "request": {
                    "method": "POST",
                    "url": target_url,
                    "json": {"run_id": "{{ run.id }}"},
                },
            },
            {"id": "after", "type": "transform", "output": {"ok": True}},
        ],
        "output": {"n": "{{ payload.n }}"},
    }


async def prepare(base: str, key: str, sink: SinkProcess) -> str:
    """Create the flow and the endpoint; the flow's id."""
    auth = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(base_url=base, headers=auth) as http:
        async with http.post("/api/v1/flows", json=flow_definition(sink.target_url)) as r:
            assert r.status == 201, await r.text()
            flow_id = str((await r.json())["flow_id"])
        endpoint = {"url": sink.hook_url, "events": ["flow.completed"]}
        async with http.post("/api/v1/webhooks/endpoints", json=endpoint) as r:
            assert r.status == 201, await r.text()
            await sink.set_secret(str((await r.json())["secret"]))
    return flow_id


# -- the load ---------------------------------------------------------------------------------


@dataclass
class Request:
    scheduled: float
    accepted_at: float | None = None
    run_id: str | None = None
    attempts: int = 0


@dataclass
class Load:
    """Open-loop POST /api/v1/flows/execute at ``rate`` for ``seconds``; each request retried
    with its Idempotency-Key until ``retry_until`` (seconds since the load began)."""

    base: str
    key: str
    flow_id: str
    rate: float
    seconds: float
    seed: int
    clock: Callable[[], float]
    timeout: float = 30.0
    retry_until: float = 0.0
    requests: list[Request] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    no_retry_after: int = 0
    max_lag: float = 0.0
    """The most a request went out after its scheduled time (the generator's own delay)."""

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=512)
        headers = {"Authorization": f"Bearer {self.key}"}
        async with aiohttp.ClientSession(
            base_url=self.base, headers=headers, connector=connector
        ) as http:
            tasks = []
            for i in range(int(self.seconds * self.rate)):
                at = i / self.rate
                delay = at - self.clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.max_lag = max(self.max_lag, self.clock() - at)
                request = Request(at)
                self.requests.append(request)
                tasks.append(asyncio.create_task(self._one(http, i, request)))
            await asyncio.gather(*tasks)

    async def _one(self, http: aiohttp.ClientSession, i: int, request: Request) -> None:
        body = {"flow_id": self.flow_id, "payload": {"n": i}}
        headers = {"Idempotency-Key": f"chaos-{self.seed}-{i}"}
        backoff = 0.1  # after a connection error (the server is down): doubled up to 2 s
        while self.clock() < self.retry_until:
            request.attempts += 1
            wait = 0.2
            try:
                async with http.post(
                    "/api/v1/flows/execute", json=body, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                ) as r:  # fmt: skip
                    self.statuses[str(r.status)] += 1
                    if r.status == 202:
                        request.run_id = str((await r.json())["run_id"])
                        request.accepted_at = self.clock()
                        return
                    await r.read()
                    if r.status == 503:
                        retry_after = r.headers.get("Retry-After")
                        if retry_after is None:
                            self.no_retry_after += 1
                        wait = min(5.0, float(retry_after or 1))
                    elif r.status < 500:
                        return  # a 4xx is final: counted, never retried
            except TimeoutError:
                self.statuses["timeout"] += 1
                wait = 1.0
            except aiohttp.ClientError:
                self.statuses["connection error"] += 1
                backoff = wait = min(2.0, backoff * 2)
            await asyncio.sleep(wait)


def windows(requests: list[Request], restart: float, end: float) -> list[dict[str, Any]]:
    """Accepts/s and the median seconds from a request's scheduled time to its 202, in the 10 s
    before ``restart`` and in 5 s windows after it."""
    spans = [(max(0.0, restart - 10), restart)]
    start = restart
    while start < end:
        spans.append((start, min(start + 5, end)))
        start += 5
    out = []
    for lo, hi in spans:
        accepted = [r for r in requests if r.accepted_at is not None and lo <= r.accepted_at < hi]
        sent = [r.accepted_at - r.scheduled for r in requests
                if lo <= r.scheduled < hi and r.accepted_at is not None]  # fmt: skip
        out.append({
            "from": round(lo - restart, 1), "to": round(hi - restart, 1),
            "accepted_per_s": round(len(accepted) / max(hi - lo, 1e-9), 1),
            "median_s": round(statistics.median(sent), 3) if sent else None,
        })  # fmt: skip
    return out


# -- what the database says -------------------------------------------------------------------


@dataclass
class DbState:
    runs: dict[str, str]
    """run_id → status."""
    pending_deliveries: int
    open_attempts: int
    """Delivery attempts started and never finished, nor marked interrupted: none may be
    left once every delivery is done (a cut attempt is marked when its delivery is claimed
    again)."""
    interrupted_attempts: int
    """Delivery attempts a dead process cut short, marked ``interrupted``."""
    call_attempts: dict[str, int]
    """run_id → attempts recorded for the http step."""
    failed_attempts: dict[str, set[int]]
    """event id → numbers of its delivery attempts logged as timed out (the receiver answered
    too late, or not at all)."""
    cut_attempts: dict[str, set[int]]
    """event id → numbers of its delivery attempts never finished by their sender (left
    open, or marked interrupted when the delivery was claimed again)."""


STATE_SQL = (
    "SELECT run_id, status FROM runs",
    "SELECT count(*) FROM deliveries WHERE status = 'pending'",
    "SELECT count(*) FROM delivery_attempts WHERE finished_at IS NULL AND error_class IS NULL",
    "SELECT run_id, attempts FROM run_steps WHERE step_id = 'call'",
    "SELECT d.event_id, a.number FROM delivery_attempts a JOIN deliveries d"
    " ON d.id = a.delivery_id WHERE a.error_class = 'timeout'",
    "SELECT d.event_id, a.number FROM delivery_attempts a JOIN deliveries d"
    " ON d.id = a.delivery_id WHERE a.finished_at IS NULL OR a.error_class = 'interrupted'",
    "SELECT count(*) FROM delivery_attempts WHERE error_class = 'interrupted'",
)


async def read_state(database_url: str) -> DbState:
    """Runs, pending deliveries, open attempts and the http step's attempts, from SQLite (read
    only) or PostgreSQL."""
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")

        def read() -> list[list[Any]]:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
            try:
                return [conn.execute(sql).fetchall() for sql in STATE_SQL]
            finally:
                conn.close()

        rows = await asyncio.to_thread(read)
    else:
        conn = await asyncpg.connect(database_url, timeout=10)
        try:
            rows = [[tuple(r) for r in await conn.fetch(sql)] for sql in STATE_SQL]
        finally:
            await conn.close()
    for i in (0, 3, 4, 5):  # their first column is an id, as the store keeps it (packed)
        rows[i] = [(unpack_id(bytes(r[0])), *r[1:]) for r in rows[i]]
    failed: dict[str, set[int]] = {}
    for event_id, number in rows[4]:
        failed.setdefault(event_id, set()).add(int(number))
    cut: dict[str, set[int]] = {}
    for event_id, number in rows[5]:
        cut.setdefault(event_id, set()).add(int(number))
    return DbState(
        dict(rows[0]),
        int(rows[1][0][0]),
        int(rows[2][0][0]),
        int(rows[6][0][0]),
        dict(rows[3]),
        failed,
        cut,
    )


# -- one experiment ---------------------------------------------------------------------------


def kill_times(seconds: float, kills: int, rng: random.Random, avoid: float | None) -> list[float]:
    """``kills`` moments spread over the middle 80 % of the load, one per slot at a random
    point of it, kept 2.5 s away from ``avoid`` (the PostgreSQL restart)."""
    slot = 0.8 * seconds / max(kills, 1)
    times = []
    for j in range(kills):
        t = 0.1 * seconds + slot * (j + rng.uniform(0.15, 0.85))
        if avoid is not None and abs(t - avoid) < 2.5:
            t = avoid + 2.5 if t >= avoid else avoid - 2.5
        times.append(t)
    return sorted(times)


@dataclass
class Experiment:
    """Everything one backend's experiment started, and what happened to it."""

    backend: str
    args: argparse.Namespace
    workdir: Path
    rng: random.Random
    t0: float = 0.0
    procs: list[Proc] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    pg: PrivatePostgres | None = None
    database_url: str = ""
    port: int = field(default_factory=free_port)
    restart_at: float | None = None
    sink: SinkProcess | None = None

    def clock(self) -> float:
        return time.monotonic() - self.t0

    def live_pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.process is not None and p.process.poll() is None]

    def add(self, role: str, command: str, port: int) -> Proc:
        proc = Proc(role, [FLOWHOOK, command], flowhook_env(self.database_url, port),
                    self.workdir / f"{role}.log")  # fmt: skip
        proc.start()
        self.procs.append(proc)
        if self.sink is not None:
            self.sink.publish(self.live_pids())
        return proc

    async def kill(self, proc: Proc, sink: SinkProcess) -> None:
        await sink.refresh()  # who made the calls so far, while its sockets are open
        at, pid = self.clock(), proc.pid
        await asyncio.to_thread(proc.kill9)
        proc.start()
        sink.publish(self.live_pids())
        self.faults.append(Fault("kill", round(at, 3), round(self.clock(), 3), pid, proc.role))

    async def restart_postgres(self) -> None:
        assert self.pg is not None
        at = self.clock()
        await asyncio.to_thread(self.pg.restart)
        self.faults.append(
            Fault("pg_restart", round(at, 3), round(self.clock(), 3), None, "postgresql")
        )

    async def chaos(self, sink: SinkProcess) -> None:
        """The kills (and the restart) at their moments."""
        seconds = self.args.seconds
        if self.backend == "postgresql":
            self.restart_at = max(10.0, seconds / 2) if seconds > 12 else seconds / 2
        moments: list[tuple[float, str]] = [
            (t, "kill") for t in kill_times(seconds, self.args.kills, self.rng, self.restart_at)
        ]
        if self.restart_at is not None:
            moments.append((self.restart_at, "restart"))
        for at, what in sorted(moments):
            await asyncio.sleep(max(0.0, at - self.clock()))
            if what == "restart":
                await self.restart_postgres()
            else:
                engines = [p for p in self.procs if p.role != "api"]
                await self.kill(self.rng.choice(engines), sink)

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()
        if self.pg is not None:
            self.pg.stop()

    def dropped_runs(self) -> set[str]:
        """Runs named in an "unexpected error in the engine" line: their write was dropped."""
        found: set[str] = set()
        for p in self.procs:
            if p.log.exists():
                found.update(DROPPED.findall(p.log.read_text(errors="replace")))
        return found

    def logged(self, text: str) -> int:
        return sum(
            p.log.read_text(errors="replace").count(text) for p in self.procs if p.log.exists()
        )


@contextlib.asynccontextmanager
async def stack(exp: Experiment) -> AsyncIterator[str]:
    """Start the database and the processes; yields the API's base URL."""
    port = exp.port
    try:
        if exp.backend == "sqlite":
            exp.database_url = f"sqlite:///{exp.workdir / 'chaos.db'}"
            exp.add("serve", "serve", port)
        else:
            exp.pg = await asyncio.to_thread(PrivatePostgres().start)
            admin = await asyncpg.connect(exp.pg.url())
            await admin.execute("CREATE DATABASE chaos")
            await admin.close()
            exp.database_url = exp.pg.url("chaos")
            await asyncio.to_thread(create_key, flowhook_env(exp.database_url, port))  # migrates
            exp.add("api", "api", port)
            exp.add("worker-1", "worker", port)
            exp.add("worker-2", "worker", port)
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        yield base
    finally:
        await asyncio.to_thread(exp.stop)


async def drain(exp: Experiment, accepted: set[str], seconds: float) -> DbState:
    """Wait (at most ``seconds``) until every accepted run completed and no delivery is
    pending; the database's last state."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            state = await read_state(exp.database_url)
        except (OSError, sqlite3.Error, asyncpg.PostgresError):
            await asyncio.sleep(1)
            continue
        done = {r for r, s in state.runs.items() if s == "completed"}
        if (accepted <= done and not state.pending_deliveries) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(1)


async def run_experiment(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"flowhook-chaos-{backend}-"))
    exp = Experiment(backend, args, workdir, random.Random(f"{args.seed}-{backend}"))
    try:
        async with SinkProcess(workdir) as sink:
            exp.sink = sink
            async with stack(exp) as base:
                return await soak(exp, sink, base)
    finally:
        if args.keep:
            print(f"  kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


async def soak(exp: Experiment, sink: SinkProcess, base: str) -> dict[str, Any]:
    """The load and the faults, the drain, and the report."""
    args = exp.args
    key = await asyncio.to_thread(create_key, flowhook_env(exp.database_url, exp.port))
    flow_id = await prepare(base, key, sink)
    before = await deadlocks(exp.pg.url()) if exp.pg else 0
    exp.t0 = time.monotonic()
    load = Load(base, key, flow_id, args.rate, args.seconds, args.seed, exp.clock,
                timeout=args.timeout, retry_until=args.seconds + args.retry_seconds)  # fmt: skip
    await asyncio.gather(load.run(), exp.chaos(sink))
    load_end = exp.clock()
    accepted = {r.run_id for r in load.requests if r.run_id}
    state = await drain(exp, accepted, args.drain_seconds)
    drained = exp.clock() - load_end
    after = await deadlocks(exp.pg.url()) if exp.pg else 0
    report = analyse(exp, load, await sink.state(exp.t0), state, args.inflight_window)
    report.update(
        deadlocks=after - before,
        deadlocks_logged=exp.pg.logged("deadlock detected") if exp.pg else 0,
        engine_errors_logged=exp.logged("unexpected error"),
        drain_seconds=round(drained, 1),
    )
    return report


RETRIED = Fault("retry_after_timeout", 0.0, 0.0, None, "receiver")
"""What explains a webhook sent again because its attempt was logged as timed out (the
receiver answered after FLOWHOOK_WEBHOOK_TIMEOUT): the documented retry."""


def _item(key: str, calls: list[Call], fault: Fault | None) -> dict[str, Any]:
    return {
        "id": key, "times": len(calls), "first_at": round(calls[0].at, 3),
        "second_at": round(calls[1].at, 3), "first_pid": calls[0].pid,
        "explained_by": asdict(fault) if fault else None,
    }  # fmt: skip


def repeated_effects(
    calls: dict[str, list[Call]], faults: list[Fault], window: float, dropped: set[str]
) -> list[dict[str, Any]]:
    """Every run whose target got more than one call, with the fault that explains it: a
    kill of the caller (or a PostgreSQL restart) within ``window`` s after the first call
    and before the second. A run the engine logged as dropped ("unexpected error in the
    engine") is never explained: its progress was lost by a defect, whatever else happened."""
    out = []
    for run_id, seen in sorted(calls.items()):
        if len(seen) > 1:
            fault = None if run_id in dropped else (
                explain(seen[0].at, seen[0].pid, seen[1].at, faults, window)
            )  # fmt: skip
            out.append(_item(run_id, seen, fault))
    return out


def duplicate_webhooks(
    hooks: dict[str, list[Call]], faults: list[Fault], state: DbState
) -> list[dict[str, Any]]:
    """Every event received more than once, with what explains it: its first attempt is
    logged as timed out (the documented retry), or it was never finished by its sender (the
    attempt log says so) and the sender was killed (or PostgreSQL restarted) between the
    first arrival and the second."""
    out = []
    for event_id, seen in sorted(hooks.items()):
        if len(seen) < 2:
            continue
        first = seen[0]
        fault: Fault | None = None
        if first.attempt in state.failed_attempts.get(event_id, set()):
            fault = RETRIED
        elif first.attempt in state.cut_attempts.get(event_id, set()):
            fault = explain(first.at, first.pid, seen[1].at, faults, seen[1].at - first.at)
        out.append(_item(event_id, seen, fault))
    return out


def analyse(
    exp: Experiment, load: Load, sink: SinkState, state: DbState, window: float
) -> dict[str, Any]:
    accepted = {r.run_id for r in load.requests if r.run_id}
    completed = {r for r, s in state.runs.items() if s == "completed"}
    repeats = repeated_effects(sink.calls, exp.faults, window, exp.dropped_runs())
    repeats_explained = sum(1 for r in repeats if r["explained_by"])
    dups = duplicate_webhooks(sink.hooks, exp.faults, state)
    dups_explained = sum(1 for d in dups if d["explained_by"])
    retried = sum(1 for d in dups if d["explained_by"] == asdict(RETRIED))
    other_5xx = sum(n for code, n in load.statuses.items()
                    if code.isdigit() and 500 <= int(code) < 600 and code != "503")  # fmt: skip
    end = float(exp.args.seconds)
    reference = exp.restart_at
    if reference is None and exp.faults:
        reference = exp.faults[0].at
    return {
        "backend": exp.backend,
        "seconds": exp.args.seconds,
        "rate": exp.args.rate,
        "requests": len(load.requests),
        "accepted": len(accepted),
        "unanswered": sum(1 for r in load.requests if r.run_id is None),
        "completed": len(accepted & completed),
        "lost": sorted(accepted - completed),
        "runs_by_status": dict(Counter(state.runs.values())),
        "runs_without_202": len(set(state.runs) - accepted),
        "repeated": repeats,
        "repeated_explained": repeats_explained,
        "repeated_unexplained": len(repeats) - repeats_explained,
        "repeat_attempts_recorded": dict(
            Counter(state.call_attempts.get(r["id"], 0) for r in repeats)
        ),
        "webhooks": sum(len(v) for v in sink.hooks.values()),
        "bad_signatures": sink.bad_signatures,
        "missing_webhooks": len((accepted & completed) - sink.completed_hooks),
        "deliveries_pending_at_end": state.pending_deliveries,
        "duplicate_webhooks": dups,
        "duplicate_webhooks_explained": dups_explained,
        "duplicate_webhooks_after_failed_attempt": retried,
        "duplicate_webhooks_unexplained": len(dups) - dups_explained,
        "open_delivery_attempts": state.open_attempts,
        "interrupted_delivery_attempts": state.interrupted_attempts,
        "statuses": dict(load.statuses),
        "other_5xx": other_5xx,
        "503": load.statuses.get("503", 0),
        "503_without_retry_after": load.no_retry_after,
        "generator_max_lag_s": round(load.max_lag, 3),
        "callers_unknown": sum(1 for c in sink.calls.values() for x in c if x.pid is None),
        "faults": [asdict(f) for f in exp.faults],
        "windows_after": "postgresql restart" if exp.restart_at is not None else "first kill",
        "windows": windows(load.requests, reference, end) if reference is not None else [],
        "end": end,
    }


# -- the report -------------------------------------------------------------------------------


def verdict(report: dict[str, Any]) -> list[str]:
    """What the CI test asserts, as the failures found (empty: it passed)."""
    problems = []
    if report["lost"]:
        problems.append(f"{len(report['lost'])} accepted runs never completed")
    if report["repeated_unexplained"]:
        problems.append(f"{report['repeated_unexplained']} repeated side effects without a fault")
    if report["deadlocks"] or report["deadlocks_logged"]:
        problems.append(f"{max(report['deadlocks'], report['deadlocks_logged'])} deadlocks")
    if report["other_5xx"]:
        problems.append(f"{report['other_5xx']} 5xx answers other than 503")
    if report["503_without_retry_after"]:
        problems.append(f"{report['503_without_retry_after']} 503 answers without Retry-After")
    if report["duplicate_webhooks_unexplained"]:
        problems.append(
            f"{report['duplicate_webhooks_unexplained']} duplicate webhooks without a fault"
        )
    if report["bad_signatures"]:
        problems.append(f"{report['bad_signatures']} webhooks with a bad signature")
    if report["open_delivery_attempts"] and not report["deliveries_pending_at_end"]:
        problems.append(
            f"{report['open_delivery_attempts']} delivery attempts left open (neither finished"
            " nor marked interrupted)"
        )
    if report["missing_webhooks"]:
        pending = report["deliveries_pending_at_end"]
        problems.append(
            f"{report['missing_webhooks']} completed runs without their webhook"
            + (f" ({pending} deliveries still pending when the drain ended)" if pending else "")
        )
    return problems


def print_report(report: dict[str, Any]) -> None:
    r = report
    faults = ", ".join(f"{f['kind']} {f.get('role', '')}@{f['at']:.1f}s" for f in r["faults"])
    rows = [
        ("requests (sent at the rate)", r["requests"]),
        ("accepted (202, distinct runs)", r["accepted"]),
        ("unanswered (gave up, or 4xx)", r["unanswered"]),
        ("completed", r["completed"]),
        ("lost (accepted, never completed)", len(r["lost"])),
        ("runs in the database without a 202", r["runs_without_202"]),
        ("repeated side effects: explained by a fault", r["repeated_explained"]),
        ("repeated side effects: WITHOUT a fault", r["repeated_unexplained"]),
        ("  http step attempts recorded for repeats", r["repeat_attempts_recorded"]),
        ("webhooks received / bad signatures", f"{r['webhooks']} / {r['bad_signatures']}"),
        ("completed runs without their webhook", r["missing_webhooks"]),
        ("deliveries still pending after the drain", r["deliveries_pending_at_end"]),
        ("duplicate webhooks: explained / WITHOUT a fault",
         f"{r['duplicate_webhooks_explained']} / {r['duplicate_webhooks_unexplained']}"),
        ("  of the explained: retries of an attempt logged failed",
         r["duplicate_webhooks_after_failed_attempt"]),
        ("delivery attempts left open / marked interrupted",
         f"{r['open_delivery_attempts']} / {r['interrupted_delivery_attempts']}"),
        ("deadlocks (pg_stat_database / log)", f"{r['deadlocks']} / {r['deadlocks_logged']}"),
        ("'unexpected error' lines logged", r["engine_errors_logged"]),
        ("5xx other than 503", r["other_5xx"]),
        ("503 (without Retry-After)", f"{r['503']} ({r['503_without_retry_after']})"),
        ("answers", r["statuses"]),
        ("drain after the load, s", r["drain_seconds"]),
        ("load generator's largest delay, s", r["generator_max_lag_s"]),
        ("target calls whose process is unknown", r["callers_unknown"]),
        ("faults", faults or "none"),
    ]  # fmt: skip
    print(f"\n== {r['backend']}: {r['seconds']} s at {r['rate']}/s ==")
    for label, value in rows:
        print(f"  {label:<50} {value}")
    if r["windows"]:
        print(f"  accepts around the {r['windows_after']} (s relative to it):")
        print(f"    {'window':>14}  {'accepted/s':>10}  {'median to 202, s':>16}")
        for w in r["windows"]:
            median = "-" if w["median_s"] is None else f"{w['median_s']:.3f}"
            span = f"[{w['from']:+.0f}, {w['to']:+.0f})"
            print(f"    {span:>14}  {w['accepted_per_s']:>10.1f}  {median:>16}")
    for kind in ("repeated", "duplicate_webhooks"):
        for item in r[kind]:
            if item["explained_by"] is None:
                print(f"  {kind} without a fault: {item['id']} ×{item['times']} "
                      f"at {item['first_at']:.2f}s and {item['second_at']:.2f}s")  # fmt: skip
    problems = verdict(r)
    print("  verdict: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=90, help="load duration per backend")
    parser.add_argument("--rate", type=float, default=200, help="requests per second")
    parser.add_argument("--kills", type=int, default=5, help="kill -9 per backend")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30, help="client timeout per attempt")
    parser.add_argument("--retry-seconds", type=float, default=60,
                        help="keep retrying a request this long after the load ends")  # fmt: skip
    parser.add_argument("--drain-seconds", type=float, default=180,
                        help="wait at most this long for the backlog after the load")  # fmt: skip
    parser.add_argument("--inflight-window", type=float, default=5.0,
                        help="a fault this soon after a step's call explains its repeat")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="also write the reports as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    args = parser.parse_args(argv)
    for backend in args.backends.split(","):
        if backend not in ("sqlite", "postgresql"):
            parser.error(f"unknown backend {backend!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve-sink"]:
        serve_sink(int(argv[1]), Path(argv[2]))
        return 0
    args = parse_args(argv)
    reports = []
    for backend in args.backends.split(","):
        print(f"{backend}: {args.seconds:g} s at {args.rate:g}/s, {args.kills} kills, "
              f"seed {args.seed} …", file=sys.stderr, flush=True)  # fmt: skip
        report = asyncio.run(run_experiment(backend, args))
        report["problems"] = verdict(report)
        print_report(report)
        reports.append(report)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2))
    return 1 if any(r["problems"] for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
