"""The schema, declared once; Alembic migrations must produce exactly this (a test checks).

The partial indexes over a status or ``held`` take their predicates from
:mod:`flowhook.store.guards`, which writes the same terms into the queries that use them
(``tests/unit/test_index_predicates.py`` checks they agree)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

from flowhook.store.guards import ACTIVE_RUN_INDEX, PENDING_DELIVERY_INDEX, held_is, status_in
from flowhook.store.models import Held, RunStatus
from flowhook.store.types import IdType, JSONType, OptionalJSON, UTCDateTime

__all__ = [
    "metadata",
    "workspaces",
    "api_keys",
    "flows",
    "flow_versions",
    "runs",
    "run_steps",
    "events",
    "webhook_endpoints",
    "endpoint_events",
    "deliveries",
    "delivery_attempts",
    "web_sessions",
    "inbound_hooks",
    "inbound_dedup",
    "schedules",
    "signals",
    "waits",
    "approvals",
    "tasks",
    "workers",
    "retention_marks",
    "step_secrets",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def _id(name: str = "id") -> Column[str]:
    """An id primary key (a row's id such as ``wf_…``, or part of a composite key)."""
    return Column(name, IdType(), primary_key=True)


def _ref(name: str, *, required: bool = True) -> Column[str]:
    """The id of another row (no foreign key), NOT NULL unless ``required=False``."""
    return Column(name, IdType(), nullable=not required)


def _scope() -> tuple[Column[str], Column[str]]:
    """``workspace_id`` and ``mode``: every tenant row carries both."""
    return _ref("workspace_id"), Column("mode", String(8), nullable=False)


def _at(name: str, *, required: bool = True) -> Column[object]:
    """A UTC timestamp column, NOT NULL unless ``required=False``."""
    return Column(name, UTCDateTime(), nullable=not required)


def _lease() -> tuple[Column[str], Column[object]]:
    """Who holds a claimed row, and until when."""
    return Column("lease_owner", String(64)), _at("lease_expires_at", required=False)


_CLUSTERED: dict[str, Any] = {"sqlite_with_rowid": False}
"""SQLite: the rows in the primary key's own B-tree (``WITHOUT ROWID``), not a table of
rowids beside an index that repeats the key; for tables keyed by text that no foreign key
points at (migration 0019). PostgreSQL has no such thing."""


def _partial_index(name: str, column: str, where: str) -> Index:
    """An index of the rows ``where`` holds, on both backends."""
    return Index(name, column, postgresql_where=text(where), sqlite_where=text(where))


workspaces = Table(
    "workspaces",
    metadata,
    _id(),
    Column("name", String(200), nullable=False, unique=True),
    _at("created_at"),
)

api_keys = Table(
    "api_keys",
    metadata,
    _id(),
    Column("workspace_id", IdType(), ForeignKey("workspaces.id"), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("prefix", String(24), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),
    _at("created_at"),
    _at("revoked_at", required=False),
    Column("label", String(100)),  # what the key is for, in words (0032)
    _at("last_used_at", required=False),  # written at most every half minute per process
)

flows = Table(
    "flows",
    metadata,
    _id("flow_id"),
    Column("workspace_id", IdType(), ForeignKey("workspaces.id"), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("name", String(200), nullable=False),
    Column("version", Integer, nullable=False),
    _at("created_at"),
    _at("updated_at"),
    _at("archived_at", required=False),
    # the current version's ``slug`` (flows kept as code find their flow by it): one flow of a
    # workspace and mode holds a slug at a time; an archived flow gives its slug up
    Column("slug", String(64)),
    # set while the flow is paused: its queued runs are held (``runs.held = 'paused'``)
    _at("paused_at", required=False),
    Index(None, "workspace_id", "mode", "flow_id"),
    Index(
        "ix_flows_slug",
        "workspace_id",
        "mode",
        "slug",
        unique=True,
        postgresql_where=text("slug IS NOT NULL AND archived_at IS NULL"),
        sqlite_where=text("slug IS NOT NULL AND archived_at IS NULL"),
    ),
)

flow_versions = Table(
    "flow_versions",
    metadata,
    Column("flow_id", IdType(), ForeignKey("flows.flow_id"), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("definition", JSONType, nullable=False),
    _at("created_at"),
)

runs = Table(
    "runs",
    metadata,
    _id("run_id"),
    *_scope(),
    _ref("flow_id"),
    Column("flow_version", Integer, nullable=False),
    Column("trigger", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("payload", JSONType, nullable=False),
    Column("output", OptionalJSON),
    Column("error", OptionalJSON),
    Column("steps_executed", Integer, nullable=False, server_default=text("0")),
    Column("next_step", Integer, nullable=False, server_default=text("0")),
    _at("queued_at"),
    _at("started_at", required=False),
    _at("finished_at", required=False),
    Column("duration_ms", BigInteger),
    # Queue columns: a run is claimable while queued or running and available_at has passed
    # and no live lease holds it.
    _at("available_at"),
    # When the run last fell due (queued, woken from a delay or a backoff): claims and
    # heartbeats move available_at, never this, so a run claimed again after its lease ended
    # is taken in its place instead of behind the work queued meanwhile.
    _at("due_at"),
    *_lease(),
    Column("claims", Integer, nullable=False, server_default=text("0")),
    _at("cancel_requested_at", required=False),
    Column("idempotency_key", String(255)),
    Column("request_hash", String(64)),
    # The run this one reruns (its steps before the rerun's first one are reused).
    _ref("rerun_of", required=False),
    # A run started by a step of another (a ``flow`` step's child, or a part: one branch of
    # a ``parallel`` or one item of a ``map``): the row and the index of the step that waits
    # for it. A part also names the run people see (``root_run_id``) and which branch or
    # item it is (``scope``); a child run is a run like any other.
    _ref("parent_run_id", required=False),
    Column("parent_idx", Integer),
    _ref("root_run_id", required=False),
    Column("scope", OptionalJSON),
    # A nested run's (a child's, a part's): the top-level run its tree grew from, for the
    # tree's budget and a cancel of the whole tree (run_trees); NULL for a top-level run.
    _ref("tree_run_id", required=False),
    # Flow control (see flowhook/store/control.py): the keys read when the run was accepted,
    # the concurrency slot it holds from admission to its end, why it is held back, and its
    # place among due runs.
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("concurrency_key", String(255)),
    Column("concurrency_slot", String(255)),
    Column("held", String(16)),
    Column("throttle_key", String(255)),
    _at("throttle_at", required=False),
    Column("debounce_key", String(255)),
    # The W3C trace context the run's span lives under (flowhook/tracing.py); NULL: a trace
    # of its own, derived from run_id.
    Column("traceparent", String(55)),
    # Unique among the runs that have a key (few do): partial, so a run without one is in no
    # index entry (SQLite's unique constraint stored one for each; migration 0022).
    Index(
        "uq_runs_workspace_id_mode_idempotency_key",
        "workspace_id",
        "mode",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
        sqlite_where=text("idempotency_key IS NOT NULL"),
    ),
    _partial_index("ix_runs_claimable", "available_at", ACTIVE_RUN_INDEX),
    Index(
        "ix_runs_parent",
        "parent_run_id",
        "parent_idx",
        "run_id",
        postgresql_where=text("parent_run_id IS NOT NULL"),
        sqlite_where=text("parent_run_id IS NOT NULL"),
    ),
    Index(None, "workspace_id", "mode", "run_id"),
    Index(None, "flow_id", "run_id"),
)


def _partial(name: str, where: str, *columns: Any) -> Index:
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


# Flow control's partial indexes: runs without flow control are in none of them.
_partial(  # the queue of each workspace and mode, in claim order (claim_runs takes turns)
    "ix_runs_queue", ACTIVE_RUN_INDEX,
    runs.c.workspace_id, runs.c.mode, runs.c.priority.desc(), runs.c.due_at,
)  # fmt: skip
_partial(  # the runs holding a concurrency slot, per flow and key
    "ix_runs_slots", "concurrency_slot IS NOT NULL", runs.c.flow_id, runs.c.concurrency_slot
)
_partial(  # the runs waiting for a slot, in the order they get one
    "ix_runs_held", held_is(Held.CONCURRENCY),
    runs.c.flow_id, runs.c.concurrency_key, runs.c.priority.desc(), runs.c.run_id,
)  # fmt: skip
_partial(  # a throttle's reserved starts, latest last
    "ix_runs_throttle", "throttle_at IS NOT NULL",
    runs.c.flow_id, runs.c.throttle_key, runs.c.throttle_at,
)  # fmt: skip
_partial(  # the run a debounced execute may still join
    "ix_runs_debounce", held_is(Held.DEBOUNCE), runs.c.flow_id, runs.c.debounce_key
)
_partial(  # a run's parts (branches, map items): nested approvals and targeted signals
    "ix_runs_root", "root_run_id IS NOT NULL", runs.c.root_run_id
)
_partial("ix_runs_tree", "tree_run_id IS NOT NULL", runs.c.tree_run_id)  # a tree's runs

run_trees = Table(
    "run_trees",
    metadata,
    # One row per top-level run whose tree started a child run: how many it started (the
    # budget FLOWHOOK_MAX_RUN_TREE bounds), and when the whole tree was cancelled (after
    # which none of its runs may start another).
    _id("run_id"),
    Column("runs", Integer, nullable=False),
    _at("cancelled_at", required=False),
)

# The overview page's (flowhook/store/overview.py): runs by status over time, completed runs'
# durations by flow, and the queued runs by due time.
_partial(
    "ix_runs_overview", "root_run_id IS NULL",
    runs.c.workspace_id, runs.c.mode, runs.c.status, runs.c.queued_at,
)  # fmt: skip
_partial(
    "ix_runs_completed", f"{status_in(None, [RunStatus.COMPLETED])} AND root_run_id IS NULL",
    runs.c.flow_id, runs.c.finished_at, runs.c.duration_ms,
)  # fmt: skip
_partial(
    "ix_runs_queued", status_in(None, [RunStatus.QUEUED]),
    runs.c.workspace_id, runs.c.mode, runs.c.due_at,
)  # fmt: skip
# Retention's: finished runs by when they ended (top-level and parts alike), oldest first.
_partial("ix_runs_finished", "finished_at IS NOT NULL", runs.c.finished_at)

run_steps = Table(
    "run_steps",
    metadata,
    Column("run_id", IdType(), ForeignKey("runs.run_id"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("step_id", String(64), nullable=False),
    Column("type", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    _at("started_at", required=False),
    _at("finished_at", required=False),
    Column("duration_ms", BigInteger),
    Column("output", OptionalJSON),
    Column("error", OptionalJSON),
    # The numbers of the attempts that started and never recorded an outcome (the process
    # died, or the run was cancelled meanwhile); null when none.
    Column("interrupted", OptionalJSON),
    # A rerun's step copied from the run it reruns, not run again.
    Column("reused", Boolean, nullable=False, server_default=false()),
    **_CLUSTERED,
)

events = Table(
    "events",
    metadata,
    _id(),
    *_scope(),
    Column("type", String(40), nullable=False),
    _ref("flow_id", required=False),
    _ref("run_id", required=False),
    _at("created_at"),
    # The payload's JSON. The body signed and sent (every attempt and replay sends the same
    # bytes) is the envelope of SPEC §2 rebuilt around it from the columns above
    # (flowhook.store.models.envelope), so they are not stored twice.
    Column("payload", LargeBinary, nullable=False),
    # The exact body, only where it is not the envelope rebuilt (events written before
    # migration 0019 whose bytes differ); NULL otherwise.
    Column("body", LargeBinary),
    # A run's events: on SQLite each entry also holds the event's id (the primary key), so
    # they come in id order; PostgreSQL keeps one entry per run with the row addresses of
    # its events (B-tree deduplication), a fifth of the size of (run_id, id).
    Index(None, "run_id"),
    Index(None, "workspace_id", "mode", "id"),
    **_CLUSTERED,
)

webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    _id(),
    *_scope(),
    Column("url", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("enabled", Boolean, nullable=False),
    Column("disabled_reason", Text),
    # The signing secret (whsec_…), sealed by store/crypto.py: readable to sign with.
    Column("secret", Text, nullable=False),
    Column("previous_secret", Text),
    _at("previous_secret_expires_at", required=False),
    _at("failing_since", required=False),
    _at("created_at"),
    _at("updated_at"),
    # Flow control of deliveries: at most rate_limit a second (rate_next_at: when the next
    # may go, across processes), one in flight in event order ("fifo"), only these flows.
    Column("rate_limit", Float),
    _at("rate_next_at", required=False),
    Column("ordering", String(8)),
    Column("filter_flow_ids", OptionalJSON),
    # Paused (POST …/pause): its deliveries are held, due never, until it is resumed.
    _at("paused_at", required=False),
    Index(None, "workspace_id", "mode", "id"),
)

endpoint_events = Table(
    "endpoint_events",
    metadata,
    Column(
        "endpoint_id",
        IdType(),
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("event", String(40), primary_key=True),  # an event type, such as flow.completed
)

deliveries = Table(
    "deliveries",
    metadata,
    _id(),
    _ref("event_id"),
    _ref("endpoint_id"),
    *_scope(),
    Column("event_type", String(40), nullable=False),
    _ref("run_id", required=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    # Due time while pending; moved to the lease's end while an attempt is under way.
    _at("next_attempt_at"),
    # When the current attempt fell due; claims do not move it, so a delivery claimed again
    # after its lease ended is taken in its place instead of behind the backlog.
    _at("due_at"),
    *_lease(),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    _ref("replay_of", required=False),
    _at("created_at"),
    _at("finished_at", required=False),
    _partial_index("ix_deliveries_due", "next_attempt_at", PENDING_DELIVERY_INDEX),
    _partial_index("ix_deliveries_due_at", "due_at", PENDING_DELIVERY_INDEX),
    Index(None, "workspace_id", "mode", "id"),
    Index(None, "endpoint_id", "status", "created_at"),
    # A delivery's run is its event's (Delivery.queued, replays copy it): a run's deliveries
    # are found through its events (ix_events_run_id, then this), not by an index on run_id
    # (migration 0022).
    Index(None, "event_id"),
)
_partial(  # the overview page's pending deliveries, oldest first
    "ix_deliveries_pending", PENDING_DELIVERY_INDEX,
    deliveries.c.workspace_id, deliveries.c.mode, deliveries.c.created_at,
)  # fmt: skip
_partial(  # the dispatcher's next due delivery past busy endpoints: each endpoint once
    "ix_deliveries_endpoint_due", PENDING_DELIVERY_INDEX,
    deliveries.c.endpoint_id, deliveries.c.next_attempt_at,
)  # fmt: skip

delivery_attempts = Table(
    "delivery_attempts",
    metadata,
    Column(
        "delivery_id", IdType(), ForeignKey("deliveries.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("number", Integer, primary_key=True),
    _at("started_at"),
    _at("finished_at", required=False),
    Column("duration_ms", BigInteger),
    Column("address", String(100)),
    Column("status_code", Integer),
    Column("response_excerpt", Text),
    Column("error_class", String(32)),
    Column("error_detail", Text),
    _at("next_attempt_at", required=False),
    **_CLUSTERED,
)

web_sessions = Table(
    "web_sessions",
    metadata,
    # SHA-256 of the cookie's random token: a leaked table cannot be replayed as cookies.
    Column("token_hash", String(64), primary_key=True),
    _ref("key_id"),
    *_scope(),
    Column("csrf_token", String(64), nullable=False),
    _at("created_at"),
    _at("expires_at"),
)

inbound_hooks = Table(
    "inbound_hooks",
    metadata,
    _id(),
    *_scope(),
    # what an arrival does: start a run of ``flow_id``, or send the signal ``signal``
    _ref("flow_id", required=False),
    Column("signal", String(200)),
    # {"type": "hmac", "header", "encoding": "hex"|"base64", "secret"} or
    # {"type": "standard", "secret"}; null: anyone with the URL may post.
    Column("verify", OptionalJSON),
    Column("dedup_header", String(100)),
    Column("rate_limit", Integer, nullable=False),
    _at("created_at"),
    Index(None, "workspace_id", "mode", "id"),
)

inbound_dedup = Table(
    "inbound_dedup",
    metadata,
    _id("hook_id"),
    Column("delivery_key", String(200), primary_key=True),
    _ref("run_id"),
    _at("created_at"),
    Index(None, "run_id"),  # pruned with their runs
)

schedules = Table(
    "schedules",
    metadata,
    _id(),
    *_scope(),
    _ref("flow_id"),
    Column("cron", String(120), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("payload", JSONType, nullable=False),
    Column("enabled", Boolean, nullable=False),
    _at("next_run_at"),
    _at("created_at"),
    _at("updated_at"),
    Index(None, "workspace_id", "mode", "id"),
    _partial_index("ix_schedules_due", "next_run_at", "enabled"),
)

signals = Table(
    "signals",
    metadata,
    _id(),
    *_scope(),
    Column("name", String(200), nullable=False),
    Column("data", JSONType, nullable=False),
    # A signal sent to one run (``POST /flows/runs/{id}/signal``); null: a broadcast.
    _ref("run_id", required=False),
    # The sender's own ``id``: the same again is the same signal.
    Column("dedup_key", String(255)),
    _at("created_at"),
    UniqueConstraint("workspace_id", "mode", "dedup_key"),
    # what a run reaching a ``wait`` looks for: the signals of its name since it was queued
    Index(None, "workspace_id", "mode", "name", "created_at"),
    Index(None, "run_id"),
    Index(None, "created_at"),  # pruned by age
)

waits = Table(
    "waits",
    metadata,
    # One row per ``wait`` step a run has reached: the mailbox a signal resolves.
    Column("run_id", IdType(), primary_key=True),
    Column("idx", Integer, primary_key=True),
    *_scope(),
    Column("name", String(200), nullable=False),
    # The step's ``match`` fields (sorted, comma-separated) and the digest of their values:
    # a signal matches when its data's values of those fields have the same digest.
    Column("match_keys", Text, nullable=False),
    Column("match_digest", String(64), nullable=False),
    _at("created_at"),
    _at("until", required=False),
    Column("signal_id", IdType()),
    _at("resolved_at", required=False),
    Index(
        "ix_waits_open",
        "workspace_id",
        "mode",
        "name",
        "match_keys",
        "match_digest",
        postgresql_where=text("resolved_at IS NULL"),
        sqlite_where=text("resolved_at IS NULL"),
    ),
)

approvals = Table(
    "approvals",
    metadata,
    # One row per ``approval`` step a run has reached, and its decision once made.
    Column("run_id", IdType(), primary_key=True),
    Column("idx", Integer, primary_key=True),
    *_scope(),
    Column("step_id", String(64), nullable=False),
    # SHA-256 of the approve and reject links' secrets (the links are single use)
    Column("approve_hash", String(64), nullable=False, unique=True),
    Column("reject_hash", String(64), nullable=False, unique=True),
    Column("message", Text, nullable=False),
    _at("created_at"),
    _at("expires_at", required=False),
    Column("decision", String(16)),  # approved, rejected, timeout
    Column("decided_by", String(200)),
    Column("comment", Text),
    _at("decided_at", required=False),
)

tasks = Table(
    "tasks",
    metadata,
    # One row per ``task`` step a run has reached: the work a worker in the team's own code
    # claims, heartbeats and finishes (flowhook.store.tasks; docs/workers.md).
    _id("task_id"),
    *_scope(),
    Column("task", String(200), nullable=False),
    # The run row that holds the step (a part's own id inside a branch or item), the step's
    # index there, and the run people see (the same, or the part's top-level run).
    _ref("run_id"),
    Column("idx", Integer, nullable=False),
    _ref("root_run_id"),
    _ref("flow_id"),
    Column("step_id", String(64), nullable=False),
    Column("input", OptionalJSON),
    # queued (claimable from available_at), running (held by worker_id until
    # lease_expires_at), completed, failed (the attempt's error; the engine decides on a retry)
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    # attempts whose worker stopped heartbeating (taken back and offered again)
    Column("interrupted", OptionalJSON),
    _at("available_at"),
    Column("worker_id", String(200)),
    _at("lease_expires_at", required=False),
    _at("attempt_deadline", required=False),
    Column("heartbeat_seconds", Float, nullable=False),
    Column("timeout_seconds", Float),
    Column("retryable", Boolean, nullable=False, server_default=false()),
    Column("output", OptionalJSON),
    Column("error", OptionalJSON),
    Column("traceparent", String(55)),
    _at("created_at"),
    _at("claimed_at", required=False),
    _at("finished_at", required=False),
    UniqueConstraint("run_id", "idx"),
    # what a claim reads: each name's claimable tasks, oldest first
    Index(
        "ix_tasks_ready",
        "workspace_id",
        "mode",
        "task",
        "available_at",
        postgresql_where=text("status = 'queued'"),
        sqlite_where=text("status = 'queued'"),
    ),
    # leases that run out: their tasks are offered again
    Index(
        "ix_tasks_leased",
        "workspace_id",
        "mode",
        "lease_expires_at",
        postgresql_where=text("status = 'running'"),
        sqlite_where=text("status = 'running'"),
    ),
    Index(None, "root_run_id"),
)

workers = Table(
    "workers",
    metadata,
    # The workers seen lately (each claim says who it is and which tasks it runs).
    Column("worker_id", String(200), primary_key=True),
    Column("workspace_id", IdType(), primary_key=True),
    Column("mode", String(8), primary_key=True),
    Column("tasks", JSONType, nullable=False),
    _at("last_seen_at"),
    Index(None, "workspace_id", "mode", "last_seen_at"),
)

retention_marks = Table(
    "retention_marks",
    metadata,
    # How far a retention pass has got, by name (``events_cleared``: the event id below which
    # delivered events' bodies and their attempts' response excerpts were cleared), so the
    # next pass starts there instead of reading the history again.
    Column("name", String(40), primary_key=True),
    Column("value", String(64), nullable=False),
)

step_secrets = Table(
    "step_secrets",
    metadata,
    # Values ``{{ secrets.NAME }}`` gives an http step, sealed by store/crypto.py. ``id`` is
    # random (not shown anywhere): what `flowhook secrets rotate` pages through.
    Column("id", String(32), primary_key=True),
    *_scope(),
    Column("name", String(64), nullable=False),
    Column("value", Text, nullable=False),
    _at("created_at"),
    _at("updated_at"),
    UniqueConstraint("workspace_id", "mode", "name"),
)
