"""ids stored packed: 17 bytes (24 for a hook's secret id) instead of ~30 characters of text

Revision ID: 0023
Revises: 0022

Issue 20 (what a run costs on disk). A run's rows and index entries hold about 60 ids such
as ``run_01m89es1rzemqrhvwn9zytakky``: a prefix, ``_``, then 26 lower-case Crockford base-32
digits of a UUIDv7. :class:`flowhook.store.types.IdType` now stores each as the bytes of
:func:`flowhook.ids.pack_id`: the prefix's code (one byte of ``PACK_CODES``) then the 128-bit
number, 17 bytes; an id of ``new_secret_id`` (36 digits, 180 bits) is the code then 23
bytes; any other string (a malformed id, an unknown prefix) is byte 0 then its UTF-8. Ids of
one prefix sort as their text does, so every index, cursor and ``ORDER BY`` stays as it is.

Here every id column listed in :data:`COLUMNS` (listed, not read from ``tables.py``, so a
later change of the tables cannot change what this revision does) is rewritten in that form,
by a copy of the codec made for this revision (:func:`pack` and :func:`unpack`, the same
bytes as ``flowhook.ids`` at the time, checked by ``tests/unit/test_compact_ids_codec.py``).

- SQLite: the columns keep their declared type (``VARCHAR(40)``: TEXT affinity keeps a blob
  a blob), so no table is rebuilt; one ``UPDATE`` per table rewrites the text values through
  a Python function registered on the connection, and leaves a blob (a row written packed
  already) and NULL as they are, so running it again changes nothing. Foreign keys are
  enforced on Flowhook's connections: they are deferred to the commit
  (``PRAGMA defer_foreign_keys``), by which time parents and children are both packed.
- PostgreSQL: each column becomes ``bytea`` (``ALTER COLUMN … TYPE bytea USING``) through a
  temporary function (``pg_temp``) that computes the same bytes in SQL; the foreign keys
  between those columns are dropped first and made again from their saved definitions
  after; PostgreSQL rebuilds each table's indexes (unique and partial ones too) itself.

Measured on a 2-core machine with 20,000 typical runs of bench/storage.py (three steps, five
events, a delivery and its attempt: about 700,000 ids) written by the code of 0022, timing
``migrate`` to 0023 alone (two runs each, within 3 % of each other):

- SQLite: 1.9 s, about 95 s per million runs, holding the write lock meanwhile. The pages in
  use went from 3,653 bytes a run to 2,858 (-22 %); the file keeps its size (73 MB) until
  ``flowhook vacuum`` (or incremental auto-vacuum) gives the freed pages back.
- PostgreSQL: 7.5 s, about 6 minutes per million runs, with each table locked (ACCESS
  EXCLUSIVE) while it is rewritten; nearly all of it is the SQL function, ~10 µs an id
  (turning the base-32 digits into bits). The database went from 88 MB to 74 MB (the
  rewrite also drops dead rows, so not all of that is the ids).

Downgrade writes the text back (``VARCHAR(40)`` again on PostgreSQL): 2.4 s on SQLite and
19 s on PostgreSQL for the same 20,000 runs, the rows then equal to those before the upgrade.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

COLUMNS: dict[str, tuple[str, ...]] = {
    "approvals": ("run_id", "workspace_id"),
    "deliveries": ("id", "event_id", "endpoint_id", "workspace_id", "run_id", "replay_of"),
    "events": ("id", "workspace_id", "flow_id", "run_id"),
    "inbound_dedup": ("hook_id", "run_id"),
    "inbound_hooks": ("id", "workspace_id", "flow_id"),
    "runs": ("run_id", "workspace_id", "flow_id", "rerun_of", "parent_run_id", "root_run_id"),
    "schedules": ("id", "workspace_id", "flow_id"),
    "signals": ("id", "workspace_id", "run_id"),
    "waits": ("run_id", "workspace_id", "signal_id"),
    "web_sessions": ("key_id", "workspace_id"),
    "webhook_endpoints": ("id", "workspace_id"),
    "workspaces": ("id",),
    "api_keys": ("id", "workspace_id"),
    "delivery_attempts": ("delivery_id",),
    "endpoint_events": ("endpoint_id",),  # not ``event``: an event type's name
    "flows": ("flow_id", "workspace_id"),
    "run_steps": ("run_id",),
    "flow_versions": ("flow_id",),
}
"""Every id column at this revision, by table."""

# -- The codec, as flowhook.ids had it at this revision -------------------------------------

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_PREFIXES = ("att", "dlv", "ep", "evt", "hk", "key", "part", "run", "sch", "sig", "wf", "ws")
"""The prefixes in the order of their codes, 1 to 12 (alphabetical)."""
_CODES = {p: code for code, p in enumerate(_PREFIXES, start=1)}
_TAIL_PATTERN = "[0-7][0-9a-hjkmnp-tv-z]{25}|[0-9a-hjkmnp-tv-z]{36}"
_TAIL = re.compile(_TAIL_PATTERN)
_TO_PY32 = str.maketrans(_ALPHABET, "0123456789abcdefghijklmnopqrstuv")


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def pack(value: str) -> bytes:
    """``value`` packed: the prefix's code then 16 bytes (26 digits, the first 0 to 7) or 23
    (36 digits); anything else byte 0 then its UTF-8."""
    prefix, _, tail = value.partition("_")
    code = _CODES.get(prefix)
    if code is not None and _TAIL.fullmatch(tail) is not None:
        number = int(tail.translate(_TO_PY32), 32)
        return bytes((code,)) + number.to_bytes(16 if len(tail) == 26 else 23, "big")
    return b"\x00" + value.encode()


def unpack(stored: bytes) -> str:
    """The text :func:`pack` made ``stored`` from."""
    code = stored[0]
    if code == 0:
        return stored[1:].decode()
    number = int.from_bytes(stored[1:], "big")
    return f"{_PREFIXES[code - 1]}_{_base32(number, 26 if len(stored) == 17 else 36)}"


def _pack_text(value: Any) -> Any:
    """SQLite's ``flowhook_pack_id``: text packed, a blob (packed already) or NULL as given."""
    return pack(value) if isinstance(value, str) else value


def _unpack_blob(value: Any) -> Any:
    """SQLite's ``flowhook_unpack_id``: a blob unpacked, text or NULL as given."""
    return unpack(value) if isinstance(value, bytes) else value


# -- SQLite ---------------------------------------------------------------------------------


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite3(bind: Any) -> sqlite3.Connection:
    """The ``sqlite3`` connection under SQLAlchemy's (Flowhook's inline driver keeps it as
    ``raw``)."""
    driver = bind.connection.driver_connection
    raw = driver if isinstance(driver, sqlite3.Connection) else driver.raw
    assert isinstance(raw, sqlite3.Connection)
    return raw


def sqlite_convert(bind: Any, *, down: bool = False) -> None:
    """Each listed column's text packed (its blobs unpacked if ``down``), one ``UPDATE`` per
    table; values already in the target form are left alone, so it can run again."""
    kind, function = ("blob", "flowhook_unpack_id") if down else ("text", "flowhook_pack_id")
    raw = _sqlite3(bind)
    raw.create_function("flowhook_pack_id", 1, _pack_text, deterministic=True)
    raw.create_function("flowhook_unpack_id", 1, _unpack_blob, deterministic=True)
    # Parents and children change in one transaction; checked when it commits.
    bind.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
    for table, columns in COLUMNS.items():
        sets = ", ".join(
            f"{q} = CASE WHEN typeof({q}) = '{kind}' THEN {function}({q}) ELSE {q} END"
            for q in map(_quoted, columns)
        )
        where = " OR ".join(f"typeof({_quoted(c)}) = '{kind}'" for c in columns)
        bind.exec_driver_sql(f"UPDATE {_quoted(table)} SET {sets} WHERE {where}")


# -- PostgreSQL -----------------------------------------------------------------------------

_BITS = {ch: format(i, "05b") for i, ch in enumerate(_ALPHABET)}
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ<>[]{}"
"""A stand-in for each digit that no replacement's output (0s and 1s) contains."""


def _digits_as_bits(expr: str) -> str:
    """SQL: the base-32 digits of ``expr`` as text of 0s and 1s, 5 per digit (``translate``
    to stand-ins, then one ``replace`` per digit)."""
    sql = f"translate({expr}, '{_ALPHABET}', '{_LETTERS}')"
    for ch, letter in zip(_ALPHABET, _LETTERS, strict=True):
        sql = f"replace({sql}, '{letter}', '{_BITS[ch]}')"
    return sql


_PREFIX_ARRAY = "ARRAY[" + ", ".join(f"'{p}'" for p in _PREFIXES) + "]::text[]"

PG_PACK = f"""
CREATE OR REPLACE FUNCTION pg_temp.flowhook_pack_id(value text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
DECLARE
    cut int := strpos(value, '_');
    code int;
    tail text;
    bits text;
    hex text;
BEGIN
    IF cut = 0 THEN
        RETURN '\\x00'::bytea || convert_to(value, 'UTF8');
    END IF;
    code := array_position({_PREFIX_ARRAY}, left(value, cut - 1));
    tail := substr(value, cut + 1);
    IF code IS NULL OR tail !~ '^(?:{_TAIL_PATTERN})$' THEN
        RETURN '\\x00'::bytea || convert_to(value, 'UTF8');
    END IF;
    bits := lpad({_digits_as_bits("tail")}, 192, '0');
    hex := lpad(to_hex(substr(bits, 1, 64)::bit(64)::bigint), 16, '0')
        || lpad(to_hex(substr(bits, 65, 64)::bit(64)::bigint), 16, '0')
        || lpad(to_hex(substr(bits, 129, 64)::bit(64)::bigint), 16, '0');
    RETURN set_byte('\\x00'::bytea, 0, code)
        || substr(decode(hex, 'hex'), CASE WHEN length(tail) = 26 THEN 9 ELSE 2 END);
END
$fn$
"""
"""``pack`` in SQL: the digits' 130 or 180 bits padded to 192, as 24 bytes (three 64-bit
groups in hex), of which the last 16 or 23 follow the prefix's code."""

PG_UNPACK = f"""
CREATE OR REPLACE FUNCTION pg_temp.flowhook_unpack_id(stored bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
DECLARE
    code int := get_byte(stored, 0);
    digits int := CASE WHEN length(stored) = 17 THEN 26 ELSE 36 END;
    bits text;
BEGIN
    IF code = 0 THEN
        RETURN convert_from(substr(stored, 2), 'UTF8');
    END IF;
    bits := ('x' || encode(substr(stored, 2), 'hex'))::varbit::text;
    bits := right(lpad(bits, 192, '0'), digits * 5);  -- 128 bits to 130, 184 to 180
    RETURN ({_PREFIX_ARRAY})[code] || '_' || (
        SELECT string_agg(
            substr('{_ALPHABET}', substr(bits, i, 5)::bit(5)::int + 1, 1), '' ORDER BY i
        )
        FROM generate_series(1, digits * 5, 5) AS i
    );
END
$fn$
"""
"""``unpack`` in SQL."""


def _foreign_keys(bind: Any) -> list[tuple[str, str, str]]:
    """(table, name, definition) of each foreign key of the current schema that holds or
    refers to a listed column; one that pairs a listed column with another is an error (the
    types would no longer match)."""
    rows = bind.exec_driver_sql(
        """
        SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid),
               cl.relname, ARRAY(SELECT a.attname::text FROM pg_attribute a
                                 WHERE a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)),
               fl.relname, ARRAY(SELECT a.attname::text FROM pg_attribute a
                                 WHERE a.attrelid = c.confrelid AND a.attnum = ANY (c.confkey))
        FROM pg_constraint c
        JOIN pg_class cl ON cl.oid = c.conrelid
        JOIN pg_class fl ON fl.oid = c.confrelid
        WHERE c.contype = 'f' AND cl.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
        ORDER BY c.conname
        """
    ).all()
    found = []
    for table, name, definition, relname, keys, parent, parent_keys in rows:
        mine = [c in COLUMNS.get(relname, ()) for c in keys]
        theirs = [c in COLUMNS.get(parent, ()) for c in parent_keys]
        if not any(mine) and not any(theirs):
            continue
        if mine != theirs:
            raise RuntimeError(f"0023: foreign key {name} pairs an id column with another")
        found.append((table, name, definition))
    return found


def pg_convert(bind: Any, *, down: bool = False) -> None:
    """Each listed column made ``bytea`` of its packed text (``VARCHAR(40)`` of its unpacked
    bytes if ``down``), the foreign keys between them dropped before and made again after."""
    bind.exec_driver_sql(PG_UNPACK if down else PG_PACK)
    function = "pg_temp.flowhook_unpack_id" if down else "pg_temp.flowhook_pack_id"
    to = "varchar(40)" if down else "bytea"
    keys = _foreign_keys(bind)
    for table, name, _ in keys:
        bind.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT {_quoted(name)}")
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f"ALTER COLUMN {q} TYPE {to} USING {function}({q})" for q in map(_quoted, columns)
        )
        bind.exec_driver_sql(f"ALTER TABLE {_quoted(table)} {changes}")
    for table, name, definition in keys:
        bind.exec_driver_sql(f"ALTER TABLE {table} ADD CONSTRAINT {_quoted(name)} {definition}")
    bind.exec_driver_sql(f"DROP FUNCTION {function}")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        sqlite_convert(bind)
    else:
        pg_convert(bind)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        sqlite_convert(bind, down=True)
    else:
        pg_convert(bind, down=True)
