"""What every benchmark needs: a fresh database on either backend, a real `flowhook serve`
process, a signed-webhook receiver, an HTTP client, and wrk.

Each piece binds 127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

BIN = Path(sys.executable).parent
FLOWHOOK = str(BIN / "flowhook")
ROOT = Path(__file__).resolve().parent.parent

FLOW: dict[str, Any] = {
    "name": "bench",
    "steps": [
        {"id": "a", "type": "transform", "output": {"x": "{{ payload.n + 1 }}"}},
        {"id": "b", "type": "transform", "output": {"y": "{{ steps.a.output.x * 2 }}"}},
        {"id": "c", "type": "transform", "output": {"z": "{{ steps.b.output.y }}"}},
    ],
    "output": {"z": "{{ steps.c.output.z }}"},
}
"""Three transform steps: the end-to-end and idle benchmarks run this flow."""


BENCH_SECRET_KEY = "YmVuY2gta2V5LW5vdC1mb3ItdXNlLWVsc2V3aGVyZSE="
"""FLOWHOOK_SECRET_KEY for benchmark rounds on PostgreSQL (SQLite ones use a key file)."""


def secret_key_for(database_url: str) -> str | None:
    return BENCH_SECRET_KEY if database_url.startswith("postgres") else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


# -- databases -------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_database(backend: str, workdir: Path, postgres_url: str) -> Iterator[str]:
    """A new empty database for one round: a SQLite file, or a PostgreSQL database created
    on ``postgres_url``'s server and dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / 'bench.db'}"
        return
    name = f"flowhook_bench_{uuid.uuid4().hex[:10]}"
    admin = postgres_url.replace("postgresql+asyncpg://", "postgresql://")

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{admin.rpartition('/')[0]}/{name}"
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


# -- a private PostgreSQL cluster ------------------------------------------------------------


def postgres_bin() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def private_postgres_missing() -> str | None:
    """Why a PrivatePostgres cannot be made here, or None when it can."""
    if postgres_bin() is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        return "needs PostgreSQL's binaries in /usr/lib/postgresql/*/bin (and runuser as root)"
    return None


class PrivatePostgres:
    """A cluster of our own in a temporary directory, on a free port of 127.0.0.1; run as
    user postgres when we are root (initdb refuses root). Never the shared one: the chaos
    soak and tests/e2e/test_postgres_restart.py restart it under load.

    ``with PrivatePostgres() as pg:`` starts it and removes it afterwards."""

    def __init__(self) -> None:
        binary = postgres_bin()
        if binary is None:
            raise SystemExit("no PostgreSQL binaries in /usr/lib/postgresql/*/bin")
        self.bin = binary
        self.dir = Path(tempfile.mkdtemp(prefix="flowhook-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.log = self.dir / "postgres.log"

    def __enter__(self) -> PrivatePostgres:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _run(self, *args: str, timeout: float = 120) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*prefix, *args], check=True, capture_output=True, timeout=timeout, cwd=self.dir
        )

    def _pg_ctl(self, *args: str) -> None:
        """``pg_ctl`` on our data directory (the server's output to the log: a pipe would
        stay open)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-w", "-t", "60", *args)  # fmt: skip

    def start(self) -> PrivatePostgres:
        """initdb, then start the server."""
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "-A", "trust", "-E", "UTF8", "--no-sync")  # fmt: skip
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server on the existing data directory (after ``halt``)."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c max_connections=200"
        )
        self._pg_ctl("-o", options, "start")

    def halt(self) -> None:
        """``pg_ctl stop -m fast``, keeping the data directory for ``resume``."""
        self._pg_ctl("-m", "fast", "stop")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``."""
        self._pg_ctl("-m", "fast", "restart")

    def stop(self) -> None:
        """Stop the server if it runs and remove the cluster."""
        with contextlib.suppress(subprocess.SubprocessError):
            self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def logged(self, text: str) -> int:
        try:
            return self.log.read_text(errors="replace").count(text)
        except OSError:
            return 0


# -- the server ------------------------------------------------------------------------------


@dataclass
class Server:
    """A `flowhook serve` (or another command) on a fresh port, with a sandbox key."""

    database_url: str
    workdir: Path
    command: list[str] = field(default_factory=lambda: [FLOWHOOK, "serve"])
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    key: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        return {
            # far above any backlog a run makes: counted as ever, never reached (set it in the
            # environment to measure another cap, or 0 for none)
            "FLOWHOOK_MAX_ACTIVE_RUNS_PER_WORKSPACE": "100000000",
            **os.environ,
            **({"FLOWHOOK_SECRET_KEY": key} if (key := secret_key_for(self.database_url)) else {}),
            "FLOWHOOK_DATABASE_URL": self.database_url,
            "FLOWHOOK_PORT": str(self.port),
            "FLOWHOOK_HOST": "127.0.0.1",
            "FLOWHOOK_LOG_LEVEL": "warning",
            "FLOWHOOK_RATE_LIMIT": "0",  # the per-key limit (1,000/s) would cap the load
            "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",  # the receiver is on 127.0.0.1
            **self.env,
        }

    def start(self) -> Server:
        created = subprocess.run(
            [FLOWHOOK, "keys", "create", "--mode", "test", "--workspace", "bench", "--json"],
            env=self.environment(), capture_output=True, text=True, check=True,
        )  # fmt: skip
        self.key = json.loads(created.stdout)["key"]
        self.process = subprocess.Popen(
            self.command, env=self.environment(), cwd=self.workdir, stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{' '.join(self.command)} exited with {self.process.returncode}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("the server did not start within 60 s")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@contextlib.contextmanager
def running_server(
    backend: str, postgres_url: str, command: list[str] | None = None, **env: str
) -> Iterator[Server]:
    workdir = Path(tempfile.mkdtemp(prefix="flowhook-bench-"))
    try:
        with fresh_database(backend, workdir, postgres_url) as url:
            server = Server(url, workdir, env=env)
            if command is not None:
                server.command = command
            server.start()
            try:
                wait_healthy(server)
                yield server
            finally:
                server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def wait_healthy(server: Server) -> None:
    async def ping() -> None:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                try:
                    async with http.get(f"{server.base}/healthz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("the server never became healthy")

    asyncio.run(ping())


# -- the receiver ----------------------------------------------------------------------------


class Receiver:
    """Receives webhooks on 127.0.0.1, checks every signature, and records when each run's
    ``flow.completed`` (or any event, keyed by event id) arrived."""

    def __init__(self) -> None:
        self.port = free_port()
        self.secrets: dict[str, bytes] = {}
        """Signing secret per path (one endpoint each)."""
        self.count = 0
        self.bad_signatures = 0
        self.arrived: dict[str, float] = {}
        """run_id (or event id when there is none) → perf_counter() at arrival."""
        self.first = 0.0
        self.last = 0.0
        self._waiters: dict[str, asyncio.Future[float]] = {}
        self._target = 0
        self._reached = asyncio.Event()
        self._runner: web.AppRunner | None = None

    def url(self, n: int = 0) -> str:
        return f"http://127.0.0.1:{self.port}/hook/{n}"

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook/{n}", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024).start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _hook(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        body = await request.read()
        secret = self.secrets.get(request.path, b"")
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get("X-Service-Signature", "")):
            self.bad_signatures += 1
            return web.Response(status=401)
        envelope = json.loads(body)
        key = envelope.get("run_id") or request.headers.get("X-Service-Event-Id", "")
        self.arrived.setdefault(key, now)
        self.count += 1
        self.first = self.first or now
        self.last = now
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)
        if self._target and self.count >= self._target:
            self._reached.set()
        return web.Response(text="ok")

    def expect(self, key: str) -> asyncio.Future[float]:
        """A future set when the webhook for ``key`` arrives (at once if it already did)."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if key in self.arrived:
            future.set_result(self.arrived[key])
        else:
            self._waiters[key] = future
        return future

    async def wait_for_count(self, n: int, timeout: float) -> None:
        self._target = n
        if self.count >= n:
            return
        await asyncio.wait_for(self._reached.wait(), timeout)

    def reset(self) -> None:
        self.count = self.bad_signatures = 0
        self.arrived.clear()
        self.first = self.last = 0.0
        self._target = 0
        self._reached.clear()


@contextlib.asynccontextmanager
async def direct_store(database_url: str) -> AsyncIterator[tuple[Any, Any, Any]]:
    """The store opened directly (migrated), with a new sandbox key: ``(db, services, who)``,
    for a benchmark to set up its rows before a server starts. The store closes on exit."""
    from flowhook.clock import SystemClock
    from flowhook.config import Settings
    from flowhook.service import Services
    from flowhook.store.db import Database
    from flowhook.store.migrate import migrate
    from flowhook.store.models import Mode
    from flowhook.store.wakeup import Wakeup

    db = Database(database_url, secret_key=secret_key_for(database_url))
    try:
        await migrate(db)
        settings = Settings(database_url=database_url, allow_private_targets=True)
        services = Services(db, SystemClock(), settings, Wakeup())
        created = await services.keys.create(Mode.TEST, "bench")
        who = await services.keys.authenticate(f"Bearer {created.key}")
        yield db, services, who
    finally:
        await db.dispose()


async def queue_events(db: Any, who: Any, event: str, count: int) -> None:
    """Insert ``count`` events of type ``event`` (a delivery each per subscribed endpoint),
    a thousand per transaction."""
    from flowhook.clock import SystemClock
    from flowhook.events import make_event
    from flowhook.store import events as events_store

    clock = SystemClock()
    for start in range(0, count, 1000):
        batch = [
            make_event(
                event, workspace_id=who.workspace_id, mode=who.mode, flow_id="wf_bench",
                run_id=f"run_{event}_{i}", payload={"i": i}, now=clock.now(),
            )
            for i in range(start, min(start + 1000, count))
        ]  # fmt: skip
        async with db.transaction() as conn:
            await events_store.insert_events(conn, batch)


KEEPALIVE = 4.0  # seconds an idle client connection is kept: below the server's 5 s


@contextlib.asynccontextmanager
async def client(server: Server, connections: int = 128) -> AsyncIterator[aiohttp.ClientSession]:
    # Idle connections are dropped before the server would drop them (uvicorn closes a
    # keep-alive connection after 5 s idle; aiohttp keeps one 15 s by default): a request sent
    # on a connection the server is closing at that moment is reset. That was the suite's
    # "ClientOSError: Can not write request body" (bench/ka_probe.py shows it).
    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=KEEPALIVE)
    async with aiohttp.ClientSession(
        base_url=server.base, headers=server.auth, connector=connector
    ) as http:
        yield http


async def create_flow(http: aiohttp.ClientSession) -> str:
    async with http.post("/api/v1/flows", json=FLOW) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["flow_id"])


async def subscribe(
    http: aiohttp.ClientSession, receiver: Receiver, events: list[str], n: int = 0
) -> None:
    """Register endpoint ``n`` of the receiver for ``events``."""
    url = receiver.url(n)
    async with http.post("/api/v1/webhooks/endpoints", json={"url": url, "events": events}) as r:
        assert r.status == 201, await r.text()
        receiver.secrets[f"/hook/{n}"] = (await r.json())["secret"].encode()


# -- wrk -------------------------------------------------------------------------------------


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)$", text)
    if not m:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def wrk_post(
    url: str, body: bytes, headers: dict[str, str], connections: int, duration: float
) -> dict[str, float]:
    """POST ``body`` to ``url`` with wrk: requests/s, p50 and p99 in ms, non-2xx count."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write('wrk.method = "POST"\n')
        lua.write(f"wrk.body = {json.dumps(body.decode())}\n")
        for name, value in {"Content-Type": "application/json", **headers}.items():
            lua.write(f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}\n")
    try:
        threads = min(2, connections)
        out = subprocess.run(
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s",
             "--latency", "-s", lua.name, url],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        os.unlink(lua.name)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s*50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s*99%\s+(\S+)", out, re.M)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    if rps is None or p50 is None or p99 is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    if errors:
        print(f"    wrk: {errors.group(0)}", file=sys.stderr)
    return {
        "rps": float(rps.group(1)),
        "p50": _ms(p50.group(1)),
        "p99": _ms(p99.group(1)),
        "non2xx": float(bad.group(1)) if bad else 0.0,
    }
