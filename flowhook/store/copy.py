"""``flowhook db copy``: every row of one database copied into an empty PostgreSQL one.

Every table of :data:`~flowhook.store.tables.metadata` (Alembic's version table aside: the
target is migrated by :func:`~flowhook.store.migrate.migrate` first) is read from the source
through the table objects, so each value goes through its column type both ways (an id
packed on SQLite becomes ``bytea``, integer microseconds a ``timestamptz``), parents before
children, in batches in primary-key order. Each batch is written with the backend
driver's many-row insert (on PostgreSQL one ``INSERT … SELECT … FROM unnest(…)``; 1.4× the
rows a second of SQLAlchemy's ``executemany``, bench/README.md): called on the driver, not
through :mod:`flowhook.store.bulk`, whose callers each name the hot table they write (a test
compares those tables' rows with SQLAlchemy's); the copy writes every table, and
``tests/e2e/test_db_copy.py`` compares every table's rows, source and target, value by value.

The whole copy is one transaction of the target: it commits only after every table's row
count matched the source's and every sealed secret opened with the key the servers will be
given, so a copy that fails or is interrupted anywhere leaves the target as empty as it
was (migrated), and the same command can simply run again. The source is only read, in
one snapshot, while the copy holds its lock file (:mod:`flowhook.store.holding`): a
running server holds it too, and the copy refuses to start then.

Secrets are copied sealed, as they are; the servers on the target need the keys that open
them, which :class:`KeyAdvice` says where to find.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Table, and_, exists, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.errors import FlowhookError, SecretKeyError
from flowhook.store import secrets
from flowhook.store.crypto import SETTING, SecretBox, generate_key, key_file_for, parse_keys
from flowhook.store.db import Database
from flowhook.store.driver import driver_for_url, driver_of
from flowhook.store.holding import Held, database_file, holding
from flowhook.store.migrate import current_revision, head_revision, migrate
from flowhook.store.tables import metadata

__all__ = [
    "BATCH",
    "CopyRefused",
    "CopyFailed",
    "Copied",
    "KeyAdvice",
    "Progress",
    "copy_database",
    "copy_order",
    "after_key",
]

BATCH = 5000
"""Rows read and written at a time."""

Progress = Callable[[str, int, int], None]
"""Called as a table's rows are copied: the table, rows copied so far, rows in all."""

RESTART = (
    "the source is untouched and nothing was kept in the target (its copy is one "
    "transaction, rolled back): run the same command again"
)


class CopyRefused(FlowhookError):
    """The copy did not start: nothing was written anywhere."""

    code = "copy_refused"


class CopyFailed(FlowhookError):
    """The copy stopped partway; the target's transaction was rolled back."""

    code = "copy_failed"

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"the copy stopped at {where}: {reason}; {RESTART}")
        self.where = where


@dataclass(frozen=True)
class KeyAdvice:
    """Which ``FLOWHOOK_SECRET_KEY`` the servers on the target need."""

    keys: str
    """The keys (comma-separated, newest first) the copy checked the sealed secrets with."""
    came_from: str
    """``setting`` (FLOWHOOK_SECRET_KEY as set for the copy), ``file`` (the SQLite key
    file beside the source) or ``new`` (neither: a key made for the target)."""
    key_file: Path | None = None

    def say(self) -> str:
        if self.came_from == "file":
            quoted = shlex.quote(str(self.key_file))
            return (
                f"the PostgreSQL servers need {SETTING} set to the content of the key file "
                f"{self.key_file}: {SETTING}=$(cat {quoted})"
            )
        if self.came_from == "setting":
            return f"the PostgreSQL servers need {SETTING} set as it is for this copy (same keys)"
        return (
            f"the source had no key file and no {SETTING} (so no sealed secret); the "
            f"PostgreSQL servers need this new key, shown once: {SETTING}={self.keys}"
        )


@dataclass
class Copied:
    """What a copy did: rows per table (verified equal on both sides), seconds, the key."""

    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    key: KeyAdvice | None = None

    @property
    def rows(self) -> int:
        return sum(self.counts.values())


def copy_order() -> list[Table]:
    """The tables to copy, each after the tables its foreign keys point at."""
    return list(metadata.sorted_tables)


def after_key(table: Table, last: Sequence[Any]) -> Any:
    """The condition "primary key after ``last``" (the key of the batch's last row), as
    nested ORs, which both backends plan as an index range: ``a > :a OR (a = :a AND b > :b)``."""
    columns = list(table.primary_key.columns)
    terms = []
    for i, column in enumerate(columns):
        equal = [columns[j] == last[j] for j in range(i)]
        terms.append(and_(*equal, column > last[i]))
    return or_(*terms)


def source_keys(secret_key: str | None, source_url: str) -> KeyAdvice:
    """The keys that open the source's sealed secrets: FLOWHOOK_SECRET_KEY as given, else
    the key file beside a SQLite source (read, never made), else (a SQLite file that never
    had one, so no sealed secret) a new key; a PostgreSQL source needs FLOWHOOK_SECRET_KEY."""
    if secret_key:
        return KeyAdvice(",".join(parse_keys(secret_key)), "setting")
    path = key_file_for(source_url)
    if path is None:  # PostgreSQL: its servers were given the key, the copy needs it too
        raise CopyRefused(
            f"{SETTING} is not set: set it as the source's servers have it (the copy checks "
            "that every stored secret opens with it, and the target's servers need it)"
        )
    if path.exists():
        keys = parse_keys(path.read_text(encoding="ascii"), f"the key file {path}")
        return KeyAdvice(",".join(keys), "file", path)
    return KeyAdvice(generate_key(), "new")


async def copy_database(
    source_url: str,
    target_url: str,
    *,
    secret_key: str | None = None,
    progress: Progress | None = None,
    batch: int = BATCH,
) -> Copied:
    """Copy every row of ``source_url`` into ``target_url`` (PostgreSQL, migrated here
    when it is not yet, and empty). Raises :class:`CopyRefused` before anything is written,
    :class:`CopyFailed` when it stops partway (the target is rolled back)."""
    if driver_for_url(target_url).name != "postgresql":
        raise CopyRefused("--to must be a PostgreSQL database (postgresql://…)")
    path = database_file(source_url)
    if path is not None and not path.is_file():
        raise CopyRefused(f"there is no SQLite database at {path}")
    try:
        with holding(source_url, exclusive=True):
            return await _copy(source_url, target_url, secret_key, progress, batch)
    except Held as held:
        raise CopyRefused(
            f"a running flowhook server holds the source {path} (its lock {held.path} is "
            "taken): stop `flowhook serve` (or every api and worker on it) first, then run "
            "this again"
        ) from None


async def _copy(
    source_url: str,
    target_url: str,
    secret_key: str | None,
    progress: Progress | None,
    batch: int,
) -> Copied:
    started = time.monotonic()
    advice = source_keys(secret_key, source_url)
    source = Database(source_url, secret_key=advice.keys)
    target = Database(target_url, secret_key=advice.keys)
    try:
        async with _refusing("the source cannot be read"):
            await _check_source(source)
        async with _refusing("the target cannot be reached or migrated"):
            await migrate(target)
            await _check_empty(target)
        copied = Copied(key=advice)
        at = "the start"
        try:
            async with _snapshot(source) as reading, target.transaction() as writing:
                totals = {t.name: await _count(reading, t) for t in copy_order()}
                for table in copy_order():
                    at = f"table {table.name}"
                    copied.counts[table.name] = await _copy_table(
                        reading, writing, table, totals[table.name], progress, batch
                    )
                at = "the check"
                await _verify(writing, totals, copied.counts, advice)
                at = "the commit"
        except CopyFailed:
            raise
        except Exception as exc:  # any error (or the store's): where it stopped, and why
            raise CopyFailed(at, _reason(exc)) from exc
        copied.seconds = time.monotonic() - started
        return copied
    finally:
        await source.dispose()
        await target.dispose()


@contextlib.asynccontextmanager
async def _refusing(what: str) -> AsyncIterator[None]:
    """Any error of the block (a database not there, unreachable, refusing the user) as
    :class:`CopyRefused`: ``what`` and the reason, in one line, before anything was copied."""
    try:
        yield
    except (CopyRefused, SecretKeyError):
        raise
    except Exception as exc:
        raise CopyRefused(f"{what}: {_reason(exc)}") from exc


async def _check_source(source: Database) -> None:
    have, head = await current_revision(source), head_revision()
    if have != head:
        raise CopyRefused(
            f"the source's schema is at revision {have or 'none'}, this flowhook's is at "
            f"{head}: run `flowhook migrate` on the source first (a server started on it "
            "does that)"
        )
    if not source.is_sqlite:
        async with source.read() as conn:
            others = await conn.scalar(_OTHER_SESSIONS)
        if others:
            raise CopyRefused(
                f"{others} other session(s) are connected to the source database: stop every "
                "flowhook api and worker on it first, then run this again"
            )


_OTHER_SESSIONS = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend'"
)


async def _check_empty(target: Database) -> None:
    async with target.read() as conn:
        for table in copy_order():
            if await conn.scalar(select(exists().select_from(table))):
                raise CopyRefused(
                    f"the target database is not empty: table {table.name} has rows; copy "
                    "into an empty database (drop and create it again, or name a new one)"
                )


@contextlib.asynccontextmanager
async def _snapshot(source: Database) -> AsyncIterator[AsyncConnection]:
    """One snapshot of the source for every table: SQLite's read transaction; on
    PostgreSQL a REPEATABLE READ one, read only."""
    if source.is_sqlite:
        async with source.read() as conn:
            yield conn
        return
    async with source.reader.connect() as conn:
        conn = await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            await conn.execute(text("SET TRANSACTION READ ONLY"))
            yield conn


async def _count(conn: AsyncConnection, table: Table) -> int:
    return int(await conn.scalar(select(func.count()).select_from(table)) or 0)


async def _copy_table(
    reading: AsyncConnection,
    writing: AsyncConnection,
    table: Table,
    total: int,
    progress: Progress | None,
    batch: int,
) -> int:
    key = list(table.primary_key.columns)
    query = select(table).order_by(*key).limit(batch)
    done, last = 0, None
    if progress is not None:
        progress(table.name, 0, total)
    while True:
        stmt = query if last is None else query.where(after_key(table, last))
        rows = [dict(r._mapping) for r in await reading.execute(stmt)]
        if not rows:
            return done
        await driver_of(writing).insert(writing, table, rows)
        done += len(rows)
        last = [rows[-1][c.name] for c in key]
        if progress is not None:
            progress(table.name, done, total)
        if len(rows) < batch:
            return done


def _reason(exc: BaseException) -> str:
    """What went wrong, in one line: the store's message (a :class:`FlowhookError`) and the
    first line of what the driver said under it, with the kind of the driver's error."""
    said = [exc.message] if isinstance(exc, FlowhookError) else []
    cause = exc.__cause__ if isinstance(exc, FlowhookError) else exc
    if cause is not None:
        orig = getattr(cause, "orig", None) or cause
        lines = str(orig).strip().splitlines()
        said.append(f"{type(orig).__name__}: {lines[0] if lines else 'no message'}")
    return "; ".join(said)


async def _verify(
    writing: AsyncConnection, totals: dict[str, int], copied: dict[str, int], key: KeyAdvice
) -> None:
    """Each table of the target holds as many rows as the source's, and every sealed
    secret opens with the keys the servers will be given (else nothing is committed)."""
    for name, total in totals.items():
        have = await _count(writing, metadata.tables[name])
        if have != total or copied[name] != total:
            raise CopyFailed(f"table {name}", f"the source has {total} rows, the target {have}")
    box = SecretBox(parse_keys(key.keys))
    source = {"setting": SETTING, "file": f"the key file {key.key_file}"}.get(
        key.came_from, "a new key (the source had none)"
    )

    def check(sync_conn: Any) -> None:
        secrets.reseal(sync_conn, box, mode="seal").raise_if_unreadable(source)

    try:
        await writing.run_sync(check)
    except SecretKeyError as exc:
        raise CopyFailed("the check of the secrets", exc.message) from exc
