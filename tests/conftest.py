"""Shared fixtures. ``backend`` runs a test on SQLite and on real PostgreSQL.

PostgreSQL tests read ``FLOWHOOK_TEST_DATABASE_URL``. Without it they are skipped locally;
under CI (``CI=true``) a missing database is a failure, never a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI

from flowhook.app import create_app
from flowhook.clock import Clock, SystemClock
from flowhook.config import Settings
from flowhook.service import Principal, Services
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.tables import metadata
from flowhook.store.wakeup import Wakeup
from tests.support import TEST_SECRET_KEY, secret_key_for

PG_URL = os.environ.get("FLOWHOOK_TEST_DATABASE_URL")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextmanager
def new_pg_database() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped afterwards (skipped without
    ``FLOWHOOK_TEST_DATABASE_URL``, and failed in CI, which must run these tests)."""
    if not PG_URL:
        if IN_CI:
            pytest.fail("FLOWHOOK_TEST_DATABASE_URL is not set; CI must run the PostgreSQL tests")
        pytest.skip("FLOWHOOK_TEST_DATABASE_URL is not set")
    name = f"flowhook_test_{uuid.uuid4().hex[:10]}"
    dsn = PG_URL.replace("postgresql+asyncpg://", "postgresql://")

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_URL.rpartition('/')[0]}/{name}"
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session."""
    with new_pg_database() as url:

        async def up() -> None:
            db = Database(url, secret_key=TEST_SECRET_KEY)
            await migrate(db)
            await db.dispose()

        asyncio.run(up())
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, copied for each test (faster than migrating each time)."""
    path = tmp_path_factory.mktemp("template") / "flowhook.db"

    async def up() -> None:
        db = Database(f"sqlite:///{path}")
        await migrate(db)
        await db.dispose()

    asyncio.run(up())
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path
) -> Iterator[str]:
    """A migrated, empty database on each backend."""
    if request.param == "sqlite":
        target = tmp_path / "flowhook.db"
        shutil.copy(sqlite_template, target)
        yield f"sqlite:///{target}"
        return
    url: str = request.getfixturevalue("pg_url")
    _truncate_all(url)
    yield url


def _truncate_all(url: str) -> None:
    tables = ", ".join(t.name for t in metadata.sorted_tables)

    async def go() -> None:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.execute(f"TRUNCATE {tables} CASCADE")
        finally:
            await conn.close()

    asyncio.run(go())


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        poll_interval=0.5,
        sqlite_synchronous="NORMAL",
        allow_private_targets=True,
        plugins="tests.plugins",
        webhook_retry_schedule="0.1,0.2,0.3",
        webhook_timeout=1.0,
        secret_key=secret_key_for(database_url),
    )


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    database = Database(
        settings.database_url, sqlite_synchronous="NORMAL", secret_key=settings.secret_key
    )
    yield database
    await database.dispose()


@pytest.fixture
def services(db: Database, settings: Settings) -> Services:
    return Services(db, SystemClock(), settings, Wakeup())


class Api:
    """An httpx client on the app, plus keys for two workspaces in both modes."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient, keys: dict[str, str]) -> None:
        self.app = app
        self.client = client
        self.keys = keys

    def auth(self, who: str = "test") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    async def post(
        self, path: str, json: Any = None, who: str = "test", **kw: Any
    ) -> httpx.Response:
        headers = {**self.auth(who), **kw.pop("headers", {})}
        return await self.client.post(path, json=json, headers=headers, **kw)

    async def get(self, path: str, who: str = "test", **kw: Any) -> httpx.Response:
        return await self.client.get(path, headers=self.auth(who), **kw)

    async def create_flow(self, definition: dict[str, Any], who: str = "test") -> str:
        r = await self.post("/api/v1/flows", definition, who=who)
        assert r.status_code == 201, r.text
        return str(r.json()["flow_id"])

    async def execute(
        self, flow_id: str, payload: dict[str, Any] | None = None, who: str = "test"
    ) -> str:
        r = await self.post(
            "/api/v1/flows/execute", {"flow_id": flow_id, "payload": payload or {}}, who=who
        )
        assert r.status_code == 202, r.text
        return str(r.json()["run_id"])

    async def wait(self, run_id: str, who: str = "test", timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                r = await self.get(f"/api/v1/flows/runs/{run_id}", who=who)
                assert r.status_code == 200, r.text
                body: dict[str, Any] = r.json()
                if body["status"] in ("completed", "failed", "cancelled"):
                    return body
                await asyncio.sleep(0.02)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    async with open_api(settings) as opened:
        yield opened


@contextlib.asynccontextmanager
async def open_api(settings: Settings, clock: Clock | None = None) -> AsyncIterator[Api]:
    """The app with its worker in-process (on ``clock``, the system's by default) and an
    :class:`Api` client with keys for two workspaces in both modes."""
    app = create_app(settings, clock=clock)
    async with app.router.lifespan_context(app):
        services: Services = app.state.services
        keys = {
            "test": (await services.keys.create(Mode.TEST, "acme")).key,
            "live": (await services.keys.create(Mode.LIVE, "acme")).key,
            "other": (await services.keys.create(Mode.TEST, "globex")).key,
        }
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://flowhook.test"
        ) as client:
            yield Api(app, client, keys)


def principal_for(services: Services, key: str) -> Any:
    return services.keys.authenticate(f"Bearer {key}")


class Receiver:
    """A real HTTP server on 127.0.0.1 that answers from a script and records requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[tuple[int, Any]] = []
        self.default: tuple[int, Any] = (200, {"ok": True})
        self.delay = 0.0
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
                "at": time.monotonic(),
            }
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        status, payload = self.script.pop(0) if self.script else self.default
        if 300 <= status < 400:
            return web.Response(status=status, headers={"Location": str(payload)})
        return web.json_response(payload, status=status)

    def of(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["headers"].get("X-Service-Event") == event]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await rec.handle(request)  # looked up per request, so a test may swap it

    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rec.url = f"http://127.0.0.1:{port}"
    yield rec
    await runner.cleanup()


__all__ = ["Api", "Principal", "Receiver"]
