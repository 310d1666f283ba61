"""`flowhook db copy` moves a SQLite installation to PostgreSQL (issue 54), as a user runs it.

A SQLite installation is built by the real app (in this process): runs completed, failed,
waiting for a signal, for an approval and for a worker's task, and one queued; deliveries
succeeded, failed and pending; an endpoint and a hook with their sealed secrets, a schedule,
a signal, a worker seen. The real CLI copies it into a new PostgreSQL database; the real
server then starts there with the FLOWHOOK_SECRET_KEY the command named, and takes over:
the same key works, a run reads the same, the queued run and the pending delivery go out
signed with the endpoint's secret, the waiting runs resume. The refusals: a non-empty
target, a source a running server holds (and a server, a file a copy reads), a copy that
fails partway and one interrupted with Ctrl-C (the target's transaction rolled back, the
source unchanged, the message says to run it again)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import func, select

from flowhook.app import create_app
from flowhook.config import Settings
from flowhook.store.db import Database
from flowhook.store.holding import holding
from flowhook.store.migrate import migrate
from flowhook.store.models import Mode
from flowhook.store.tables import metadata
from tests.conftest import Receiver, new_pg_database
from tests.support import FLOWHOOK, TEST_SECRET_KEY, serve

pytestmark = pytest.mark.e2e

API = "/api/v1"
ENDED = ("completed", "failed", "cancelled")
DEAD = "http://127.0.0.1:9/gone"  # nothing listens: every attempt fails at once


def _settings(url: str) -> Settings:
    return Settings(
        database_url=url,
        poll_interval=0.5,
        sqlite_synchronous="NORMAL",
        allow_private_targets=True,
        webhook_retry_schedule="0.1",
        webhook_max_attempts=1,
        webhook_timeout=2.0,
    )


@contextlib.asynccontextmanager
async def _app(url: str, key: str | None, *, worker: bool) -> AsyncIterator[httpx.AsyncClient]:
    """The real app on ``url`` in this process (with or without its engine), and a client
    with ``key`` (a new live-mode key of workspace acme when None, in ``client.headers``)."""
    app = create_app(_settings(url), run_worker=worker)
    async with app.router.lifespan_context(app):
        key = key or (await app.state.services.keys.create(Mode.TEST, "acme")).key
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://flowhook.test",
            headers={"Authorization": f"Bearer {key}"},
        ) as client:
            yield client


async def _made(client: httpx.AsyncClient, path: str, body: Any) -> dict[str, Any]:
    r = await client.post(API + path, json=body)
    assert r.status_code in (200, 201, 202), r.text
    found: dict[str, Any] = r.json()
    return found


async def _until(client: httpx.AsyncClient, path: str, done: Any, timeout: float = 20) -> Any:
    """GET ``path`` until ``done(body)`` holds (the state it waits for has been reached)."""
    async with asyncio.timeout(timeout):
        while True:
            r = await client.get(API + path)
            assert r.status_code == 200, r.text
            if done(r.json()):
                return r.json()
            await asyncio.sleep(0.05)


def _step_waits(run: dict[str, Any]) -> bool:
    return any(s["status"] == "waiting" for s in run.get("steps", []))


FLOWS: dict[str, dict[str, Any]] = {
    "done": {"id": "t", "type": "transform", "output": {"n": "{{ payload.n }}"}},
    "fails": {"id": "x", "type": "fail", "message": "nope"},
    "waits": {"id": "w", "type": "wait", "signal": "go"},
    "approves": {"id": "ok", "type": "approval", "message": "Ship?"},
    "tasks": {"id": "h", "type": "task", "task": "hold", "input": 7},
}
"""One step each: a run of each ends completed, failed, or waits (a signal, an approval, a
worker's task)."""

HELD_ROWS = (
    "runs", "run_steps", "events", "deliveries", "delivery_attempts", "signals", "waits",
    "approvals", "tasks", "workers", "schedules", "inbound_hooks", "webhook_endpoints",
    "endpoint_events", "api_keys", "flows", "flow_versions",
)  # fmt: skip
"""Tables the built installation must hold rows of (what the copy is asked to carry)."""


async def _build(path: Path, receiver: Receiver) -> dict[str, Any]:
    """A SQLite installation holding every kind of row; what the checks need of it."""
    url = f"sqlite:///{path}"
    got: dict[str, Any] = {}
    async with _app(url, None, worker=True) as c:
        got["key"] = c.headers["Authorization"].removeprefix("Bearer ")
        subscribed = {"url": f"{receiver.url}/a", "events": ["flow.completed"]}
        endpoint = await _made(c, "/webhooks/endpoints", subscribed)
        got["endpoint"], got["secret"] = endpoint["id"], endpoint["secret"]
        await _made(c, "/webhooks/endpoints", {"url": DEAD, "events": ["flow.failed"]})
        flows, ran = {}, {}
        for name, step in FLOWS.items():
            flows[name] = (await _made(c, "/flows", {"name": name, "steps": [step]}))["flow_id"]
            execute = {"flow_id": flows[name], "payload": {"n": 1}}
            ran[name] = (await _made(c, "/flows/execute", execute))["run_id"]
        got["runs"] = ran
        for name in ("done", "fails"):
            await _until(c, f"/flows/runs/{ran[name]}", lambda r: r["status"] in ENDED)
        for name in ("waits", "approves", "tasks"):
            await _until(c, f"/flows/runs/{ran[name]}", _step_waits)
        for status in ("succeeded", "failed"):
            await _until(c, f"/webhooks/deliveries?status={status}", lambda b: b["data"])
        await _made(c, "/signals", {"name": "unrelated", "data": {"k": 1}})
        await _made(
            c, "/schedules", {"flow_id": flows["done"], "cron": "0 0 1 1 *", "payload": {"n": 2}}
        )
        hook = await _made(c, "/hooks", {"flow_id": flows["done"], "verify": {"type": "hmac"}})
        got["hook"], got["hook_secret"] = hook["id"], hook["verify"]["secret"]
        claimed = await _made(
            c, "/tasks/claim", {"worker_id": "w-1", "tasks": ["other"], "wait_seconds": 0}
        )
        assert claimed["tasks"] == []
        got["completed"] = (await c.get(f"{API}/flows/runs/{ran['done']}")).json()
        got["failed"] = (await c.get(f"{API}/flows/runs/{ran['fails']}")).json()
    async with _app(url, got["key"], worker=False) as c:  # nothing runs: these stay queued
        execute = {"flow_id": flows["done"], "payload": {"n": 3}}
        got["queued"] = (await _made(c, "/flows/execute", execute))["run_id"]
        await _made(c, f"/webhooks/endpoints/{got['endpoint']}/test", {})
        pending = (await c.get(f"{API}/webhooks/deliveries?status=pending")).json()["data"]
        assert pending, "a pending delivery"
    return got


async def _counts(url: str, secret_key: str | None = None) -> dict[str, int]:
    db = Database(url, secret_key=secret_key)
    try:
        async with db.read() as conn:
            return {
                t.name: int(await conn.scalar(select(func.count()).select_from(t)) or 0)
                for t in metadata.sorted_tables
            }
    finally:
        await db.dispose()


async def _rows(url: str, secret_key: str | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows in primary-key order, as the store reads them (ids, times, JSON
    made Python values by the column types): equal on both backends for the same data."""
    db = Database(url, secret_key=secret_key)
    try:
        async with db.read() as conn:
            return {
                t.name: [
                    tuple(row)
                    for row in await conn.execute(select(t).order_by(*t.primary_key.columns))
                ]
                for t in metadata.sorted_tables
            }
    finally:
        await db.dispose()


def _copy(source: Path | str, target: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "FLOWHOOK_SECRET_KEY"}
    return subprocess.run(
        [FLOWHOOK, "db", "copy", "--from", str(source), "--to", target],
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _signed(request: dict[str, Any], secret: str) -> bool:
    expected = hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, request["headers"].get("X-Service-Signature", ""))


@pytest.fixture
def pg_target() -> Iterator[str]:
    with new_pg_database() as url:
        yield url


@pytest.mark.postgres
@pytest.mark.timeout(240)
async def test_a_sqlite_installation_moves_to_postgresql_and_goes_on(
    tmp_path: Path, receiver: Receiver, pg_target: str
) -> None:
    source = tmp_path / "flowhook.db"
    got = await _build(source, receiver)
    before = await _counts(f"sqlite:///{source}")
    assert all(before[t] for t in HELD_ROWS), before
    rows = await _rows(f"sqlite:///{source}")

    done = await asyncio.to_thread(_copy, source, pg_target)
    assert done.returncode == 0, done.stderr
    key_file = tmp_path / "flowhook.db.key"
    assert f"FLOWHOOK_SECRET_KEY=$(cat {key_file})" in done.stdout
    assert "each table's row count matches the source's" in done.stdout
    assert "runs" in done.stderr  # progress, a line per table (not a terminal here)
    key = key_file.read_text().strip()
    assert await _counts(pg_target, key) == before
    copied = await _rows(pg_target, key)
    for table in metadata.sorted_tables:  # every value, as the store reads it
        assert copied[table.name] == rows[table.name], table.name
    assert await _rows(f"sqlite:///{source}") == rows  # the source is only read

    with serve(
        tmp_path,
        pg_target,
        FLOWHOOK_SECRET_KEY=key,
        FLOWHOOK_ALLOW_PRIVATE_TARGETS="1",
        FLOWHOOK_LOG_LEVEL="warning",
    ) as server:
        auth = {"Authorization": f"Bearer {got['key']}"}
        async with httpx.AsyncClient(base_url=server.base, headers=auth, timeout=30) as c:
            runs = got["runs"]
            # the same key, the same records
            assert (await c.get(f"{API}/flows/runs/{runs['done']}")).json() == got["completed"]
            assert (await c.get(f"{API}/flows/runs/{runs['fails']}")).json() == got["failed"]
            # the queued run runs; its webhook and the pending test event are signed with the
            # endpoint's secret as the SQLite installation made it
            queued = await _until(
                c, f"/flows/runs/{got['queued']}?wait=5", lambda r: r["status"] == "completed"
            )
            assert queued["steps"][0]["output"] == {"n": 3}
            async with asyncio.timeout(20):
                while not (receiver.of("flow.completed")[1:] and receiver.of("webhook.test")):
                    await asyncio.sleep(0.05)
            sent = [*receiver.of("flow.completed")[1:], *receiver.of("webhook.test")]
            assert all(_signed(r, got["secret"]) for r in sent)
            assert got["queued"].encode() in receiver.of("flow.completed")[1]["body"]
            # the waiting runs resume: a signal, an approval, a worker's task
            await _made(c, f"/flows/runs/{runs['waits']}/signal", {"name": "go"})
            await _made(c, f"/flows/runs/{runs['approves']}/steps/ok/approve", {})
            claim = {"worker_id": "w-2", "tasks": ["hold"], "wait_seconds": 10}
            task = (await _made(c, "/tasks/claim", claim))["tasks"][0]
            assert task["input"] == 7
            await _made(
                c,
                f"/tasks/{task['task_id']}/complete",
                {"attempt": task["attempt"], "output": {"held": True}},
            )
            for name in ("waits", "approves", "tasks"):
                run = await _until(
                    c, f"/flows/runs/{runs[name]}?wait=5", lambda r: r["status"] == "completed"
                )
                assert run["status"] == "completed"
            # the hook's sealed secret still verifies arrivals
            hook = (await c.get(f"{API}/hooks/{got['hook']}")).json()
            body = b'{"n": 4}'
            signature = hmac.new(got["hook_secret"].encode(), body, hashlib.sha256).hexdigest()
            r = await c.post(
                hook["url"],
                content=body,
                headers={"Content-Type": "application/json", "X-Signature": signature},
            )
            assert r.status_code == 202, r.text


def _sqlite_rows(path: Path) -> dict[str, int]:
    return asyncio.run(_counts(f"sqlite:///{path}"))


@pytest.fixture
def small_source(tmp_path: Path) -> Path:
    """A SQLite installation with a workspace, a key, a flow and a completed run."""
    path = tmp_path / "flowhook.db"

    async def build() -> None:
        async with _app(f"sqlite:///{path}", None, worker=True) as c:
            flow = await _made(c, "/flows", {"name": "done", "steps": [FLOWS["done"]]})
            execute = {"flow_id": flow["flow_id"], "payload": {"n": 1}}
            run = await _made(c, "/flows/execute", execute)
            ended = await _until(c, f"/flows/runs/{run['run_id']}", lambda r: r["status"] in ENDED)
            assert ended["status"] == "completed", ended

    asyncio.run(build())
    return path


@pytest.mark.postgres
def test_a_target_that_is_not_empty_is_refused_naming_a_table(
    small_source: Path, pg_target: str
) -> None:
    assert _copy(small_source, pg_target).returncode == 0
    again = _copy(small_source, pg_target)
    assert again.returncode == 1
    said = " ".join(again.stderr.split())
    assert "the target database is not empty: table" in said and "has rows" in said


@pytest.mark.postgres
def test_a_source_a_running_server_holds_is_refused(small_source: Path, pg_target: str) -> None:
    url = f"sqlite:///{small_source}"
    with serve(small_source.parent, url, FLOWHOOK_LOG_LEVEL="warning"):
        held = _copy(small_source, pg_target)
    assert held.returncode == 1
    said = " ".join(held.stderr.split())
    assert "a running flowhook server holds the source" in said and "stop" in said
    assert _copy(small_source, pg_target).returncode == 0  # the server gone, it goes through


async def _prepare(url: str, sql: str) -> None:
    """Migrate the target, then run ``sql`` on it (what makes it fail or stall partway)."""
    db = Database(url, secret_key=TEST_SECRET_KEY)
    await migrate(db)
    await db.dispose()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.mark.postgres
def test_a_copy_that_fails_partway_leaves_the_target_empty_and_says_run_it_again(
    small_source: Path, pg_target: str
) -> None:
    """The target refuses the runs' rows partway (a trigger raises, after the tables before
    it were written): nothing is kept, the source is as it was, and the same command run
    again, once the cause is gone, copies everything."""

    asyncio.run(
        _prepare(
            pg_target,
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'disk full (a test)'; END $$;"
            "CREATE TRIGGER refuse BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION refuse()",
        )
    )
    before = _sqlite_rows(small_source)
    failed = _copy(small_source, pg_target)
    assert failed.returncode == 1
    said = " ".join(failed.stderr.split())
    assert "the copy stopped at table runs" in said and "disk full (a test)" in said
    assert "the source is untouched" in said and "run the same command again" in said
    assert not any(asyncio.run(_counts(pg_target, TEST_SECRET_KEY)).values())
    assert _sqlite_rows(small_source) == before
    asyncio.run(_prepare(pg_target, "DROP TRIGGER refuse ON runs"))
    assert _copy(small_source, pg_target).returncode == 0
    assert asyncio.run(_counts(pg_target, TEST_SECRET_KEY)) == before


@pytest.mark.postgres
def test_ctrl_c_stops_the_copy_with_nothing_kept_and_says_run_it_again(
    small_source: Path, pg_target: str
) -> None:
    """SIGINT while a table is being written (the target stalls on the runs' rows until
    then): exit 1, "interrupted", no row kept in the target, the source as it was."""
    asyncio.run(
        _prepare(
            pg_target,
            "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$;"
            "CREATE TRIGGER stall BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION stall()",
        )
    )
    before = _sqlite_rows(small_source)
    environment = {k: v for k, v in os.environ.items() if k != "FLOWHOOK_SECRET_KEY"}
    proc = subprocess.Popen(
        [FLOWHOOK, "db", "copy", "--from", str(small_source), "--to", pg_target],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = ""
        while not said.startswith("run_trees"):  # the table before runs is done
            said = proc.stderr.readline() if proc.stderr else ""
            assert said or proc.poll() is None, "the copy ended before it reached runs"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    said = " ".join(err.split())
    assert "interrupted:" in said and "run the same command again" in said
    assert not any(asyncio.run(_counts(pg_target, TEST_SECRET_KEY)).values())
    assert _sqlite_rows(small_source) == before


@pytest.mark.postgres
def test_a_postgresql_installation_copies_too_given_its_key(
    small_source: Path, pg_target: str
) -> None:
    """``--from`` a PostgreSQL URL: it needs FLOWHOOK_SECRET_KEY (as its servers have it) and
    no other session on the source; then every row arrives as it was."""
    assert _copy(small_source, pg_target).returncode == 0
    key = (small_source.parent / "flowhook.db.key").read_text().strip()
    rows = asyncio.run(_rows(f"sqlite:///{small_source}"))

    async def copy_while_another_session_is_connected(target: str) -> str:
        other = await asyncpg.connect(pg_target)
        try:
            held = await asyncio.to_thread(_copy, pg_target, target, FLOWHOOK_SECRET_KEY=key)
        finally:
            await other.close()
        assert held.returncode == 1
        return " ".join(held.stderr.split())

    with new_pg_database() as second:
        no_key = _copy(pg_target, second)
        assert no_key.returncode == 1
        assert "FLOWHOOK_SECRET_KEY is not set" in " ".join(no_key.stderr.split())
        said = asyncio.run(copy_while_another_session_is_connected(second))
        assert "other session(s) are connected to the source database" in said
        done = _copy(pg_target, second, FLOWHOOK_SECRET_KEY=key)
        assert done.returncode == 0, done.stderr
        assert "FLOWHOOK_SECRET_KEY set as it is for this copy" in " ".join(done.stdout.split())
        assert asyncio.run(_rows(second, key)) == rows


def test_a_server_does_not_start_on_a_file_a_copy_is_reading(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowhook.db'}"
    env = {**os.environ, "FLOWHOOK_DATABASE_URL": url}
    with holding(url, exclusive=True):  # as `flowhook db copy` holds its source
        done = subprocess.run(
            [FLOWHOOK, "worker"], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2
    assert "`flowhook db copy` is reading this database" in " ".join(done.stderr.split())
