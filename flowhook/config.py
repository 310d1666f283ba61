"""Settings: one object, read from ``FLOWHOOK_*`` and flags, passed down from the CLI or app."""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flowhook.defaults import (
    WEBHOOK_DISABLE_AFTER_DAYS,
    WEBHOOK_MAX_ATTEMPTS,
    WEBHOOK_RETRY_SCHEDULE,
    WEBHOOK_TIMEOUT,
)

__all__ = ["Settings", "database_backend", "parse_duration", "parse_schedule"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_BACKENDS = {"sqlite": "sqlite", "postgresql": "postgresql", "postgres": "postgresql"}
"""The schemes ``FLOWHOOK_DATABASE_URL`` accepts (any ``+driver`` aside), and the backend
each names."""


def parse_duration(text: str) -> float:
    """Seconds in ``"90"``, ``"90s"``, ``"15m"``, ``"24h"`` or ``"5d"``."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:])
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use seconds, or 15m, 24h, 5d)") from None
    if seconds < 0:
        raise ValueError("a duration must not be negative")
    return seconds


def parse_schedule(text: str) -> tuple[float, ...]:
    """``"30,120,600,3600"`` → seconds; raises ValueError on anything else."""
    values = tuple(float(part) for part in text.split(",") if part.strip())
    if not values or any(v < 0 for v in values):
        raise ValueError("a comma-separated list of non-negative seconds, such as 30,120,600,3600")
    return values


def database_backend(url: str) -> str:
    """The backend a database URL names (``sqlite`` or ``postgresql``); raises ValueError
    for a URL the setting does not accept."""
    scheme, sep, _rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {url!r}")
    base = scheme.split("+", 1)[0]
    if base not in _BACKENDS:
        raise ValueError(f"unsupported database {base!r}: use sqlite:///path or postgresql://…")
    return _BACKENDS[base]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWHOOK_", extra="ignore")

    database_url: str = "sqlite:///./flowhook.db"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    """0: `flowhook serve` binds a free port and prints it (``listening on http://…``)."""
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024)
    log_level: str = "info"
    log_format: str = Field(default="auto", pattern="^(auto|json|text)$")
    """``auto``: lines a person reads on a terminal, JSON lines anywhere else."""
    public_url: str | None = None
    """The base URL people reach this service at (for inbound hook URLs); default: the request's."""

    # Engine
    worker_concurrency: int = Field(default=64, ge=1)
    lease_seconds: float = Field(default=30.0, gt=0)
    poll_interval: float = Field(default=5.0, gt=0)
    """Fallback poll when no wake-up arrives; wake-ups make idle runs start at once."""

    max_claims: int = Field(default=5, ge=1)
    """A run claimed this many times without finishing or pausing (its workers keep dying)
    ends failed with error type worker_lost."""
    plugins: str = ""
    """Comma-separated modules whose @flowhook.step functions python steps may call."""
    allow_private_targets: bool = False
    """Let http steps and webhooks reach loopback and private addresses (development, tests)."""
    max_step_output_bytes: int = Field(default=256 * 1024, ge=1024)
    """Largest step output (as JSON) stored; a step whose output is larger fails."""
    max_map_items: int = Field(default=1000, ge=1, le=100_000)
    """The longest list a ``map`` step takes; a longer one fails the step."""
    max_run_tree: int = Field(default=10_000, ge=1)
    """Runs that ``flow`` steps may start under one top-level run, at any depth and counting
    those that ended; past it the ``flow`` step fails (``run_tree_exhausted``)."""

    # Webhooks (SPEC §8): retry schedule in seconds, attempts in all, request timeout.
    webhook_retry_schedule: str = ",".join(f"{s:g}" for s in WEBHOOK_RETRY_SCHEDULE)
    webhook_max_attempts: int = Field(default=WEBHOOK_MAX_ATTEMPTS, ge=1, le=50)
    webhook_timeout: float = Field(default=WEBHOOK_TIMEOUT, gt=0, le=300)
    webhook_disable_after: str = f"{WEBHOOK_DISABLE_AFTER_DAYS}d"
    """Disable an endpoint that had nothing but failures for this long (s, m, h or d)."""
    webhook_secret_grace: str = "24h"  # noqa: S105 - a duration, not a secret
    """How long a rotated-out secret still signs (``webhook-signature`` carries both)."""
    webhook_endpoint_concurrency: int = Field(default=16, ge=1)
    """Webhook requests in flight to one endpoint from one process, at most: an endpoint
    gets them while it answers 2xx within a second; a slow or failing one gets 8 (or this,
    if lower). See ``webhooks/slots.py``."""
    webhook_retry_throttled: bool = False
    """Retry 408 and 429 answers, honouring Retry-After (off: the spec says 4xx is final)."""
    dispatcher_concurrency: int = Field(default=64, ge=1)

    http_keep_alive: float = Field(default=75.0, gt=0, le=3600)
    """Seconds the API keeps an idle keep-alive connection open. Longer than common clients
    keep theirs (httpx 5 s, aiohttp 15 s), so a client drops an idle connection before the
    server does: a request sent on a connection the server is closing at that moment would be
    reset (``bench/ka_probe.py``)."""
    shutdown_grace: float = Field(default=30.0, ge=0)
    """On SIGTERM: seconds for work in flight to finish before it is handed back."""
    retention_days: float = Field(default=30.0, gt=0)
    """Finished runs (with their steps, events and deliveries) older than this are pruned."""
    disk_budget_mb: int | None = None
    """Megabytes (MiB) the database may take; unset: no budget. Past it, retention deletes the
    oldest finished runs ahead of their age until it is under 90 % of it, and gives the space
    back (``service/disk.py``)."""
    delivery_retention_days: float = Field(default=7.0, gt=0)
    """Delivered events' bodies and their attempts' response excerpts are cleared after this
    (events a pending or failed delivery still needs keep theirs until the run goes)."""
    max_active_runs_per_workspace: int = Field(default=100_000, ge=0)
    """Queued and running runs one workspace may have in each mode; executes past it answer
    429 with Retry-After. 0 turns the cap off."""
    rate_limit: float = Field(default=1000.0, ge=0)
    """API requests a second per key (token bucket, bursts of twice that); 0 turns it off."""

    # Live event streams (Server-Sent Events)
    stream_heartbeat: float = Field(default=15.0, gt=0, le=3600)
    """Seconds between comment lines on an idle stream (proxies close silent connections)."""
    max_streams_per_key: int = Field(default=100, ge=1)
    """Streams one API key may hold open on one API process; more answer 429."""
    stream_write_timeout: float = Field(default=30.0, gt=0, le=3600)
    """Seconds a stream's client may take no bytes before it is dropped."""
    stream_queue: int = Field(default=1000, ge=1)
    """Events a stream may have waiting for a slow client; past that it is closed."""
    stream_poll_interval: float = Field(default=1.0, gt=0, le=60)
    """Seconds between the streams' catch-up reads when no commit announces new events (on
    SQLite, how soon events written by another process reach the streams)."""

    # Schedules
    min_schedule_seconds: int = Field(default=60, ge=1)
    """The shortest time a schedule's cron may leave between two ticks."""
    max_schedules: int = Field(default=100, ge=1)
    """Schedules a workspace may have in each mode (test, live)."""

    # Authentication cache: how long a looked-up key is trusted before it is checked again
    # (revocations clear it in every process within a second, whatever this says).
    key_cache_seconds: float = Field(default=30.0, ge=0)

    secret_key: SecretStr | None = None
    """Keys that encrypt endpoint and hook secrets at rest: comma-separated, newest first,
    each 44 characters (``flowhook secrets generate-key``). Unset: a key file beside a SQLite
    database; PostgreSQL needs it (checked at start, by ``flowhook.store.crypto``)."""
    secure_cookies: bool = False
    """Mark the settings screen's session cookie ``Secure`` even when the request reached us
    over plain http (TLS ends at a proxy uvicorn does not trust for X-Forwarded-Proto)."""
    metrics_token: SecretStr | None = None
    """When set, ``/metrics`` answers only ``Authorization: Bearer <this token>``."""

    otel_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "otel_endpoint"
        ),
    )
    """OpenTelemetry's own variable (no ``FLOWHOOK_`` prefix): with the ``otel`` extra
    installed, spans are exported over OTLP/HTTP there (flowhook/tracing.py)."""

    # SQLite durability: FULL syncs every commit (safe against power loss), NORMAL only
    # against a crash of the process.
    sqlite_synchronous: str = "FULL"

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        database_backend(value)
        return value

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        parse_schedule(value)
        return value

    @field_validator("webhook_disable_after", "webhook_secret_grace")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("disk_budget_mb", mode="before")
    @classmethod
    def _budget(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None  # FLOWHOOK_DISK_BUDGET_MB= (empty): no budget, as unset
        text = str(value).strip()
        if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
            raise ValueError(
                f"FLOWHOOK_DISK_BUDGET_MB must be a whole number of megabytes, 1 or more "
                f"(such as 500); got {value!r}"
            )
        return int(text)

    @property
    def disk_budget_bytes(self) -> int | None:
        return None if self.disk_budget_mb is None else self.disk_budget_mb * 1024 * 1024

    @property
    def retry_schedule(self) -> tuple[float, ...]:
        return parse_schedule(self.webhook_retry_schedule)

    @field_validator("sqlite_synchronous")
    @classmethod
    def _known_sync(cls, value: str) -> str:
        if value.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError("must be one of OFF, NORMAL, FULL, EXTRA")
        return value.upper()

    @property
    def plugin_modules(self) -> list[str]:
        return [m.strip() for m in self.plugins.split(",") if m.strip()]
