"""The overview page's numbers: runs by status over time, durations by flow, delivery success
by endpoint, and what waits in the queues; one workspace and mode at a time.

Every read is bounded by a time range or a row cap and answered from an index alone, so it
costs the same with a million runs in the table as with a hundred:

- runs per time bucket and status: one ``count(*)`` per bucket and status over
  ``ix_runs_overview`` (workspace, mode, status, queued_at), buckets sent as a ``VALUES`` list.
  Counting index ranges avoids a ``GROUP BY`` on a computed bucket, which SQLite answers by
  sorting every row it counts (measured: 1.2 s against 0.09 s for a day of a million runs).
- durations: each flow's completed runs counted over ``ix_runs_completed`` (flow,
  finished_at, duration_ms); p50 and p95 from its latest :data:`DURATION_SAMPLE` of them, read
  backwards from the same index. An exact percentile over a day needs every duration sorted:
  a second and more on both backends at a million runs.
- deliveries per endpoint and status: the existing (endpoint, status, created_at) index.
- queues: ``ix_runs_queued`` (queued runs by due time) and ``ix_deliveries_pending``
  (pending deliveries by creation); counts stop at :data:`COUNT_CAP`, oldest is the first
  entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, column, func, select, text, values
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import Label
from sqlalchemy.sql.selectable import ScalarSelect

from flowhook.store.delivery_reads import delivered_since
from flowhook.store.models import DeliveryStatus, Mode, RunStatus
from flowhook.store.runs import asleep_in
from flowhook.store.tables import deliveries, flows, runs, webhook_endpoints
from flowhook.store.types import UTCDateTime

__all__ = [
    "COUNT_CAP",
    "DURATION_SAMPLE",
    "Bucket",
    "FlowDurations",
    "EndpointRate",
    "Backlog",
    "run_buckets",
    "asleep_since",
    "flow_durations",
    "endpoint_rates",
    "backlog",
    "percentile",
]

DURATION_SAMPLE = 2000
"""How many of a flow's latest completed runs its p50 and p95 are taken from."""

COUNT_CAP = 100_000
"""Queue counts stop here (the page says "100,000 or more"): a backlog's size costs no more
to show than this many index entries."""

STATUSES: tuple[RunStatus, ...] = tuple(RunStatus)
DELIVERY_STATUSES: tuple[DeliveryStatus, ...] = tuple(DeliveryStatus)


@dataclass(frozen=True, slots=True)
class Bucket:
    """Runs queued from ``start`` until the next bucket, by their status now."""

    start: datetime
    counts: dict[RunStatus, int]
    waiting: int = 0
    """Of the running ones, how many sleep in a step now (an approval, a signal, a delay;
    their own step or one of their parts'): :func:`asleep_since` counts them."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class FlowDurations:
    """A flow's completed runs in the period and how long they took (milliseconds)."""

    flow_id: str
    name: str
    completed: int
    """Completed runs in the period."""
    sampled: int
    """How many of the latest of them p50 and p95 are taken from."""
    p50_ms: float
    p95_ms: float


@dataclass(frozen=True, slots=True)
class EndpointRate:
    """An endpoint's deliveries created in the period, by status now."""

    endpoint_id: str
    url: str
    description: str
    enabled: bool
    succeeded: int
    failed: int
    pending: int

    @property
    def rate(self) -> float | None:
        """Succeeded among those that ended (0 to 1), or ``None`` when none ended yet."""
        ended = self.succeeded + self.failed
        return self.succeeded / ended if ended else None


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits now. Counts stop at :data:`COUNT_CAP`."""

    runs_due: int
    """Queued runs whose time has come (no worker has taken them yet)."""
    oldest_due_at: datetime | None
    """Since when the longest-waiting of them has been due."""
    runs_later: int
    """Queued runs not due yet: held back by flow control (a concurrency slot, a throttle,
    a debounce) or by a ``map`` step's concurrency."""
    deliveries_pending: int
    oldest_pending_at: datetime | None
    """When the oldest pending delivery was created."""
    approvals_waiting: int = 0
    """Runs (their own steps or their parts') asleep in an ``approval`` step: waiting for a
    person."""
    signals_waiting: int = 0
    """Runs asleep in a ``wait`` step: waiting for a signal."""


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``ordered`` (sorted, not empty), interpolated between
    the two nearest values as PostgreSQL's ``percentile_cont`` does."""
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


async def run_buckets(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    starts: Sequence[datetime],
    width: timedelta,
) -> list[Bucket]:
    """For each bucket ``[start, start + width)``, the runs (not the parts of a ``parallel``
    or ``map`` step) queued in it, by their status now."""
    if not starts:
        return []
    b = (
        values(column("start", UTCDateTime()), column("stop", UTCDateTime()), name="b")
        .data([(s, s + width) for s in starts])
        .cte("b")
    )

    def counted(status: RunStatus) -> Label[int]:
        return (
            select(func.count())
            .select_from(runs)
            .where(
                runs.c.workspace_id == workspace_id,
                runs.c.mode == mode.value,
                runs.c.status == status.value,
                runs.c.queued_at >= b.c.start,
                runs.c.queued_at < b.c.stop,
                runs.c.root_run_id.is_(None),
            )
            .scalar_subquery()
            .label(status.value)
        )

    q = select(b.c.start, *(counted(s) for s in STATUSES))
    found = {
        row.start: {s: int(row._mapping[s.value]) for s in STATUSES}
        for row in (await conn.execute(q)).all()
    }
    return [Bucket(s, found[s]) for s in starts]


SLEEPING_STEPS = ("approval", "wait", "delay")
"""Step types whose waiting is a run's own sleep (a person, a signal, a time). A ``parallel``,
``map`` or ``flow`` step waits too, while its parts or child run work: not asleep."""


async def asleep_since(
    conn: AsyncConnection, workspace_id: str, mode: Mode, since: datetime
) -> list[datetime]:
    """When each run queued since ``since`` that sleeps now was queued: running, with a
    step of its own or of one of its parts asleep (:data:`SLEEPING_STEPS`). Read
    from the waiting step records, which are few beside the runs."""
    asleep = asleep_in(workspace_id, mode, SLEEPING_STEPS)
    q = select(runs.c.queued_at).where(
        runs.c.run_id.in_(asleep),
        runs.c.status == RunStatus.RUNNING.value,
        runs.c.queued_at >= since,
    )
    return [row[0] for row in (await conn.execute(q)).all()]


async def flow_durations(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    since: datetime,
    *,
    limit: int = 12,
    sample: int = DURATION_SAMPLE,
) -> tuple[list[FlowDurations], int]:
    """The ``limit`` flows with the most runs completed since ``since`` (most first), each
    with p50 and p95 of its latest ``sample`` of them; and how many more flows completed
    runs in that time."""
    completed = (
        select(func.count())
        .select_from(runs)
        .where(
            runs.c.flow_id == flows.c.flow_id,
            text("runs.status = 'completed'"),  # written out: ix_runs_completed's predicate
            runs.c.root_run_id.is_(None),
            runs.c.finished_at >= since,
        )
        .scalar_subquery()
        .label("completed")
    )
    listed = select(flows.c.flow_id, flows.c.name, completed).where(
        flows.c.workspace_id == workspace_id, flows.c.mode == mode.value
    )
    busy = sorted(
        ((r.flow_id, r.name, int(r.completed)) for r in (await conn.execute(listed)).all()),
        key=lambda r: (-r[2], r[1], r[0]),
    )
    busy = [r for r in busy if r[2] > 0]
    found = []
    for flow_id, name, count in busy[:limit]:
        latest = (
            select(runs.c.duration_ms)
            .where(
                runs.c.flow_id == flow_id,
                text("runs.status = 'completed'"),
                runs.c.root_run_id.is_(None),
                runs.c.finished_at >= since,
            )
            .order_by(runs.c.finished_at.desc())
            .limit(sample)
        )
        taken = sorted(int(d or 0) for d in (await conn.execute(latest)).scalars())
        if not taken:  # completed meanwhile by a retention prune: nothing to show
            continue
        found.append(
            FlowDurations(
                flow_id, name, count, len(taken), percentile(taken, 0.5), percentile(taken, 0.95)
            )
        )
    return found, max(0, len(busy) - limit)


async def endpoint_rates(
    conn: AsyncConnection, workspace_id: str, mode: Mode, since: datetime
) -> list[EndpointRate]:
    """Each endpoint of the workspace and mode (oldest first) with its deliveries created
    since ``since`` by status."""
    ep = webhook_endpoints.c

    def counted(status: DeliveryStatus) -> Label[int]:
        q = (
            select(func.count())
            .select_from(deliveries)
            .where(
                deliveries.c.endpoint_id == ep.id,
                deliveries.c.status == status.value,
                deliveries.c.created_at >= since,
            )
        )
        if status is DeliveryStatus.FAILED:  # a replay delivered its event: not a failure
            q = q.where(~delivered_since())
        return q.scalar_subquery().label(status.value)

    q = (
        select(ep.id, ep.url, ep.description, ep.enabled, *(counted(s) for s in DELIVERY_STATUSES))
        .where(ep.workspace_id == workspace_id, ep.mode == mode.value)
        .order_by(ep.created_at, ep.id)
    )
    return [
        EndpointRate(
            r.id,
            r.url,
            r.description or "",
            bool(r.enabled),
            succeeded=int(r.succeeded),
            failed=int(r.failed),
            pending=int(r.pending),
        )
        for r in (await conn.execute(q)).all()
    ]


def _capped(q: Select[Any]) -> ScalarSelect[Any]:
    """How many rows ``q`` gives, counting no further than :data:`COUNT_CAP`."""
    return select(func.count()).select_from(q.limit(COUNT_CAP).subquery()).scalar_subquery()


async def backlog(conn: AsyncConnection, workspace_id: str, mode: Mode, now: datetime) -> Backlog:
    """The queued runs (parts of a ``parallel`` or ``map`` step too: each is work for a
    worker) and pending deliveries of the workspace and mode, as of ``now``."""
    queued = (
        runs.c.workspace_id == workspace_id,
        runs.c.mode == mode.value,
        text("runs.status = 'queued'"),  # written out: ix_runs_queued's predicate
    )
    pending = (
        deliveries.c.workspace_id == workspace_id,
        deliveries.c.mode == mode.value,
        text("deliveries.status = 'pending'"),  # ix_deliveries_pending's predicate
    )
    due_at, created_at = runs.c.due_at, deliveries.c.created_at
    q = select(
        _capped(select(due_at).where(*queued, due_at <= now)).label("due"),
        select(func.min(due_at)).where(*queued, due_at <= now).scalar_subquery().label("oldest"),
        _capped(select(due_at).where(*queued, due_at > now)).label("later"),
        _capped(select(created_at).where(*pending)).label("pending"),
        select(func.min(created_at)).where(*pending).scalar_subquery().label("oldest_pending"),
    )
    row = (await conn.execute(q)).one()
    asleep = (
        await conn.execute(
            select(
                _capped(asleep_in(workspace_id, mode, "approval")).label("approvals"),
                _capped(asleep_in(workspace_id, mode, "wait")).label("signals"),
            )
        )
    ).one()
    return Backlog(
        runs_due=int(row.due),
        oldest_due_at=row.oldest,
        runs_later=int(row.later),
        deliveries_pending=int(row.pending),
        oldest_pending_at=row.oldest_pending,
        approvals_waiting=int(asleep.approvals),
        signals_waiting=int(asleep.signals),
    )
