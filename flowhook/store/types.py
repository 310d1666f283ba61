"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

__all__ = ["UTCDateTime", "JSONType", "json_has_nul"]


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python; ``timestamptz`` on PostgreSQL, sortable text on SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(postgresql.JSONB(), "postgresql")


def json_default(value: Any) -> Any:  # pragma: no cover - orjson handles what we store
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
"""``\\u0000`` as orjson writes a NUL character (an even run of backslashes before it is text)."""


def json_has_nul(encoded: bytes) -> bool:
    """Whether JSON text holds the NUL character, which PostgreSQL's ``jsonb`` cannot keep
    (refused on SQLite too, so a flow behaves the same on both)."""
    return encoded.find(b"\\u0000") >= 0 and _NUL.search(encoded) is not None
