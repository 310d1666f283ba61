"""Settings: one object, read from ``FLOWHOOK_*`` and flags, passed down from the CLI or app."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "async_database_url"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLOWHOOK_", extra="ignore")

    database_url: str = "sqlite:///./flowhook.db"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024)
    log_level: str = "info"

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

    # Authentication cache: how long a looked-up key is trusted before it is checked again.
    key_cache_seconds: float = Field(default=30.0, ge=0)

    # SQLite durability: FULL syncs every commit (safe against power loss), NORMAL only
    # against a crash of the process.
    sqlite_synchronous: str = "FULL"

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        async_database_url(value)
        return value

    @field_validator("sqlite_synchronous")
    @classmethod
    def _known_sync(cls, value: str) -> str:
        if value.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError("must be one of OFF, NORMAL, FULL, EXTRA")
        return value.upper()

    @property
    def plugin_modules(self) -> list[str]:
        return [m.strip() for m in self.plugins.split(",") if m.strip()]

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def async_database_url(url: str) -> str:
    """Map a user's URL to the async driver SQLAlchemy needs (``sqlite://`` → aiosqlite)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {url!r}")
    base = scheme.split("+", 1)[0]
    if base == "sqlite":
        return f"sqlite+aiosqlite://{rest}"
    if base in {"postgresql", "postgres"}:
        return f"postgresql+asyncpg://{rest}"
    raise ValueError(f"unsupported database {base!r}: use sqlite:///path or postgresql://…")
