"""The ``flowhook`` command: serve, migrate, keys.

The server stack (uvicorn, the store, the services) is imported by the commands that use it,
inside them: the remote commands (:mod:`flowhook.cli_remote`) and ``--help`` start with the
SDK and the CLI alone, in a fraction of the time."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import shlex
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import typer.core
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from flowhook.config import Settings
    from flowhook.service.bootstrap import Bootstrapped
    from flowhook.store.db import Database

__all__ = ["app", "main"]

_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "Path": "PATH"}


def _plain_help() -> None:
    """``--help`` as people read it: typer (0.2x) writes each option's Python type
    (``--json <bool>``, ``--limit <int>``) and an argument in braces (``{flow_id}``). A flag
    is written bare, a value as a word (TEXT, INTEGER), an argument in capitals, as click
    does. (A typer without these hooks writes click's own, which reads that way already.)"""
    core = typer.core
    if not hasattr(core.TyperOption, "display_type_rich"):  # pragma: no cover - older typer
        return

    def word(self: Any, ctx: Any) -> str | None:
        if self.metavar is not None:
            return str(self.metavar)
        if getattr(self, "is_flag", False):
            return None
        shown = str(self.display_type(ctx)).strip("<>")
        if shown.startswith("list[") and shown.endswith("]"):
            inner = shown[5:-1]
            return f"{_WORDS.get(inner, inner.upper())}..."
        return _WORDS.get(shown, shown.upper() if shown.isidentifier() else shown)

    def usage_name(self: Any) -> str:
        name = str(self.metavar or self.name or "").upper()
        name = name if self.required else f"[{name}]"
        return f"{name}..." if self.nargs != 1 else name

    core.TyperOption.display_type_rich = word  # type: ignore[method-assign]
    core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
    core.TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]


_plain_help()

app = typer.Typer(
    name="flowhook",
    help="Flowhook: start workflow runs over HTTP, follow them, get signed webhooks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's lines are one paragraph, as they read
)
keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
secrets_app = typer.Typer(
    help="The key that encrypts webhook and hook secrets at rest (FLOWHOOK_SECRET_KEY).",
    no_args_is_help=True,
)
app.add_typer(secrets_app, name="secrets")
db_app = typer.Typer(
    help="Move the database: copy an installation into PostgreSQL.", no_args_is_help=True
)
app.add_typer(db_app, name="db")
console = Console()
err_console = Console(stderr=True)

T = TypeVar("T")

DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="Overrides FLOWHOOK_DATABASE_URL.", show_default=False),
]


class KeyMode(enum.StrEnum):
    """A key's mode, as the options take it (the store's ``Mode``, without importing it)."""

    TEST = "test"
    LIVE = "live"


def _settings(**overrides: Any) -> Settings:
    from flowhook.config import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:
        err_console.print(f"[red]invalid setting:[/red] {exc}")
        raise typer.Exit(2) from None


AccessLogOpt = Annotated[bool, typer.Option(help="Log every request.")]


def _server_settings(**overrides: Any) -> Settings:
    """Settings for a long-running command (serve, api, worker): logging configured and the
    secret key checked before anything starts."""
    settings = _settings(**overrides)
    _configure_logging(settings)
    _check_secret_key(settings)
    return settings


def _database(settings: Settings) -> Database:
    from flowhook.store.db import Database

    return Database(
        settings.database_url,
        sqlite_synchronous=settings.sqlite_synchronous,
        secret_key=settings.secret_key,
    )


def _check_secret_key(settings: Settings) -> None:
    """Stop before serving when the secret key is missing or malformed (on SQLite without
    one, this makes the key file, and says so)."""
    from flowhook.errors import SecretKeyError
    from flowhook.store.crypto import Keyring

    try:
        Keyring(settings.secret_key, settings.database_url).box()
    except SecretKeyError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(2) from None


_HOLDS = contextlib.ExitStack()
"""The locks this process holds until it exits (``_hold``)."""


def _hold(settings: Settings) -> None:
    """Hold the SQLite file shared (``flowhook.store.holding``) until this process exits, as
    every server does while it runs: `flowhook db copy` refuses a source so held, and a
    server does not start while a copy reads its file."""
    from flowhook.store.holding import Held, holding

    try:
        _HOLDS.enter_context(holding(settings.database_url, exclusive=False))
    except Held as held:
        err_console.print(
            f"[red]error:[/red] `flowhook db copy` is reading this database ({held.path} is "
            "held): start the servers on its target once it has finished"
        )
        raise typer.Exit(2) from None


def _with_db(settings: Settings, work: Callable[[Database], Awaitable[T]]) -> T:
    from flowhook.errors import FlowhookError
    from flowhook.store.migrate import migrate

    async def go() -> T:
        db = _database(settings)
        try:
            await migrate(db)
            return await work(db)
        finally:
            await db.dispose()

    try:
        return asyncio.run(go())
    except FlowhookError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}")
        raise typer.Exit(1) from None


def _configure_logging(settings: Settings) -> None:
    from flowhook.logs import configure

    configure(settings.log_level, settings.log_format)


def _print_welcome(seeded: Bootstrapped, base: str) -> None:
    """The first-start keys go to standard output once, as plain text, never through the
    logger: in JSON-log mode the log (standard error) records only that they were made."""
    from flowhook.service.bootstrap import EXAMPLE_PAYLOAD

    body = json.dumps({"flow_id": seeded.flow_id, "payload": EXAMPLE_PAYLOAD})
    lines = [
        "",
        "Flowhook created a workspace on this empty database. These keys are shown once:",
        f"  sandbox key:  {seeded.test_key}",
        f"  live key:     {seeded.live_key}",
        f"  example flow: {seeded.flow_id} (sandbox)",
        "",
        "Start a run of the example flow:",
        f"  curl -s -X POST {base}/api/v1/flows/execute \\",
        f"    -H 'Authorization: Bearer {seeded.test_key}' \\",
        "    -H 'Content-Type: application/json' \\",
        f"    -d {shlex.quote(body)}",
        "",
        "Then read it with GET /api/v1/flows/runs/<run_id> (same key),",
        f"or open the settings screen at {base}/ and sign in with the sandbox key.",
        "",
    ]
    print("\n".join(lines), file=sys.stdout, flush=True)
    logging.getLogger("flowhook").info(
        "created a workspace on the empty database with a sandbox key, a live key and the "
        "example flow %s; the keys were printed once to standard output, not to this log",
        seeded.flow_id,
    )


@app.command()
def serve(
    host: Annotated[
        str | None,
        typer.Option(help="Overrides FLOWHOOK_HOST (default 127.0.0.1).", show_default=False),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="Overrides FLOWHOOK_PORT (default 8080); 0 takes a free port and prints it.",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseOpt = None,
    access_log: AccessLogOpt = False,
    single_process: Annotated[
        bool,
        typer.Option(
            "--single-process",
            help="Run the engine inside the API process (one core) instead of beside it.",
        ),
    ] = False,
) -> None:
    """Run the API and the engine (SQLite by default) as two processes, started and stopped
    together: this one serves HTTP, its engine process runs the worker, the webhook
    dispatcher, the scheduler and retention. If either ends, so does the other."""
    import uvicorn

    from flowhook.app import create_app
    from flowhook.gctune import tune_for_server
    from flowhook.peer import EngineProcess
    from flowhook.store.driver import driver_for_url

    settings = _server_settings(host=host, port=port, database_url=database_url)
    _hold(settings)
    listener = None
    if settings.port == 0:  # any free port: bound here, so every part is told the real one
        listener = _bind_any_port(settings.host)
        settings = settings.model_copy(update={"port": listener.getsockname()[1]})
        print(f"listening on http://{settings.host}:{settings.port}", flush=True)
    base = f"http://{settings.host}:{settings.port}"
    split = not single_process  # both backends: the API keeps a core of its own
    server: uvicorn.Server | None = None

    def engine_lost() -> None:
        if server is not None:
            server.should_exit = True

    engine = EngineProcess(settings, on_lost=engine_lost) if split else None
    if split:
        _with_db(settings, lambda db: _noop())  # migrated once, before either process starts
    application = create_app(
        settings,
        on_bootstrap=lambda seeded: _print_welcome(seeded, base),
        run_worker=not split,
        run_migrations=not split,
        engine=engine,
    )
    logging.getLogger("flowhook").info(
        "serving on %s with %s%s",
        base,
        driver_for_url(settings.database_url).label,
        " (API and engine in two processes)" if split else "",
    )
    config = uvicorn.Config(
        application,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=access_log,
        lifespan="on",
        log_config=None,
        timeout_keep_alive=int(settings.http_keep_alive),
        timeout_graceful_shutdown=30,
    )
    tune_for_server()
    server = uvicorn.Server(config)
    server.run(sockets=[listener] if listener is not None else None)
    if engine is not None and engine.failed:
        raise typer.Exit(1)


def _bind_any_port(host: str) -> socket.socket:
    """A listening socket on ``host`` and a port the kernel chose (FLOWHOOK_PORT=0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), 0))
    except OSError as exc:
        sock.close()
        err_console.print(f"[red]error:[/red] cannot listen on {host}: {exc.strerror}")
        raise typer.Exit(2) from None
    return sock


@app.command(hidden=True)
def engine(
    peer_fd: Annotated[int, typer.Option(help="The socket shared with the API process.")],
    parent_pid: Annotated[int, typer.Option(help="The API process.")],
) -> None:
    """The engine process of `flowhook serve` (started by it, not by hand): the worker, the
    webhook dispatcher, the scheduler and retention, woken by the API process."""
    import uvloop

    from flowhook.gctune import tune_for_server
    from flowhook.peer import die_with_parent

    if not die_with_parent(parent_pid):
        raise typer.Exit(1)  # the API process is gone already
    settings = _server_settings()
    sock = socket.socket(fileno=peer_fd)
    tune_for_server()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_work(settings, peer=sock))


@app.command()
def api(
    host: Annotated[
        str | None, typer.Option(help="Overrides FLOWHOOK_HOST.", show_default=False)
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Overrides FLOWHOOK_PORT.", show_default=False)
    ] = None,
    workers: Annotated[int, typer.Option(help="HTTP worker processes.", min=1)] = 1,
    database_url: DatabaseOpt = None,
    access_log: AccessLogOpt = False,
) -> None:
    """Run the HTTP API only (no engine): scale it out beside `flowhook worker` processes."""
    import uvicorn

    settings = _server_settings(host=host, port=port, database_url=database_url)
    _hold(settings)
    _with_db(settings, lambda db: _noop())
    listener = _bind_any_port(settings.host) if settings.port == 0 else None
    if listener is not None:
        settings = settings.model_copy(update={"port": listener.getsockname()[1]})
        print(f"listening on http://{settings.host}:{settings.port}", flush=True)
    os.environ["FLOWHOOK_DATABASE_URL"] = settings.database_url  # the worker processes read it
    os.environ["FLOWHOOK_PORT"] = str(settings.port)
    config = uvicorn.Config(
        "flowhook.app:api_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=access_log,
        log_config=None,
        timeout_keep_alive=int(settings.http_keep_alive),
        timeout_graceful_shutdown=int(settings.shutdown_grace),
    )
    if workers > 1:  # as uvicorn.run does it, on the socket bound here when there is one
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[listener or config.bind_socket()]).run()
        return
    server = uvicorn.Server(config)
    server.run(sockets=[listener] if listener is not None else None)
    if not server.started:
        raise typer.Exit(3)  # uvicorn.run's exit for a server that could not start


async def _noop() -> None:
    return None


@app.command()
def worker(
    concurrency: Annotated[
        int | None,
        typer.Option(help="Runs at once (FLOWHOOK_WORKER_CONCURRENCY).", show_default=False),
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Run the engine, the webhook dispatcher, the scheduler and retention, without HTTP.
    SIGTERM drains: no new work, FLOWHOOK_SHUTDOWN_GRACE seconds for what is in flight, then
    unfinished runs are handed back to the other workers."""
    from flowhook.gctune import tune_for_server

    settings = _server_settings(worker_concurrency=concurrency, database_url=database_url)
    _hold(settings)
    tune_for_server()
    asyncio.run(_work(settings))


async def _work(settings: Settings, peer: Any = None) -> None:
    """The engine until SIGTERM or SIGINT (or, for ``serve``'s engine process, until its API
    process is gone: ``peer`` is the socket shared with it)."""
    from flowhook import tracing
    from flowhook.clock import SystemClock
    from flowhook.peer import PeerLink, attach_engine, log_lock_waits
    from flowhook.runtime import Runtime
    from flowhook.service import Services
    from flowhook.store.migrate import migrate

    db = _database(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if peer is not None:  # Ctrl-C reaches both; the API process drains first, then stops this
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    link: PeerLink | None = None
    tracing.start(settings.otel_endpoint)
    try:
        if peer is not None:
            link = PeerLink(peer, on_lost=stop.set)
            if db.listen_dsn is None:  # else the database's NOTIFY tells every process
                attach_engine(link, db)
            link.start()
        else:
            await migrate(db)  # serve's API process migrated before it started this one
        clock = SystemClock()
        runtime = Runtime(db, clock, settings, Services(db, clock, settings, db.wakeups["runs"]))
        await runtime.start()
        name = "engine" if peer is not None else "worker"
        logging.getLogger("flowhook").info("%s %s started", name, runtime.worker.owner)
        if link is not None:
            link.say("ready")
        await stop.wait()
        if link is not None:
            link.say("stopping")  # the API process stops too (and waits for this one)
        logging.getLogger("flowhook").info(
            "%s draining (grace %.0f s)", name, settings.shutdown_grace
        )
        await runtime.stop()
    finally:
        if link is not None:
            link.close()
            log_lock_waits("engine")
        await db.dispose()
        tracing.stop()


@app.command()
def prune(
    days: Annotated[
        float | None, typer.Option(help="Overrides FLOWHOOK_RETENTION_DAYS.", show_default=False)
    ] = None,
    database_url: DatabaseOpt = None,
) -> None:
    """Prune now what retention allows: finished runs older than the retention period, with
    their history; delivered events' bodies older than FLOWHOOK_DELIVERY_RETENTION_DAYS; then,
    on SQLite, give the freed pages back; past FLOWHOOK_DISK_BUDGET_MB, the oldest finished runs."""
    from flowhook.clock import SystemClock
    from flowhook.gctune import tune_for_server

    settings = _settings(database_url=database_url)
    tune_for_server()  # a full collection mid-batch would hold the writer for its length

    async def work(db: Database) -> Any:
        from flowhook.service.retention import RetentionService

        s = settings
        return await RetentionService(
            db, SystemClock(), s.retention_days, s.delivery_retention_days, s.disk_budget_bytes
        ).prune_all(days)

    done = _with_db(settings, work)
    console.print(f"removed {done.runs} finished runs and {done.signals} signals")
    if done.pages_freed:
        console.print(f"gave back {done.pages_freed} free pages to the file system")
    if done.over_budget:
        console.print(f"removed the {done.over_budget} oldest finished runs past the disk budget")


@app.command()
def vacuum(database_url: DatabaseOpt = None) -> None:
    """Give the database's free space back. SQLite: a database made before incremental
    auto-vacuum is converted once (a full VACUUM: it rewrites the file, needs as much free
    disk as the file, and makes writers wait meanwhile); one already converted gives its free
    pages back. PostgreSQL: VACUUM (ANALYZE)."""
    settings = _settings(database_url=database_url)

    async def work(db: Database) -> Any:
        from flowhook.store import space

        async with db.read() as conn:
            was = await space.storage(conn)
        converted, took = await space.convert_to_incremental(db)
        async with db.read() as conn:
            now = await space.storage(conn)
        return was, now, converted, took

    was, now, converted, took = _with_db(settings, work)
    mib = 1024 * 1024
    what = "converted to incremental auto-vacuum" if converted else "vacuumed"
    console.print(
        f"{what} in {took:.1f} s: {was.size_bytes / mib:,.1f} MiB → {now.size_bytes / mib:,.1f} MiB"
    )


@app.command("migrate")
def migrate_cmd(database_url: DatabaseOpt = None) -> None:
    """Bring the database schema up to date (also done on every start)."""
    settings = _settings(database_url=database_url)

    async def work(db: Database) -> None:
        return None

    _with_db(settings, work)
    console.print("schema is up to date")


@keys_app.command("create")
def keys_create(
    mode: Annotated[KeyMode, typer.Option("--mode", help="test (sandbox) or live.")],
    workspace: Annotated[
        str, typer.Option("--workspace", help="Created when missing.")
    ] = "default",
    label: Annotated[
        str | None,
        typer.Option(
            "--label", help='What the key is for, in words ("CI deploys"); ≤ 100 characters.'
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    database_url: DatabaseOpt = None,
) -> None:
    """Create an API key; the key is printed once and stored only as a hash."""
    from flowhook.clock import SystemClock
    from flowhook.errors import InvalidInput
    from flowhook.service.auth import KeyService, clean_label
    from flowhook.store.models import Mode

    settings = _settings(database_url=database_url)
    if not workspace.strip() or len(workspace) > 200:
        err_console.print("[red]error:[/red] --workspace must be 1 to 200 characters")
        raise typer.Exit(2)
    try:
        label = clean_label(label)
    except InvalidInput as exc:
        err_console.print(f"[red]error:[/red] --label: {exc.message}")
        raise typer.Exit(2) from None
    created = _with_db(
        settings,
        lambda db: KeyService(db, SystemClock()).create(Mode(mode), workspace, label=label),
    )
    if as_json:
        print(
            json.dumps(
                {
                    "key": created.key,
                    "id": created.api_key.id,
                    "workspace": workspace,
                    "mode": str(mode),
                    "label": label,
                }
            )
        )
    else:
        from rich.markup import escape

        named = f', label "{escape(label)}"' if label else ""
        console.print(
            f"{created.key}\n[dim]id {created.api_key.id}, workspace {escape(workspace)}, "
            f"mode {mode}{named}; shown once.[/dim]",
            highlight=False,
            soft_wrap=True,  # the key and the line beside it are never broken
        )


@keys_app.command("list")
def keys_list(
    workspace: Annotated[str | None, typer.Option("--workspace")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    database_url: DatabaseOpt = None,
) -> None:
    """List API keys (their prefixes; the keys themselves are never stored)."""
    from flowhook.clock import SystemClock, isoformat
    from flowhook.service.auth import KeyService

    settings = _settings(database_url=database_url)
    keys = _with_db(settings, lambda db: KeyService(db, SystemClock()).list(workspace))
    rows = [
        {
            "id": k.id,
            "workspace": k.workspace_name,
            "mode": str(k.mode),
            "label": k.label,
            "prefix": k.prefix + "…",
            "created_at": isoformat(k.created_at),
            "last_used_at": isoformat(k.last_used_at) if k.last_used_at else None,
            "revoked_at": isoformat(k.revoked_at) if k.revoked_at else None,
        }
        for k in keys
    ]
    if as_json:
        print(json.dumps(rows))
        return
    from rich.markup import escape

    table = Table("id", "label", "workspace", "mode", "prefix", "created", "last used", "revoked")
    for r in rows:
        table.add_row(
            r["id"], escape(r["label"] or ""), r["workspace"], r["mode"], r["prefix"], r["created_at"],
            r["last_used_at"] or "never", r["revoked_at"] or "",
        )  # fmt: skip
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (key_…), from `flowhook keys list`.")],
    database_url: DatabaseOpt = None,
) -> None:
    """Revoke an API key: every running server refuses it within a second."""
    from flowhook.clock import SystemClock
    from flowhook.service.auth import KeyService

    settings = _settings(database_url=database_url)
    key = _with_db(settings, lambda db: KeyService(db, SystemClock()).revoke(key_id))
    console.print(f"revoked {key.id} ({key.prefix}…)")


@secrets_app.command("generate-key")
def secrets_generate_key() -> None:
    """Print a new key for FLOWHOOK_SECRET_KEY (32 random bytes, URL-safe base64)."""
    from flowhook.store.crypto import generate_key

    print(generate_key())


@secrets_app.command("rotate")
def secrets_rotate(database_url: DatabaseOpt = None) -> None:
    """Re-encrypt every stored secret under the newest key (the first in FLOWHOOK_SECRET_KEY),
    in batches; afterwards the older keys may be dropped. Safe to run again."""
    settings = _settings(database_url=database_url)

    async def work(db: Database) -> dict[str, int]:
        from flowhook.store.secrets import reseal_in_batches

        done = await reseal_in_batches(db, db.keyring.box(), mode="rotate")
        done.raise_if_unreadable(db.keyring.box().source)
        return done.sealed

    sealed = _with_db(settings, work)
    console.print(
        f"re-encrypted {sealed['endpoints']} endpoint secrets, {sealed['hooks']} hook secrets "
        f"and {sealed['step_secrets']} step secrets under the newest key"
    )


@db_app.command("copy")
def db_copy(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The PostgreSQL database to copy into (postgresql://…): empty; migrated here.",
            show_default=False,
        ),
    ],
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="The database to copy: a SQLite file's path or a URL "
            "(default FLOWHOOK_DATABASE_URL).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Copy every row (workspaces, keys, flows, runs, events, deliveries, endpoints with
    their secrets sealed, hooks, schedules, signals, approvals, tasks…) into an empty
    PostgreSQL database, in one transaction, and check each table's row count. Stop the
    servers on the source first. Says which FLOWHOOK_SECRET_KEY the new servers need."""
    from flowhook.cli_copy import Interrupted, ProgressLines, run, source_url, summary
    from flowhook.config import database_backend
    from flowhook.errors import FlowhookError
    from flowhook.store.copy import RESTART, copy_database

    settings = _settings(database_url=source_url(source) if source else None)
    try:
        database_backend(to)
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] --to: {exc}")
        raise typer.Exit(2) from None
    key = settings.secret_key.get_secret_value() if settings.secret_key else None
    work = copy_database(
        settings.database_url, to, secret_key=key, progress=ProgressLines(sys.stderr)
    )
    try:
        copied = run(work)
    except FlowhookError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", soft_wrap=True)
        raise typer.Exit(1) from None
    except Interrupted:
        err_console.print(f"[red]interrupted:[/red] {RESTART}", soft_wrap=True)
        raise typer.Exit(1) from None
    for line in summary(copied):
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def main() -> None:
    from flowhook.cli_remote import register

    register(app)
    app()
