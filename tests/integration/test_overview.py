"""The overview page's queries on known data, on SQLite and PostgreSQL: runs per bucket and
status, p50/p95 by flow, delivery success by endpoint, the queues; each answered from an
index (checked with the database's own plan)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import Any

import pytest
from sqlalchemy import event, text

from flowhook.clock import FakeClock
from flowhook.ids import pack_id
from flowhook.service import Principal, Services
from flowhook.service.overview import OverviewService, bucket_starts
from flowhook.store import overview as overview_store
from flowhook.store.db import Database
from flowhook.store.models import Mode, RunStatus
from flowhook.store.tables import deliveries, run_steps, runs
from flowhook.store.types import HELD
from flowhook.web.charts import chart_counts

NOW = datetime(2026, 11, 24, 10, 30, 20, 500000, tzinfo=UTC)
FLOW: dict[str, Any] = {
    "name": "orders",
    "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload.x }}"}}],
}
_seq = count()


def _run(
    who: Principal,
    flow_id: str,
    status: str,
    queued_at: datetime,
    *,
    duration_ms: int | None = None,
    finished_at: datetime | None = None,
    due_at: datetime | None = None,
    part_of: str | None = None,
    mode: Mode | None = None,
    workspace_id: str | None = None,
) -> dict[str, Any]:
    if duration_ms is not None and finished_at is None:
        finished_at = queued_at + timedelta(milliseconds=duration_ms)
    return {
        "run_id": f"run_t{next(_seq):08d}",
        "workspace_id": workspace_id or who.workspace_id,
        "mode": (mode or who.mode).value,
        "flow_id": flow_id,
        "flow_version": 1,
        "trigger": "api",
        "status": status,
        "payload": {},
        "queued_at": queued_at,
        "available_at": due_at or queued_at,
        "due_at": due_at or queued_at,
        "finished_at": finished_at,
        "duration_ms": duration_ms,
        "root_run_id": part_of,
        "parent_run_id": part_of,
        "parent_idx": 0 if part_of else None,
    }


async def _insert(db: Database, table: Any, rows: list[dict[str, Any]]) -> None:
    async with db.transaction() as conn:
        await conn.execute(table.insert(), rows)


async def _who(services: Services, mode: Mode = Mode.TEST, name: str = "acme") -> Principal:
    created = await services.keys.create(mode, name)
    return await services.keys.authenticate(f"Bearer {created.key}")


def _overview(services: Services) -> OverviewService:
    return OverviewService(services.db, FakeClock(NOW))


# Runs over time


def test_buckets_align_on_utc_minutes_and_hours() -> None:
    minutes = bucket_starts(NOW, timedelta(minutes=1), 60)
    assert minutes[-1] == datetime(2026, 11, 24, 10, 30, tzinfo=UTC)
    assert minutes[0] == datetime(2026, 11, 24, 9, 31, tzinfo=UTC)
    hours = bucket_starts(NOW, timedelta(hours=1), 24)
    assert hours[-1] == datetime(2026, 11, 24, 10, tzinfo=UTC)
    assert hours[0] == datetime(2026, 11, 23, 11, tzinfo=UTC)
    assert len(set(minutes)) == 60 and minutes == sorted(minutes)


async def test_runs_are_counted_per_minute_and_hour_by_status(
    services: Services, db: Database
) -> None:
    who = await _who(services)
    live = await _who(services, Mode.LIVE)
    other = await _who(services, name="globex")
    flow = (await services.flows.create(who, FLOW)).flow_id
    m = datetime(2026, 11, 24, 10, 29, tzinfo=UTC)  # the minute before the current one
    rows = [
        *(_run(who, flow, "completed", m + timedelta(seconds=s)) for s in (0, 10, 59.999)),
        _run(who, flow, "failed", m + timedelta(seconds=30)),
        _run(who, flow, "running", NOW - timedelta(seconds=5)),
        _run(who, flow, "running", NOW - timedelta(seconds=1)),
        _run(who, flow, "queued", NOW),
        _run(who, flow, "cancelled", datetime(2026, 11, 24, 9, 31, tzinfo=UTC)),  # first minute
        _run(who, flow, "completed", datetime(2026, 11, 24, 9, 30, 59, tzinfo=UTC)),  # day only
        _run(who, flow, "failed", datetime(2026, 11, 23, 11, 0, tzinfo=UTC)),  # first hour
        _run(who, flow, "failed", datetime(2026, 11, 23, 10, 59, 59, tzinfo=UTC)),  # neither
        _run(who, flow, "completed", m, part_of="run_t_parent"),  # a map item: not a run
        _run(live, flow, "completed", m),  # another mode
        _run(other, flow, "completed", m),  # another workspace
    ]
    await _insert(db, runs, rows)

    got = await _overview(services).get(who)

    hour = {b.start: b.counts for b in got.last_hour if b.total}
    S = RunStatus
    zero = dict.fromkeys(S, 0)
    assert hour == {
        datetime(2026, 11, 24, 9, 31, tzinfo=UTC): {**zero, S.CANCELLED: 1},
        m: {**zero, S.COMPLETED: 3, S.FAILED: 1},
        datetime(2026, 11, 24, 10, 30, tzinfo=UTC): {**zero, S.RUNNING: 2, S.QUEUED: 1},
    }
    assert len(got.last_hour) == 60
    day = {b.start: b.counts for b in got.last_day if b.total}
    assert day == {
        datetime(2026, 11, 23, 11, tzinfo=UTC): {**zero, S.FAILED: 1},
        datetime(2026, 11, 24, 9, tzinfo=UTC): {**zero, S.CANCELLED: 1, S.COMPLETED: 1},
        datetime(2026, 11, 24, 10, tzinfo=UTC): {
            **zero, S.COMPLETED: 3, S.FAILED: 1, S.RUNNING: 2, S.QUEUED: 1,
        },
    }  # fmt: skip
    assert sum(b.total for b in got.last_day) == 10
    assert (await _overview(services).get(other)).last_hour[-2].counts[S.COMPLETED] == 1


async def test_runs_asleep_in_a_step_are_counted_as_waiting_not_running(
    services: Services, db: Database
) -> None:
    """A running run with a waiting step of its own, or of one of its parts, is drawn as
    waiting; one mid-step is running; another workspace's sleepers count for it alone."""
    who = await _who(services)
    other = await _who(services, name="globex")
    flow = (await services.flows.create(who, FLOW)).flow_id
    at = NOW - timedelta(seconds=5)
    asleep, part_parent, busy, part = (
        _run(who, flow, "running", at), _run(who, flow, "running", at),
        _run(who, flow, "running", at), None,
    )  # fmt: skip
    part = _run(who, flow, "running", at, part_of=part_parent["run_id"])
    theirs = _run(other, flow, "running", at)
    await _insert(db, runs, [asleep, part_parent, busy, part, theirs])

    def step(run: dict[str, Any], status: str, kind: str = "approval") -> dict[str, Any]:
        return {"run_id": run["run_id"], "idx": 0, "step_id": "s", "type": kind,
                "status": status, "attempts": 1}  # fmt: skip

    await _insert(db, run_steps, [
        step(asleep, "waiting"), step(part, "waiting", "wait"), step(busy, "running", "http"),
        step(theirs, "waiting", "delay"),
    ])  # fmt: skip

    got = await _overview(services).get(who)
    [now_minute] = [b for b in got.last_hour if b.total]
    assert now_minute.counts[RunStatus.RUNNING] == 3 and now_minute.waiting == 2
    assert chart_counts(now_minute)["running"] == 1 and chart_counts(now_minute)["waiting"] == 2
    [now_hour] = [b for b in got.last_day if b.total]
    assert now_hour.waiting == 2
    mine_elsewhere = [b for b in (await _overview(services).get(other)).last_hour if b.total]
    assert [b.waiting for b in mine_elsewhere] == [1]


# Durations


async def test_p50_and_p95_per_flow_from_completed_runs_of_the_day(
    services: Services, db: Database
) -> None:
    who = await _who(services)
    a = (await services.flows.create(who, {**FLOW, "name": "checkout"})).flow_id
    b = (await services.flows.create(who, {**FLOW, "name": "refunds"})).flow_id
    idle = (await services.flows.create(who, {**FLOW, "name": "idle"})).flow_id
    t0 = NOW - timedelta(hours=5)
    rows = [  # checkout: 5 completed; finished in this order
        _run(who, a, "completed", t0 + timedelta(minutes=i), duration_ms=d)
        for i, d in enumerate([1000, 100, 400, 300, 200])
    ]
    rows += [
        _run(who, b, "completed", t0, duration_ms=50),
        _run(who, b, "completed", t0, duration_ms=70),
        _run(who, b, "failed", t0, duration_ms=99_000),  # failed: not a completed duration
        _run(who, b, "cancelled", t0, duration_ms=99_000),
        _run(who, b, "completed", NOW - timedelta(hours=25), duration_ms=99_000),  # too old
        _run(who, b, "completed", t0, duration_ms=99_000, part_of="run_t_parent"),  # a part
        _run(who, idle, "running", t0),
    ]
    await _insert(db, runs, rows)

    got = await _overview(services).get(who)

    assert [(d.name, d.completed, d.sampled) for d in got.durations] == [
        ("checkout", 5, 5),
        ("refunds", 2, 2),
    ]
    checkout, refunds = got.durations
    assert (checkout.p50_ms, checkout.p95_ms) == (300, pytest.approx(880))  # 400 + .8 × 600
    assert (refunds.p50_ms, refunds.p95_ms) == (60, pytest.approx(69))
    assert got.more_flows == 0
    if db.dialect == "postgresql":  # the same as PostgreSQL's own percentile_cont
        async with db.read() as conn:
            exact = (
                await conn.execute(
                    text(
                        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms),"
                        " percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_ms)"
                        " FROM runs WHERE flow_id = :f"
                    ),
                    {"f": pack_id(a)},  # the id as the store keeps it
                )
            ).one()
        assert (checkout.p50_ms, checkout.p95_ms) == (exact[0], pytest.approx(exact[1]))

    # Bounded: the latest 3 of checkout's runs (400, 300, 200), the busiest flow alone.
    async with db.read() as conn:
        latest, more = await overview_store.flow_durations(
            conn, who.workspace_id, who.mode, NOW - timedelta(days=1), limit=1, sample=3
        )
    assert [(d.name, d.completed, d.sampled, d.p50_ms) for d in latest] == [("checkout", 5, 3, 300)]
    assert latest[0].p95_ms == pytest.approx(390)
    assert more == 1


def test_percentile_interpolates_as_percentile_cont() -> None:
    p = overview_store.percentile
    assert p([7], 0.95) == 7
    assert p([1, 2, 3, 4], 0.5) == 2.5
    assert p([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], 0.95) == pytest.approx(95.5)
    assert p([0, 100], 0.0) == 0 and p([0, 100], 1.0) == 100


# Webhooks


def _delivery(
    who: Principal, endpoint_id: str, status: str, created_at: datetime
) -> dict[str, Any]:
    n = next(_seq)
    return {
        "id": f"dlv_t{n:08d}",
        "event_id": f"evt_t{n:08d}",
        "endpoint_id": endpoint_id,
        "workspace_id": who.workspace_id,
        "mode": who.mode.value,
        "event_type": "flow.completed",
        "status": status,
        "next_attempt_at": created_at,
        "due_at": created_at,
        "created_at": created_at,
    }


async def test_delivery_success_rate_per_endpoint_over_the_day(
    services: Services, db: Database
) -> None:
    who = await _who(services)
    other = await _who(services, name="globex")
    one = await services.webhooks.create_endpoint(
        who, url="https://example.com/one", events=["flow.completed"], description="Orders"
    )
    quiet = await services.webhooks.create_endpoint(
        who, url="https://example.com/quiet", events=["flow.completed"]
    )
    theirs = await services.webhooks.create_endpoint(
        other, url="https://example.com/theirs", events=["flow.completed"]
    )
    recent = NOW - timedelta(hours=2)
    rows = [_delivery(who, one.id, "succeeded", recent) for _ in range(8)]
    rows += [_delivery(who, one.id, "failed", recent) for _ in range(2)]
    rows += [_delivery(who, one.id, "pending", recent)]
    rows += [_delivery(who, one.id, "failed", NOW - timedelta(hours=24, seconds=1))]  # too old
    rows += [_delivery(other, theirs.id, "failed", recent)]
    await _insert(db, deliveries, rows)

    got = (await _overview(services).get(who)).endpoints

    assert [(e.url, e.description, e.succeeded, e.failed, e.pending) for e in got] == [
        ("https://example.com/one", "Orders", 8, 2, 1),
        ("https://example.com/quiet", "", 0, 0, 0),
    ]
    assert got[0].rate == pytest.approx(0.8)
    assert got[1].rate is None and got[1].endpoint_id == quiet.id


# Queues


async def test_queue_depth_and_oldest_ages(
    services: Services, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    who = await _who(services)
    other = await _who(services, name="globex")
    flow = (await services.flows.create(who, FLOW)).flow_id
    ago = lambda minutes: NOW - timedelta(minutes=minutes)  # noqa: E731
    rows = [
        _run(who, flow, "queued", ago(9), due_at=ago(5)),  # due 5 min ago: the oldest
        _run(who, flow, "queued", ago(1)),
        _run(who, flow, "queued", ago(2), part_of="run_t_parent"),  # a map item is work too
        _run(who, flow, "queued", ago(30), due_at=HELD),  # held for a concurrency slot
        _run(who, flow, "queued", ago(1), due_at=NOW + timedelta(seconds=30)),  # throttled
        _run(who, flow, "running", ago(60)),
        _run(who, flow, "completed", ago(60), duration_ms=5),
        _run(other, flow, "queued", ago(50)),
    ]
    await _insert(db, runs, rows)
    endpoint = await services.webhooks.create_endpoint(
        who, url="https://example.com/hook", events=["flow.completed"]
    )
    await _insert(
        db,
        deliveries,
        [
            _delivery(who, endpoint.id, "pending", ago(7)),
            _delivery(who, endpoint.id, "pending", ago(1)),
            _delivery(who, endpoint.id, "succeeded", ago(90)),
            _delivery(other, endpoint.id, "pending", ago(80)),
        ],
    )

    got = (await _overview(services).get(who)).backlog

    assert (got.runs_due, got.oldest_due_at, got.runs_later) == (3, ago(5), 2)
    assert (got.deliveries_pending, got.oldest_pending_at) == (2, ago(7))

    monkeypatch.setattr(overview_store, "COUNT_CAP", 2)
    capped = (await _overview(services).get(who)).backlog
    assert (capped.runs_due, capped.deliveries_pending) == (2, 2)

    empty = (await _overview(services).get(await _who(services, Mode.LIVE))).backlog
    assert (empty.runs_due, empty.oldest_due_at, empty.runs_later) == (0, None, 0)
    assert (empty.deliveries_pending, empty.oldest_pending_at) == (0, None)


# Plans


@pytest.fixture
def statements(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """The SQL the reader runs while the test runs, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            seen.append((statement, parameters))

    target = db.reader.sync_engine
    event.listen(target, "before_cursor_execute", record)
    yield seen
    event.remove(target, "before_cursor_execute", record)


INDEXES = {"ix_runs_overview", "ix_runs_completed", "ix_runs_queued", "ix_deliveries_pending"}


async def test_every_overview_read_uses_an_index(
    services: Services, db: Database, statements: list[tuple[str, Any]]
) -> None:
    """No statement of the page reads a table from end to end: each names an index of its
    table in its plan (PostgreSQL told to avoid sequential scans where it can, since a
    few rows would make one cheaper), and the partial indexes the page has its own are used."""
    who = await _who(services)
    flow = (await services.flows.create(who, FLOW)).flow_id
    await _insert(db, runs, [_run(who, flow, "completed", NOW - timedelta(hours=1), duration_ms=9)])
    await services.webhooks.create_endpoint(
        who, url="https://example.com/hook", events=["flow.completed"]
    )
    if db.dialect == "postgresql":
        # TRUNCATE between tests keeps the planner's statistics: an earlier test's 20,000 runs
        # (test_disk_given_back) would have these few rows planned as that many.
        async with db.transaction() as conn:
            await conn.execute(text("ANALYZE runs, deliveries, webhook_endpoints, flows"))
    statements.clear()
    await _overview(services).get(who)
    assert len(statements) >= 5

    used: set[str] = set()
    plans: list[str] = []
    # A transaction, not db.read(): on PostgreSQL reads run in autocommit, where SET LOCAL
    # would last for no statement after it.
    async with db.transaction() as conn:
        if db.dialect == "postgresql":
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
        for sql, params in statements:
            prefix = "EXPLAIN QUERY PLAN " if db.dialect == "sqlite" else "EXPLAIN "
            plan = "\n".join(
                " ".join(str(c) for c in row)
                for row in (await conn.exec_driver_sql(prefix + sql, params)).all()
            )
            for table in ("runs", "deliveries", "webhook_endpoints", "flows"):
                scanned = f"SCAN {table}" if db.dialect == "sqlite" else f"Seq Scan on {table}"
                assert scanned not in plan.replace(f"{table} AS", table), (sql, plan)
            plans.append(plan)
            used |= {name for name in INDEXES if name in plan}
    if db.dialect == "postgresql" and "ix_deliveries_pending" not in used:
        # With no delivery in the table, PostgreSQL's choice between two partial indexes on
        # pending deliveries that cost it the same follows whatever statistics the table had
        # (an earlier test's); either is an index range (bench/overview.py times the read
        # with 300,000 deliveries).
        used.add("ix_deliveries_pending")
        pending_only = ("ix_deliveries_due_at", "ix_deliveries_due", "ix_deliveries_endpoint_due")
        assert any(name in "\n".join(plans) for name in pending_only), plans
    assert used == INDEXES
