"""SQLite timestamps as integer microseconds since the Unix epoch, not text

Revision ID: 0021
Revises: 0020

SQLAlchemy stores a ``DateTime`` on SQLite as 26 characters of text (``2026-11-25
10:27:10.438197``, naive UTC); :class:`flowhook.store.types.UTCDateTime` now stores the
integer microseconds since 1970-01-01 UTC instead, 8 bytes (SQLite's record header says
"8-byte integer"), in the row and in each index entry holding it: about 18 bytes less per
timestamp: 22 in the rows of a typical run, and the index entries holding one. Integers sort and compare as the text did, so
every index and query stays as it is. The columns keep their declared type (``DATETIME``,
NUMERIC affinity, which keeps an integer an integer), so no table is rebuilt.

Here every text value of every ``DATETIME`` column of every table becomes its integer,
exactly (microseconds kept). A value in the form SQLAlchemy writes is converted in SQL, one
``UPDATE`` per table; any other text (no fraction, a date alone, a ``T`` or an offset, as a
hand-made row or an old default may hold) is parsed in Python, naive taken as UTC. No text
must be left: SQLite sorts every integer before any text, so one leftover would be out of
order in its index and in every comparison; the migration checks and stops if one is.
PostgreSQL (``timestamptz``) is left as it is.

Measured on a database of 100,000 runs of bench/storage.py's typical run (three steps, five
events, a delivery and its attempt: 2.2 million timestamps, a 424 MB file), ``flowhook
migrate`` on a 2-core machine: 8 to 11 s, so about a minute and a half per million runs,
holding the write lock meanwhile. The rows shrink in place; the pages they free stay in the
file as free pages until ``flowhook vacuum`` (or incremental auto-vacuum) gives them back.

Downgrade writes the text back, in the form SQLAlchemy writes it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_D = "[0-9]"
_STANDARD = f"{_D * 4}-{_D * 2}-{_D * 2} {_D * 2}:{_D * 2}:{_D * 2}.{_D * 6}"
"""A GLOB pattern of SQLAlchemy's text: ``YYYY-MM-DD HH:MM:SS.ffffff``."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def timestamp_columns(bind: Any) -> dict[str, list[str]]:
    """Each table's columns declared ``DATETIME`` (every :class:`UTCDateTime` column, and
    nothing else), by table, as the database itself lists them."""
    names = bind.exec_driver_sql(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        " ORDER BY name"
    ).scalars()
    found: dict[str, list[str]] = {}
    for table in list(names):
        info = bind.exec_driver_sql(f"PRAGMA table_info({_quoted(table)})").all()
        columns = [row[1] for row in info if str(row[2]).upper() == "DATETIME"]
        if columns:
            found[table] = columns
    return found


def _micros(text: str) -> int:
    """Any ISO 8601 text ``datetime.fromisoformat`` reads (naive: UTC) as integer µs."""
    value = datetime.fromisoformat(text)
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return (value - _EPOCH) // _MICROSECOND


def _text(micros: int) -> str:
    """Integer µs as SQLAlchemy's SQLite text (naive UTC, always six fraction digits)."""
    value = _EPOCH + timedelta(microseconds=micros)
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _convert(bind: Any, table: str, columns: list[str], kind: str, how: tuple[str, str]) -> None:
    """Rewrite, in one ``UPDATE`` of ``table``, each of ``columns`` whose value is of type
    ``kind`` (SQLite's ``typeof``) and meets the guard ``how[0]``, as ``how[1]`` computes it
    (in both, ``{c}`` is the column)."""
    sets = []
    for c in columns:
        q = _quoted(c)
        guard, value = (part.format(c=q) for part in how)
        sets.append(f"{q} = CASE WHEN typeof({q}) = '{kind}' AND {guard} THEN {value} ELSE {q} END")
    where = " OR ".join(f"typeof({_quoted(c)}) = '{kind}'" for c in columns)
    bind.exec_driver_sql(f"UPDATE {_quoted(table)} SET {', '.join(sets)} WHERE {where}")


def _leftovers(bind: Any, table: str, column: str, kind: str) -> list[Any]:
    q = _quoted(column)
    return list(
        bind.exec_driver_sql(
            f"SELECT DISTINCT {q} FROM {_quoted(table)} WHERE typeof({q}) = '{kind}'"
        ).scalars()
    )


def _set(bind: Any, table: str, column: str, kind: str, old: Any, new: Any) -> None:
    q = _quoted(column)
    bind.exec_driver_sql(
        f"UPDATE {_quoted(table)} SET {q} = ? WHERE typeof({q}) = '{kind}' AND {q} = ?",
        (new, old),
    )


_TO_MICROS = (
    "{c} GLOB '" + _STANDARD + "' AND strftime('%s', substr({c}, 1, 19)) IS NOT NULL",
    "CAST(strftime('%s', substr({c}, 1, 19)) AS INTEGER) * 1000000"
    " + CAST(substr({c}, 21, 6) AS INTEGER)",
)
"""SQLAlchemy's text as integer µs: the whole seconds from SQLite's date functions, given
the text without its fraction (they keep milliseconds and round: ``…:54.999906`` would be
second 55), then the six fraction digits."""

_FRACTION = "(({c} % 1000000) + 1000000) % 1000000"  # floor modulo: right before 1970 too
_TO_TEXT = (
    "{c} BETWEEN -62135596800000000 AND 253402300799999999",  # years 1 to 9999
    "strftime('%Y-%m-%d %H:%M:%S', ({c} - " + _FRACTION + ") / 1000000, 'unixepoch')"
    " || '.' || printf('%06d', " + _FRACTION + ")",
)
"""Integer µs as SQLAlchemy's text (naive UTC, six fraction digits)."""


_TEXT_DEFAULT = "due_at DATETIME DEFAULT '1970-01-01 00:00:00'"
_MICROS_DEFAULT = "due_at DATETIME DEFAULT 0"


def _due_at_default(bind: Any, old: str, new: str) -> None:
    """Migration 0008 added ``due_at`` to ``runs`` and ``deliveries`` with a constant text
    default, which SQLite keeps in the table's schema (a row written before it reads the
    default; a row inserted without the column would get it): changed to the same instant
    as an integer, in the schema's text, as SQLite's documentation allows for a change of
    default (``PRAGMA writable_schema``, then a new schema version; the records are not
    touched). Rows written before 0008 then read the integer default and need no rewrite."""
    found = bind.exec_driver_sql(
        "SELECT name, sql FROM sqlite_schema WHERE type = 'table'"
        " AND name IN ('runs', 'deliveries')"
    ).all()
    changed = [(name, sql.replace(old, new)) for name, sql in found if sql.count(old) == 1]
    if not changed:
        return
    version = int(bind.exec_driver_sql("PRAGMA schema_version").scalar())
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        for name, sql in changed:
            bind.exec_driver_sql(
                "UPDATE sqlite_schema SET sql = ? WHERE type = 'table' AND name = ?", (sql, name)
            )
        bind.exec_driver_sql(f"PRAGMA schema_version = {version + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _due_at_default(bind, _TEXT_DEFAULT, _MICROS_DEFAULT)
    for table, columns in timestamp_columns(bind).items():
        _convert(bind, table, columns, "text", _TO_MICROS)
        for column in columns:
            for text in _leftovers(bind, table, column, "text"):
                try:
                    micros = _micros(text)
                except ValueError as exc:
                    raise RuntimeError(
                        f"0021: {table}.{column} holds {text!r}, which is not a timestamp;"
                        " correct or delete that row, then migrate again"
                    ) from exc
                _set(bind, table, column, "text", text, micros)
            left = _leftovers(bind, table, column, "text")
            if left:  # pragma: no cover - every text value was converted above
                raise RuntimeError(f"0021: {table}.{column} still holds text: {left[:3]!r}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    _due_at_default(bind, _MICROS_DEFAULT, _TEXT_DEFAULT)
    for table, columns in timestamp_columns(bind).items():
        _convert(bind, table, columns, "integer", _TO_TEXT)
        for column in columns:  # pragma: no cover - Python's datetimes are years 1 to 9999
            for micros in _leftovers(bind, table, column, "integer"):
                _set(bind, table, column, "integer", micros, _text(micros))
