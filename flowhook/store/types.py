"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, DateTime, String
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from flowhook.ids import pack_id, unpack_id

__all__ = [
    "IdType",
    "UTCDateTime",
    "JSONType",
    "OptionalJSON",
    "json_has_nul",
    "to_micros",
    "from_micros",
    "stored_datetime",
    "HELD",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HELD = datetime(9999, 1, 1, tzinfo=UTC)
"""The due time of a row held back until something releases it: never (a run waiting for a
concurrency slot or behind a sibling part, a FIFO endpoint's delivery behind a pending one)."""
_MICROSECOND = timedelta(microseconds=1)


def to_micros(value: datetime) -> int:
    """``value`` (timezone-aware) as the integer microseconds since the Unix epoch (UTC)
    that SQLite stores, exactly."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the store")
    return (value - EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """Integer microseconds since the Unix epoch as an aware UTC datetime, exactly."""
    return EPOCH + timedelta(microseconds=value)


def stored_datetime(value: int | str | None) -> datetime | None:
    """A timestamp as SQLite holds it, made an aware UTC datetime: integer microseconds
    (migration 0021 on), or the text ``2026-11-25 10:27:10.438197`` (naive UTC) that
    SQLAlchemy stored before it, which a migration older than 0021 may still read."""
    if value is None:
        return None
    if isinstance(value, int):
        return EPOCH + timedelta(microseconds=value)
    found = datetime.fromisoformat(value)
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)


class _SQLiteMicros(sqlite.DATETIME):
    """SQLite's ``DATETIME`` column (so the schema is what it was: the declared type, its
    NUMERIC affinity keeps integers as integers) whose values :class:`UTCDateTime` has
    already made integers: no processing of its own."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> None:
        return None

    def literal_processor(self, dialect: Dialect) -> Callable[[Any], str]:
        return str


_SQLITE_IMPL = _SQLiteMicros()  # type: ignore[no-untyped-call]  # SQLAlchemy: untyped __init__


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python; ``timestamptz`` on PostgreSQL; on SQLite an 8-byte
    integer of microseconds since the Unix epoch (a ``DATETIME`` column).

    SQLite stored SQLAlchemy's 26 characters of text (``2026-11-25 10:27:10.438197``) before
    migration 0021; an integer is 8 bytes in the row and in every index entry holding it,
    sorts and compares the same, and converts in a fraction of the time. Never mix the two
    in one column: SQLite sorts every integer before any text."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return _SQLITE_IMPL
        return super().load_dialect_impl(dialect)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if dialect.name == "sqlite":
            return to_micros(value)
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        return value.astimezone(UTC)

    def process_literal_param(self, value: datetime | None, dialect: Dialect) -> Any:
        return self.process_bind_param(value, dialect)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.__class__ is int:  # SQLite
            return EPOCH + timedelta(microseconds=value)
        if isinstance(value, datetime):  # PostgreSQL
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return stored_datetime(value)  # SQLite's text of before 0021 (an older migration)


class _Stored(TypeEngine[Any]):
    """A column type whose values :class:`IdType` has already made bytes: no processing."""

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> None:
        return None


class _SQLiteId(_Stored, String):
    """SQLite's ``VARCHAR(40)`` column, as the id columns were declared before migration
    0023 (a TEXT affinity keeps a blob a blob), so no table is rebuilt."""


class _PostgresId(_Stored, postgresql.BYTEA):
    """PostgreSQL's ``bytea``."""


class IdType(TypeDecorator[str]):
    """An id (``run_01jd7w…``) in Python; in the database the bytes of
    :func:`flowhook.ids.pack_id`: 17 for an id of ``new_id`` instead of its ~30 characters,
    in each row and each index entry holding it (migration 0023). Ids of one prefix sort as
    their text does, so cursors and ``ORDER BY`` are unchanged; a malformed id from a
    request is stored (and compared) as byte 0 then its text, which matches no id."""

    impl = String(40)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return _SQLITE_ID
        return _POSTGRES_ID

    def bind_processor(self, dialect: Dialect) -> Callable[[str | None], bytes | None]:
        return _packed  # process_bind_param's work without TypeDecorator's wrapper around it

    def result_processor(
        self, dialect: Dialect, coltype: object
    ) -> Callable[[bytes | None], str | None]:
        return _unpacked

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else pack_id(value)

    def process_literal_param(self, value: str | None, dialect: Dialect) -> Any:
        raise NotImplementedError("ids are bound as parameters, never written into SQL")

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else unpack_id(value)


def _packed(value: str | None) -> bytes | None:
    return None if value is None else pack_id(value)


def _unpacked(value: bytes | None) -> str | None:
    return None if value is None else unpack_id(value)


_SQLITE_ID = _SQLiteId(40)
_POSTGRES_ID = _PostgresId()


JSONType = JSON().with_variant(postgresql.JSONB(), "postgresql")

OptionalJSON = JSON(none_as_null=True).with_variant(
    postgresql.JSONB(none_as_null=True), "postgresql"
)
"""A JSON column that may be empty: ``None`` is SQL ``NULL`` (no bytes but a bit of the row's
null bitmap), not the JSON text ``null`` that :data:`JSONType` writes (5 bytes on SQLite, 9 in
a ``jsonb``): a run's error and each step's error and interruption are empty on almost every
run. Both read back as ``None``, so rows written before are read the same."""


def json_default(value: Any) -> Any:  # pragma: no cover - orjson handles what we store
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
"""``\\u0000`` as orjson writes a NUL character (an even run of backslashes before it is text)."""


def json_has_nul(encoded: bytes) -> bool:
    """Whether JSON text holds the NUL character, which PostgreSQL's ``jsonb`` cannot keep
    (refused on SQLite too, so a flow behaves the same on both)."""
    return encoded.find(b"\\u0000") >= 0 and _NUL.search(encoded) is not None
