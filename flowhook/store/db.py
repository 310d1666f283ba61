"""Connections and transactions, on SQLite or PostgreSQL.

SQLite: each process writes through a single connection (a pool of one), so its writes
queue in the process instead of failing with "database is locked", and each write
transaction starts with ``BEGIN IMMEDIATE``, so a transaction meets another process's lock
(``flowhook serve``'s engine process writes beside its API process) only at its start, where
the wait is asynchronous. Reads use their own small pool; WAL lets
them run beside the writer. Statements run on the event loop's thread
(:mod:`flowhook.store.sqlite_inline`), not on a thread per connection. PostgreSQL uses one
pool for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import asyncpg
import orjson
import sqlalchemy.exc as sa_exc
from pydantic import SecretStr
from sqlalchemy import event, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from flowhook.backoff import backoff
from flowhook.errors import Duplicate, InvalidInput, StoreUnavailable, WriteConflict
from flowhook.store import sqlite_inline
from flowhook.store.crypto import INFO_KEY, Keyring
from flowhook.store.driver import Driver, driver_for_url
from flowhook.store.pg_driver import pg_item_type
from flowhook.store.tables import metadata
from flowhook.store.wakeup import Broadcast, Wakeup

__all__ = ["Database", "Connection", "DuplicateRow", "CONFLICT_ATTEMPTS", "EVENTS_FLOOR"]

Connection: TypeAlias = AsyncConnection
"""A connection of a :class:`Database` (SQLAlchemy's): what the store's functions take.
Callers above the store only pass it on, so they name it by this alias."""

EVENTS_FLOOR = "events_floor"
"""In ``conn.info["tx"]``: the lowest event id the transaction wrote (``store.events``)."""

log = logging.getLogger("flowhook.store")

R = TypeVar("R")

CONFLICT_ATTEMPTS = 4
"""How many times :meth:`Database.retrying` runs a transaction that keeps losing lock
conflicts (deadlock, serialization failure) before it gives up with :class:`WriteConflict`."""

WAL_SIZE_LIMIT = 64 * 1024 * 1024
"""Bytes the SQLite WAL file is truncated to after a checkpoint (``journal_size_limit``)."""

CONFLICT_BACKOFF = 0.01
"""Seconds before the first retry after a lost conflict; doubled each time, jittered ×0.5–1.5
so the two sides of a deadlock do not meet again in step."""


IDLE_PING = 1.0
"""Seconds a PostgreSQL connection may sit in the pool before its next use pings it first."""

STATEMENT_POOL = 4
"""Connections of :meth:`Database.statement`'s pool on PostgreSQL (as many again may
overflow): a process makes one such statement at a time per claim loop, and the API one per
accept batch."""


def _learn_array_types(engine: AsyncEngine) -> None:
    """Have each new PostgreSQL connection learn the array types of the store's columns
    when it is made, in one query, rather than on the first run.

    asyncpg knows PostgreSQL's scalar types but looks up an array type (its element, its
    delimiter) the first time a statement of the connection uses one, with a query of its
    own over ``pg_type``; the store's bulk writes pass every column as an array
    (:func:`flowhook.store.pg_driver.unnested`). On a new connection the first claim and the
    first progress of a run paid two such lookups (``bench/idle_phases.py``; figures in
    bench/README.md, "Figures moved from docstrings").

    A failure here only costs the lookups later: a connection the server dropped meanwhile
    fails its first statement as a disconnect (:class:`~flowhook.errors.StoreUnavailable`),
    and a type a database lacks (one not migrated yet) must not stop its migration."""

    async def learn(conn: asyncpg.Connection) -> None:
        try:
            await conn.fetchrow(_array_types_query())
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.debug("a new connection did not learn the array types: %s", exc)

    @event.listens_for(engine.sync_engine, "connect")
    def _learn(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.run_async(learn)


@functools.cache
def _array_types_query() -> str:
    """``SELECT NULL::<type>[], …`` for each column type of the store's tables, as the bulk
    writes send them (:func:`flowhook.store.pg_driver.pg_item_type`)."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    names = sorted(
        {
            pg_item_type(column.type).compile(dialect=dialect)
            for table in metadata.tables.values()
            for column in table.columns
        }
    )
    return "SELECT " + ", ".join(f"NULL::{name}[] AS a{i}" for i, name in enumerate(names))


def _ping_when_idle(engine: AsyncEngine) -> None:
    """Ping a PostgreSQL connection when it is taken from the pool after sitting there more
    than :data:`IDLE_PING` seconds; if the ping fails, that connection and every one made
    before it are replaced (the pool's own retry on
    :class:`~sqlalchemy.exc.InvalidatePoolError`).

    SQLAlchemy's ``pool_pre_ping`` pings at every checkout, and asyncpg's ping is three round
    trips (``BEGIN``, an empty query, ``ROLLBACK``): on a busy service that doubled the round
    trips of a short transaction. A connection in steady use does not need it. One that a
    restarted server closed meanwhile fails its first statement instead; SQLAlchemy then takes
    the error for a disconnect and replaces every connection of the pool made before it, and
    the caller sees :class:`~flowhook.errors.StoreUnavailable`, which the consumers retry and
    the API answers with 503, as during the outage itself."""

    @event.listens_for(engine.sync_engine, "checkin")
    def _idle_from(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _ping(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since <= IDLE_PING:
            return
        try:
            dbapi_connection.ping()
        except Exception as exc:  # any failure: not a usable connection
            # as pool_pre_ping does: this connection and every one made before it are
            # replaced (a server that closed one has most likely closed them all)
            raise sa_exc.InvalidatePoolError(f"ping failed: {exc}") from exc


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _json_loads(value: Any) -> Any:
    """A JSON column's value. SQLite gives a column declared ``JSON`` numeric affinity, so it
    keeps the JSON text of a bare number (a task's or a ``python`` step's output ``42``) as
    that number, and reads it back as one: it is the value already."""
    if isinstance(value, int | float):
        return value
    return orjson.loads(value)


class Database:
    def __init__(
        self,
        url: str,
        *,
        sqlite_synchronous: str = "FULL",
        sqlite_busy_timeout: float = 10.0,
        pool_size: int = 10,
        secret_key: SecretStr | str | None = None,
    ) -> None:
        self.url = url
        self.keyring = Keyring(secret_key, url)
        """Seals and opens stored secrets; each connection carries it (``crypto.cipher``)."""
        self.driver: Driver = driver_for_url(url)
        """The backend's driver, chosen once: what differs between SQLite and PostgreSQL."""
        self.async_url = self.driver.engine_url(url)
        self.is_sqlite = self.driver.name == "sqlite"
        self.wakeups: dict[str, Wakeup] = {
            "runs": Wakeup(), "deliveries": Wakeup(), "tasks": Broadcast(),
        }  # fmt: skip
        """Poked after a commit that queued work of that kind (see ``conn.info["wake"]``)."""
        self.on_events: Callable[[str], None] | None = None
        """Called after a commit that wrote events, with the lowest event id it wrote (the
        event streams' hub sets it; ``None``, nothing is called)."""
        common: dict[str, Any] = {"json_serializer": _json_dumps, "json_deserializer": _json_loads}
        if self.is_sqlite:
            # The inline driver's dialect; the URL's own options (``?uri=true&mode=ro``,
            # ``?timeout=5``) still reach sqlite3 as the aiosqlite dialect reads them.
            inline = sqlite_inline.engine_url(self.async_url)
            common["connect_args"] = {"busy_timeout": sqlite_busy_timeout}
            self.writer = create_async_engine(
                inline, pool_size=1, max_overflow=0, pool_timeout=60, **common
            )
            self.reader = create_async_engine(inline, pool_size=4, max_overflow=4, **common)
            _sqlite_setup(self.writer, sqlite_synchronous, begin="BEGIN IMMEDIATE")
            _sqlite_setup(self.reader, sqlite_synchronous, begin="BEGIN")
            self._statements: AsyncEngine | None = None
        else:
            engine = create_async_engine(
                self.async_url,
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_use_lifo=True,  # the last connection returned is the next one taken:
                # a busy process keeps reusing a few warm ones, which skip the idle ping
                **common,
            )
            _ping_when_idle(engine)  # a restarted server's dead connections are replaced
            _learn_array_types(engine)
            self.writer = self.reader = engine
            # statement(): its own small pool, on plans PostgreSQL makes once per connection
            statements = create_async_engine(
                self.async_url,
                pool_size=STATEMENT_POOL,
                max_overflow=STATEMENT_POOL,
                pool_use_lifo=True,
                connect_args={"server_settings": {"plan_cache_mode": "force_generic_plan"}},
                **common,
            )
            _ping_when_idle(statements)
            _learn_array_types(statements)
            _carry_keyring(statements, self.keyring)
            self._statements = statements
        self._autocommit_reads = (
            None if self.is_sqlite else self.reader.execution_options(isolation_level="AUTOCOMMIT")
        )
        self._autocommit_writes = (
            None
            if self._statements is None
            else self._statements.execution_options(isolation_level="AUTOCOMMIT")
        )
        _carry_keyring(self.writer, self.keyring)
        if self.reader is not self.writer:
            _carry_keyring(self.reader, self.keyring)

    @property
    def engines(self) -> tuple[AsyncEngine, ...]:
        """Every engine whose connections this database runs statements on (for a listener
        that must see them all: a tracer, a test counting statements)."""
        found = [self.writer, self.reader, self._statements]
        return tuple(e for i, e in enumerate(found) if e is not None and e not in found[:i])

    @property
    def dialect(self) -> str:
        return self.driver.name

    @property
    def listen_dsn(self) -> str | None:
        """The DSN a ``LISTEN`` connection opens to hear the ``NOTIFY`` of every process's
        commits (:class:`~flowhook.store.wakeup.PgListener`); ``None`` where the backend
        tells no other process (this process's wake-ups, and ``flowhook serve``'s peer
        link, carry the news there)."""
        if not self.driver.tells_other_processes:
            return None
        return self.url.replace("+asyncpg", "")

    @property
    def autocommits_statements(self) -> bool:
        """Whether a :meth:`statement` block is a statement in autocommit, its own
        transaction (else a write transaction, as :meth:`transaction`)."""
        return self._autocommit_writes is not None

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A write transaction: committed when the block ends, rolled back on error. Queries
        that queue work add its kind to ``conn.info["wake"]``; those wake-ups fire after the
        commit, never for work that rolled back. ``conn.info["tx"]`` is a scratch dict that
        lives as long as the transaction (the connection's ``info`` outlives it)."""
        return self._writing(self.writer.begin())

    @contextlib.asynccontextmanager
    async def _writing(
        self, opened: contextlib.AbstractAsyncContextManager[AsyncConnection]
    ) -> AsyncIterator[AsyncConnection]:
        """The block of :meth:`transaction` and :meth:`statement` on the connection
        ``opened`` gives: its wake-ups and events' floor are fired once it has committed."""
        wake: set[str] = set()
        tx: dict[str, Any] = {}
        async with _translated(self.driver), opened as conn:
            conn.info["wake"] = wake
            conn.info["tx"] = tx
            try:
                yield conn
            finally:
                conn.info.pop("wake", None)
                conn.info.pop("tx", None)
        for kind in wake:
            self.wakeups[kind].notify()
        if self.on_events is not None and EVENTS_FLOOR in tx:
            self.on_events(tx[EVENTS_FLOOR])

    async def retrying(self, work: Callable[[AsyncConnection], Awaitable[R]]) -> R:
        """``work(conn)`` in a write transaction; run again (a new transaction, after a short
        jittered backoff) when PostgreSQL ends it with :class:`WriteConflict`, up to
        :data:`CONFLICT_ATTEMPTS` times. Such a transaction wrote nothing, so ``work`` must
        only be safe to run twice in that sense: no effect outside the transaction. Costs
        nothing when the first attempt commits."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                async with self.transaction() as conn:
                    return await work(conn)
            except WriteConflict as exc:
                if attempt == CONFLICT_ATTEMPTS:
                    raise
                delay = backoff(attempt, CONFLICT_BACKOFF, jitter=0.5)
                log.warning("store: %s; retrying the transaction in %.3fs", exc, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def statement(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A connection for a block of one write statement (the engine's run claim, the
        dispatcher's delivery claim on PostgreSQL). On PostgreSQL in autocommit: the
        statement is a transaction of its own, so it pays no ``BEGIN`` and ``COMMIT`` round
        trips; on SQLite a write transaction, as :meth:`transaction`. A block of more than
        one statement needs :meth:`transaction`: here each would commit alone (a read
        before the write, as the run claim's, may stand alone).

        On PostgreSQL these connections are a pool of their own whose prepared statements
        keep one generic plan (``plan_cache_mode = force_generic_plan``): the claims run
        many times a second with the same shape, and PostgreSQL, judging a plan for unknown
        values dearer than the plans it makes for each call's own, planned each call anew
        for the same index reads (bench/README.md, "Figures moved from docstrings";
        ``tests/integration/test_pg_driver_path.py`` checks the plans). The API's reads and
        transactions keep PostgreSQL's own choice."""
        if self._autocommit_writes is None:
            return self.transaction()
        return self._writing(self._autocommit_writes.connect())

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reads. On SQLite a read transaction: one snapshot for every
        statement in the block. On PostgreSQL no transaction (autocommit): at its READ
        COMMITTED level each statement takes its own snapshot anyway, so a ``BEGIN`` and a
        ``COMMIT`` would only add two round trips to every read (the engine's and the
        dispatcher's due-time probes, the API's lookups)."""
        if self._autocommit_reads is None:  # begun at once: raw statements are inside it too
            async with _translated(self.driver), self.reader.begin() as conn:
                yield conn
        else:
            async with _translated(self.driver), self._autocommit_reads.connect() as conn:
                yield conn

    async def ping(self) -> None:
        async with self.read() as conn:
            await conn.execute(text("SELECT 1"))

    async def gather_statistics(self, tables: tuple[str, ...]) -> list[str] | None:
        """PostgreSQL: ANALYZE each of ``tables`` that has no column statistics yet, or whose
        rows changed since its last analyze by more than autovacuum's analyze threshold
        (``autovacuum_analyze_threshold`` + ``autovacuum_analyze_scale_factor`` × its rows:
        what autovacuum would analyze on its next pass); the names of those analyzed, or
        None when the database cannot be reached (try again later). Nothing on SQLite.
        Never raises: planning with old statistics is slower, not wrong, so any other
        failure is logged and gives ``[]``. A process's writes call it as they grow
        (:mod:`flowhook.store.statistics`).

        A new database has none until autovacuum's first pass (a minute or more, and an
        immediate restart resets the counters it goes by). Without them the planner cannot
        tell the indexes of ``runs`` apart: the Idempotency-Key lookup chose
        ``(workspace_id, mode, run_id)`` over the unique ``(workspace_id, mode,
        idempotency_key)`` and read every run of the workspace on each accept, which the
        backlog after a PostgreSQL restart turned into an accept rate that never recovered
        (issue 19)."""
        if self.is_sqlite:
            return []
        done: list[str] = []
        try:
            async with _translated(self.driver), self.writer.connect() as conn:
                for table in tables:
                    if await conn.scalar(_NEEDS_STATISTICS, {"table": table}):
                        await conn.execute(text(f'ANALYZE "{table}"'))
                        done.append(table)
                await conn.commit()
        except StoreUnavailable:
            return None
        except Exception:
            log.warning("could not gather statistics of %s", ", ".join(tables), exc_info=True)
            return []  # what was analyzed was rolled back with it
        return done

    async def dispose(self) -> None:
        await self.writer.dispose()
        if self.reader is not self.writer:
            await self.reader.dispose()
        if self._statements is not None:
            await self._statements.dispose()


_NEEDS_STATISTICS = text(
    "SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stats"
    " WHERE schemaname = current_schema() AND tablename = :table)"
    " OR coalesce((SELECT s.n_mod_since_analyze"
    " > current_setting('autovacuum_analyze_threshold')::float8"
    " + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0)"
    " FROM pg_catalog.pg_stat_user_tables s JOIN pg_catalog.pg_class c ON c.oid = s.relid"
    " WHERE s.schemaname = current_schema() AND s.relname = :table), false)"
)
"""True for a table PostgreSQL has no column statistics of (never analyzed, or empty), or
whose statistics autovacuum would gather again (a table's own autovacuum settings aside)."""

_GONE = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, crash shutdown, cannot connect now
    asyncpg.exceptions.InterfaceError,  # connection closed in the middle of an operation
)


def _database_gone(exc: BaseException) -> bool:
    return _caused_by(exc, _GONE)


_NUL_REFUSED = (
    asyncpg.exceptions.CharacterNotInRepertoireError,  # a NUL in a text parameter
    asyncpg.exceptions.UntranslatableCharacterError,  # \u0000 in a jsonb value
)


_CONFLICT = (
    asyncpg.exceptions.DeadlockDetectedError,  # 40P01
    asyncpg.exceptions.SerializationError,  # 40001
)


def _caused_by(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class DuplicateRow(Duplicate, sa_exc.IntegrityError):  # type: ignore[misc]  # both have a `code`
    """The driver's ``IntegrityError`` for a row a unique key refused, as the store raises
    it: a :class:`~flowhook.errors.Duplicate` to the layers above, and still the
    ``IntegrityError`` it was to code written against the driver (the store's own tests)."""

    def __init__(self, exc: sa_exc.IntegrityError) -> None:
        sa_exc.IntegrityError.__init__(
            self,
            exc.statement,
            exc.params,
            exc.orig if exc.orig is not None else exc,
            exc.hide_parameters,
            exc.connection_invalidated,
            ismulti=exc.ismulti,
        )
        self.message = "a row with the same key was written first (by another request)"

    def __str__(self) -> str:
        return f"{self.message}: {self.orig}"


@contextlib.asynccontextmanager
async def _translated(driver: Driver | None = None) -> AsyncIterator[None]:
    """A lost lock conflict (deadlock, serialization failure) becomes :class:`WriteConflict`,
    which callers may retry; a row a unique key refused becomes :class:`DuplicateRow` (as
    ``driver`` tells them apart: none without one); errors that mean "the database is not
    there" become :class:`StoreUnavailable`; text PostgreSQL cannot hold (the NUL
    character; SQLite keeps it) becomes :class:`InvalidInput`, so odd input from outside
    answers 400 on both backends alike."""
    try:
        yield
    except DuplicateRow:
        raise
    except sa_exc.DBAPIError as exc:
        if (
            isinstance(exc, sa_exc.IntegrityError)
            and driver is not None
            and driver.is_duplicate(exc)
        ):
            raise DuplicateRow(exc) from exc
        if _caused_by(exc, _CONFLICT):
            state = getattr(exc.orig, "sqlstate", None) or "conflict"
            raise WriteConflict(f"the transaction lost a lock conflict ({state})") from exc
        if (
            exc.connection_invalidated
            or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
            or _database_gone(exc)
        ):
            raise StoreUnavailable("the database cannot be reached; try again shortly") from exc
        if _caused_by(exc, _NUL_REFUSED):
            raise InvalidInput("text must not contain the NUL character (\\u0000)") from None
        raise
    except (OSError, sa_exc.TimeoutError, sa_exc.PendingRollbackError) as exc:
        raise StoreUnavailable("the database cannot be reached; try again shortly") from exc


def _carry_keyring(engine: AsyncEngine, keyring: Keyring) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(_dbapi_conn: Any, record: Any) -> None:
        record.info[INFO_KEY] = keyring


def _sqlite_setup(engine: AsyncEngine, synchronous: str, *, begin: str) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take over transaction control from the driver so BEGIN is ours to emit.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # Before anything else: a new database (no table yet) is made with incremental
        # auto-vacuum, so pruning can hand its free pages back to the file system
        # (``store.space.free_pages``). An existing one keeps its mode until ``flowhook
        # vacuum`` rebuilds it once. Set after WAL mode it would be too late.
        cur.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        if cur.fetchone() is None:
            with contextlib.suppress(sqlite3.OperationalError):  # a read-only empty file
                cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA journal_mode=WAL")
        # The WAL file is cut back to this after a checkpoint (a burst of deletes may have
        # grown it; without the limit it keeps its largest size for good).
        cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=0")  # lock waits are asynchronous (sqlite_inline)
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)
