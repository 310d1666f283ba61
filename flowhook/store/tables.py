"""The schema, declared once; Alembic migrations must produce exactly this (a test checks)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from flowhook.store.types import JSONType, UTCDateTime

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
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

workspaces = Table(
    "workspaces",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("created_at", UTCDateTime(), nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("workspace_id", String(40), ForeignKey("workspaces.id"), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("prefix", String(24), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("revoked_at", UTCDateTime()),
)

flows = Table(
    "flows",
    metadata,
    Column("flow_id", String(40), primary_key=True),
    Column("workspace_id", String(40), ForeignKey("workspaces.id"), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("name", String(200), nullable=False),
    Column("version", Integer, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("archived_at", UTCDateTime()),
    Index(None, "workspace_id", "mode", "flow_id"),
)

flow_versions = Table(
    "flow_versions",
    metadata,
    Column("flow_id", String(40), ForeignKey("flows.flow_id"), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("definition", JSONType, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(40), primary_key=True),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("flow_id", String(40), nullable=False),
    Column("flow_version", Integer, nullable=False),
    Column("trigger", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("payload", JSONType, nullable=False),
    Column("output", JSONType),
    Column("error", JSONType),
    Column("steps_executed", Integer, nullable=False, server_default=text("0")),
    Column("next_step", Integer, nullable=False, server_default=text("0")),
    Column("queued_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    Column("duration_ms", BigInteger),
    # Queue columns: a run is claimable while queued or running and available_at has passed
    # and no live lease holds it.
    Column("available_at", UTCDateTime(), nullable=False),
    # When the run last fell due (queued, woken from a delay or a backoff): claims and
    # heartbeats move available_at, never this, so a run claimed again after its lease ended
    # is taken in its place instead of behind the work queued meanwhile.
    Column("due_at", UTCDateTime(), nullable=False),
    Column("lease_owner", String(64)),
    Column("lease_expires_at", UTCDateTime()),
    Column("claims", Integer, nullable=False, server_default=text("0")),
    Column("cancel_requested_at", UTCDateTime()),
    Column("idempotency_key", String(255)),
    Column("request_hash", String(64)),
    UniqueConstraint("workspace_id", "mode", "idempotency_key"),
    Index(
        "ix_runs_claimable",
        "available_at",
        postgresql_where=text("status IN ('queued', 'running')"),
        sqlite_where=text("status IN ('queued', 'running')"),
    ),
    Index(
        "ix_runs_due_at",
        "due_at",
        postgresql_where=text("status IN ('queued', 'running')"),
        sqlite_where=text("status IN ('queued', 'running')"),
    ),
    Index(None, "workspace_id", "mode", "run_id"),
    Index(None, "flow_id", "run_id"),
)

run_steps = Table(
    "run_steps",
    metadata,
    Column("run_id", String(40), ForeignKey("runs.run_id"), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("step_id", String(64), nullable=False),
    Column("type", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("started_at", UTCDateTime()),
    Column("finished_at", UTCDateTime()),
    Column("duration_ms", BigInteger),
    Column("output", JSONType),
    Column("error", JSONType),
    # The numbers of the attempts that started and never recorded an outcome (the process
    # died, or the run was cancelled meanwhile); null when none.
    Column("interrupted", JSONType),
)

events = Table(
    "events",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("type", String(40), nullable=False),
    Column("flow_id", String(40)),
    Column("run_id", String(40)),
    Column("created_at", UTCDateTime(), nullable=False),
    # The exact bytes that are signed and sent: every attempt and replay sends these.
    Column("body", LargeBinary, nullable=False),
    Index(None, "run_id", "id"),
    Index(None, "workspace_id", "mode", "id"),
)

webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("url", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("enabled", Boolean, nullable=False),
    Column("disabled_reason", Text),
    # The signing secret (whsec_…), sealed by store/crypto.py: readable to sign with.
    Column("secret", Text, nullable=False),
    Column("previous_secret", Text),
    Column("previous_secret_expires_at", UTCDateTime()),
    Column("failing_since", UTCDateTime()),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index(None, "workspace_id", "mode", "id"),
)

endpoint_events = Table(
    "endpoint_events",
    metadata,
    Column(
        "endpoint_id",
        String(40),
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("event", String(40), primary_key=True),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("event_id", String(40), nullable=False),
    Column("endpoint_id", String(40), nullable=False),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("event_type", String(40), nullable=False),
    Column("run_id", String(40)),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    # Due time while pending; moved to the lease's end while an attempt is under way.
    Column("next_attempt_at", UTCDateTime(), nullable=False),
    # When the current attempt fell due; claims do not move it, so a delivery claimed again
    # after its lease ended is taken in its place instead of behind the backlog.
    Column("due_at", UTCDateTime(), nullable=False),
    Column("lease_owner", String(64)),
    Column("lease_expires_at", UTCDateTime()),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    Column("replay_of", String(40)),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Index(
        "ix_deliveries_due",
        "next_attempt_at",
        postgresql_where=text("status = 'pending'"),
        sqlite_where=text("status = 'pending'"),
    ),
    Index(
        "ix_deliveries_due_at",
        "due_at",
        postgresql_where=text("status = 'pending'"),
        sqlite_where=text("status = 'pending'"),
    ),
    Index(None, "workspace_id", "mode", "id"),
    Index(None, "endpoint_id", "status", "created_at"),
    Index(None, "event_id"),
)

delivery_attempts = Table(
    "delivery_attempts",
    metadata,
    Column(
        "delivery_id", String(40), ForeignKey("deliveries.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("number", Integer, primary_key=True),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    Column("duration_ms", BigInteger),
    Column("address", String(100)),
    Column("status_code", Integer),
    Column("response_excerpt", Text),
    Column("error_class", String(32)),
    Column("error_detail", Text),
    Column("next_attempt_at", UTCDateTime()),
)

web_sessions = Table(
    "web_sessions",
    metadata,
    # SHA-256 of the cookie's random token: a leaked table cannot be replayed as cookies.
    Column("token_hash", String(64), primary_key=True),
    Column("key_id", String(40), nullable=False),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("csrf_token", String(64), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
)

inbound_hooks = Table(
    "inbound_hooks",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("flow_id", String(40), nullable=False),
    # {"type": "hmac", "header", "encoding": "hex"|"base64", "secret"} or
    # {"type": "standard", "secret"}; null: anyone with the URL may post.
    Column("verify", JSONType),
    Column("dedup_header", String(100)),
    Column("rate_limit", Integer, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "workspace_id", "mode", "id"),
)

inbound_dedup = Table(
    "inbound_dedup",
    metadata,
    Column("hook_id", String(40), primary_key=True),
    Column("delivery_key", String(200), primary_key=True),
    Column("run_id", String(40), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "run_id"),  # pruned with their runs
)

schedules = Table(
    "schedules",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("workspace_id", String(40), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("flow_id", String(40), nullable=False),
    Column("cron", String(120), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("payload", JSONType, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("next_run_at", UTCDateTime(), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index(None, "workspace_id", "mode", "id"),
    Index(
        "ix_schedules_due",
        "next_run_at",
        postgresql_where=text("enabled"),
        sqlite_where=text("enabled"),
    ),
)
