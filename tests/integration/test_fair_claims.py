"""Claims take turns across workspaces and modes (audit 2, "also seen"), on both backends.

Every (workspace, mode) is a queue of its own; a claim takes one due run of each queue in
turn, from the one after the queue that had the last turn, before it takes a second of any.
Within a queue runs go highest ``priority`` first, then in the order they fell due. The old
claim took runs by priority and due time across every workspace, so one tenant's backlog
came before another tenant's one run: each test here fails on it.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text, update

from flowhook.clock import FakeClock
from flowhook.service import Services
from flowhook.service.auth import Principal
from flowhook.store import pg_driver
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, Run
from flowhook.store.tables import runs

FLOW: dict[str, Any] = {
    "name": "f",
    "steps": [{"id": "a", "type": "transform", "output": {"ok": True}}],
}
LEASE = timedelta(seconds=30)


class Tenants:
    def __init__(self, services: Services, clock: FakeClock) -> None:
        self.services = services
        self.clock = clock
        services.runs._clock = clock
        self.flows: dict[tuple[str, Mode], tuple[Principal, str]] = {}

    async def queue(self, workspace: str, n: int, mode: Mode = Mode.TEST) -> list[str]:
        """``n`` runs of ``workspace`` in ``mode``, each due a millisecond after the last."""
        if (workspace, mode) not in self.flows:
            created = await self.services.keys.create(mode, workspace)
            who = await self.services.keys.authenticate(f"Bearer {created.key}")
            flow = await self.services.flows.create(who, FLOW)
            self.flows[(workspace, mode)] = (who, flow.flow_id)
        who, flow_id = self.flows[(workspace, mode)]
        ids = []
        for _ in range(n):
            self.clock.advance(0.001)
            started = await self.services.runs.start(who, flow_id=flow_id, payload={})
            ids.append(started.run.run_id)
        return ids

    def of(self, run: Run) -> tuple[str, Mode]:
        return next(
            key
            for key, (who, _) in self.flows.items()
            if (who.workspace_id, who.mode) == (run.workspace_id, run.mode)
        )


async def _claim(db: Database, clock: FakeClock, turns: runs_store.Turns, limit: int) -> list[Run]:
    now = clock.now()
    async with db.transaction() as conn:
        return await runs_store.claim_runs(
            conn, owner="w", now=now, lease_until=now + LEASE, limit=limit, turns=turns
        )


async def _set(db: Database, run_ids: list[str], **values: Any) -> None:
    async with db.transaction() as conn:
        await conn.execute(update(runs).where(runs.c.run_id.in_(run_ids)).values(**values))


async def test_one_workspace_s_backlog_delays_another_s_run_by_one_turn(
    services: Services, db: Database
) -> None:
    """Workspace a has 200 runs queued, half of them at priority 100, and one live run
    queued after them; workspace b's one run is queued last. Claims of one run each take
    one from each queue in turn: b's run and a's live run within the first three claims,
    each queue's highest priority first. The old claim took a's 100 priority runs first."""
    clock = FakeClock()
    tenants = Tenants(services, clock)
    backlog = await tenants.queue("a", 200)
    await _set(db, backlog[100:], priority=100)
    [live] = await tenants.queue("a", 1, Mode.LIVE)
    [quiet] = await tenants.queue("b", 1)
    turns = runs_store.Turns()
    first = [run for _ in range(3) for run in await _claim(db, clock, turns, 1)]
    assert sorted(tenants.of(r) for r in first) == sorted(
        [("a", Mode.TEST), ("a", Mode.LIVE), ("b", Mode.TEST)]
    )
    assert {r.run_id for r in first} == {backlog[100], live, quiet}  # a's: its oldest at 100
    rest = {r.run_id for r in await _claim(db, clock, turns, 150)}
    assert rest == {*backlog[101:], *backlog[:51]}  # one queue left: priority, then due order


async def test_a_claim_takes_one_of_each_queue_before_a_second_of_any(
    services: Services, db: Database
) -> None:
    """Seven runs claimed from queues of 10, 2 and 1 runs: four rounds, a's queue in each,
    b's in two, c's in one; the next claim begins after the queue that had the last turn."""
    clock = FakeClock()
    tenants = Tenants(services, clock)
    a = await tenants.queue("a", 10)
    b = await tenants.queue("b", 2)
    c = await tenants.queue("c", 1)
    turns = runs_store.Turns()
    claimed = await _claim(db, clock, turns, 7)
    assert {r.run_id for r in claimed} == {*a[:4], *b, *c}
    assert Counter(tenants.of(r)[0] for r in claimed) == {"a": 4, "b": 2, "c": 1}
    a_id = tenants.flows[("a", Mode.TEST)][0].workspace_id
    assert turns.after == (a_id, "test")  # round 4 was a's alone


async def test_every_workspace_has_its_turn_past_one_claim_s_workspaces(
    services: Services, db: Database
) -> None:
    """More workspaces than one claim looks at (``TURN_SPACES``): claims of one run each
    take one run of every workspace before a second of any. And when the workspaces a claim
    looks at have nothing due (their runs sleep), the next claim looks at the ones after."""
    clock = FakeClock()
    tenants = Tenants(services, clock)
    count = runs_store.TURN_SPACES + 4
    queued = {name: await tenants.queue(name, 2) for name in (f"w{i:02}" for i in range(count))}
    turns = runs_store.Turns()
    taken = [tenants.of(r)[0] for _ in range(count) for r in await _claim(db, clock, turns, 1)]
    assert sorted(taken) == sorted(queued)  # one each

    sleeping = [run_id for ids in queued.values() for run_id in ids]
    await _set(db, sleeping, due_at=clock.now() + timedelta(hours=1), lease_owner=None)
    [beyond] = await tenants.queue("z-last", 1)  # the highest workspace id: past the window
    turns = runs_store.Turns()
    assert await _claim(db, clock, turns, 1) == []  # its window: sixteen sleeping workspaces
    [found] = await _claim(db, clock, turns, 1)
    assert found.run_id == beyond


def test_the_rotation_of_queues() -> None:
    """``Turns.order``: from the queue after the last turn round to it, modes of a workspace
    as queues of their own; ``took`` moves past the last queue of the last round."""
    turns = runs_store.Turns()
    spaces = [("ws_b", True, True), ("ws_a", False, True), ("ws_c", True, False)]
    assert turns.order(spaces) == [
        ("ws_a", "test"), ("ws_b", "live"), ("ws_b", "test"), ("ws_c", "live")
    ]  # fmt: skip
    turns.after = ("ws_b", "live")
    assert turns.order(spaces) == [
        ("ws_b", "test"), ("ws_c", "live"), ("ws_a", "test"), ("ws_b", "live")
    ]  # fmt: skip


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_the_claims_keep_one_plan_that_reads_the_queue_index(db: Database) -> None:
    """PostgreSQL: ``Database.statement()``'s connections keep one generic plan per prepared
    statement (PostgreSQL planned the claims anew on every call: ~2 ms of its CPU for the
    turn-taking claim's two statements); the API's other connections keep its own choice.
    The generic plans read ``ix_runs_queue`` for the skip scan and each queue's ranges."""
    async with db.statement() as conn:
        assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar() == "force_generic_plan"
    async with db.read() as conn:
        assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar() == "auto"
    now = FakeClock().now()
    cases = [
        (runs_store._spaces_statement(), {"after": ""}),
        (
            runs_store._claim_statement(True, 2),
            {"owner": "w", "now": now, "lease_until": now + LEASE, "limit": 8}
            | {"w0": "ws_a", "m0": "test", "w1": "ws_b", "m1": "live"},
        ),
    ]
    async with db.statement() as conn:
        for i, (stmt, params) in enumerate(cases):
            sql, order, own, _ = pg_driver._pg_raw_plan(stmt, conn.dialect)
            await conn.exec_driver_sql(f"PREPARE probe{i} AS {sql}")
            values = [own[n] if n in own else params[n] for n, _, _ in order]
            values = [
                v if bind is None else bind(v)
                for v, (_, _, bind) in zip(values, order, strict=True)
            ]
            literals = ", ".join(_literal(v) for v in values)
            found = await conn.exec_driver_sql(f"EXPLAIN EXECUTE probe{i}({literals})")
            plan = "\n".join(row[0] for row in found)
            # the skip scan's seeds and modes; each queue's three ranges
            assert plan.count("Scan using ix_runs_queue on runs") == 6, plan
            assert re.search(r"\$\d", plan)  # a generic plan: its values are parameters


def _literal(value: Any) -> str:
    if isinstance(value, bytes):
        return f"'\\x{value.hex()}'::bytea"
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'::timestamptz"
    return f"'{value}'" if isinstance(value, str) else str(value)
