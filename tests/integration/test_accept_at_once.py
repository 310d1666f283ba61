"""Accepting runs in one statement on PostgreSQL (issue 18).

A batch of executes without an ``Idempotency-Key`` reads its flows and writes its runs with
the workers' ``NOTIFY`` as one statement, in autocommit: two round trips where a transaction
took five. A run with a trace context and one without are one column set, so one statement.
The transaction's path stays for what needs it (keys, flow control) and on SQLite.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, select

from flowhook.errors import NotFound
from flowhook.service import Services
from flowhook.store.db import Database
from flowhook.store.models import Mode
from flowhook.store.runs import NOTIFY_CHANNEL
from flowhook.store.tables import runs

FLOW = {"name": "plain", "steps": [{"id": "a", "type": "transform", "output": {"x": 1}}]}
PACED = {**FLOW, "name": "paced", "concurrency": {"key": "{{ payload.k }}", "limit": 1}}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
async def statements(db: Database) -> AsyncIterator[list[tuple[str, Any]]]:
    """Each statement the database's connections run: its text and its connection's
    isolation level (``AUTOCOMMIT`` or ``None``, a transaction's). Not the count of the
    workspace's unfinished runs: a background read of its own, at most once a second
    (flowhook/service/active.py), that an execute only sets off."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith(ACTIVE_COUNT):
            seen.append((statement, conn.get_execution_options().get("isolation_level")))

    for engine in db.engines:
        event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield seen
    for engine in db.engines:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


ACTIVE_COUNT = "SELECT runs.workspace_id, runs.mode, count(*)"


async def _who(services: Services) -> Any:
    created = await services.keys.create(Mode.TEST, "acme")
    return await services.keys.authenticate(f"Bearer {created.key}")


async def test_runs_traced_and_not_are_written_together(services: Services, db: Database) -> None:
    """Both backends: concurrent executes, some with a trace context, share a batch and each
    run keeps its own (``NULL`` without one)."""
    who = await _who(services)
    flow = await services.flows.create(who, FLOW)
    started = await asyncio.gather(
        *(
            services.runs.start(
                who,
                flow_id=flow.flow_id,
                payload={"n": i},
                traceparent=TRACEPARENT if i % 2 else None,
            )
            for i in range(6)
        )
    )
    async with db.read() as conn:
        stored = dict((await conn.execute(select(runs.c.run_id, runs.c.traceparent))).all())
    assert {s.run.run_id: stored[s.run.run_id] for s in started} == {
        s.run.run_id: TRACEPARENT if i % 2 else None for i, s in enumerate(started)
    }


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_an_execute_is_two_statements_in_autocommit(
    services: Services, db: Database, pg_url: str, statements: list[tuple[str, Any]]
) -> None:
    """The flow's read and one statement that writes the runs and sends the ``NOTIFY`` the
    workers wait on, neither in a transaction; the notification arrives."""
    who = await _who(services)
    flow = await services.flows.create(who, FLOW)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await listener.add_listener(NOTIFY_CHANNEL, lambda *a: heard.put_nowait(a[2]))
        statements.clear()
        started = await services.runs.start(who, flow_id=flow.flow_id, payload={"n": 1})
        assert await asyncio.wait_for(heard.get(), 5) == NOTIFY_CHANNEL
    finally:
        await listener.close()
    texts = [s for s, _ in statements]
    assert len(texts) == 2, texts
    assert texts[0].lstrip().startswith("SELECT") and "flows" in texts[0]
    assert "INSERT INTO runs" in texts[1] and "pg_notify" in texts[1]
    assert {level for _, level in statements} == {"AUTOCOMMIT"}
    assert (await services.runs.get(who, started.run.run_id)).payload == {"n": 1}


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_an_execute_with_a_key_keeps_its_transaction(
    services: Services, db: Database, statements: list[tuple[str, Any]]
) -> None:
    """An ``Idempotency-Key`` is looked up and written in one transaction: a second request
    with it answers the first run."""
    who = await _who(services)
    flow = await services.flows.create(who, FLOW)
    statements.clear()
    first = await services.runs.start(who, flow_id=flow.flow_id, payload={}, idempotency_key="k1")
    assert statements and {level for _, level in statements} == {None}
    again = await services.runs.start(who, flow_id=flow.flow_id, payload={}, idempotency_key="k1")
    assert again.replayed and again.run.run_id == first.run.run_id


def _writes(statements: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(s, level) for s, level in statements if "INSERT INTO runs" in s]


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_batch_of_traced_untraced_and_unknown_flows_is_one_write(
    services: Services, db: Database, statements: list[tuple[str, Any]]
) -> None:
    """Runs with and without a trace context are one column set, so one statement; an
    execute of a flow that does not exist answers 404 and the others are written once."""
    who = await _who(services)
    flow = await services.flows.create(who, FLOW)
    statements.clear()
    answers = await asyncio.gather(
        *(
            services.runs.start(
                who,
                flow_id=flow.flow_id if i != 3 else "wf_missing",
                payload={"n": i},
                traceparent=TRACEPARENT if i % 2 else None,
            )
            for i in range(6)
        ),
        return_exceptions=True,
    )
    assert isinstance(answers[3], NotFound)
    assert [level for _, level in _writes(statements)] == ["AUTOCOMMIT"]
    async with db.read() as conn:
        stored = (await conn.execute(select(runs.c.run_id))).scalars().all()
    assert sorted(stored) == sorted(
        a.run.run_id for a in answers if not isinstance(a, BaseException)
    )
    assert len(stored) == 5


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_flow_control_keeps_its_transaction(
    services: Services, db: Database, statements: list[tuple[str, Any]]
) -> None:
    """A batch with a flow under flow control is written in a transaction (its locks need
    one), with the flows read once. (The first execute of a flow in a process learns from its
    batch whether the flow has flow control; its keys are then read outside any transaction
    and it joins a second batch: hence one execute of each first.)"""
    who = await _who(services)
    plain = await services.flows.create(who, FLOW)
    paced = await services.flows.create(who, PACED)
    await services.runs.start(who, flow_id=plain.flow_id, payload={})
    await services.runs.start(who, flow_id=paced.flow_id, payload={"k": "a"})
    statements.clear()
    await asyncio.gather(
        services.runs.start(who, flow_id=plain.flow_id, payload={}),
        services.runs.start(who, flow_id=paced.flow_id, payload={"k": "a"}),
    )
    writes = _writes(statements)  # one per column set: the paced run has columns of its own
    assert len(writes) == 2 and {level for _, level in writes} == {None}
    flow_reads = [s for s, _ in statements if s.lstrip().startswith("SELECT") and "FROM flows" in s]
    assert len(flow_reads) == 2, flow_reads  # each flow once, not again in the transaction
