"""The application factory: routes, error handlers, and the life of the store and worker."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from flowhook import tracing
from flowhook.api.allow import install_allow
from flowhook.api.errors import install_error_handlers
from flowhook.api.fast import EXECUTE_PATH, handle_execute
from flowhook.api.middleware import RequestGuard
from flowhook.api.openapi import install_openapi
from flowhook.api.responses import ORJSONResponse
from flowhook.api.routes import (
    approvals,
    flows,
    hooks,
    runs,
    schedules,
    signals,
    streams,
    system,
    tasks,
    webhooks,
)
from flowhook.clock import Clock, SystemClock
from flowhook.config import Settings
from flowhook.gctune import tune_for_server
from flowhook.peer import EngineProcess
from flowhook.runtime import Runtime
from flowhook.service import Services
from flowhook.service.auth import RevocationWatch
from flowhook.service.bootstrap import Bootstrapped, bootstrap
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.web import approvals as web_approvals
from flowhook.web import overview as web_overview
from flowhook.web import routes as web_routes
from flowhook.web.security import PAGE_HEADERS

__all__ = ["create_app", "api_app"]

log = logging.getLogger("flowhook")


def create_app(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    run_worker: bool = True,
    run_migrations: bool = True,
    on_bootstrap: Callable[[Bootstrapped], None] | None = None,
    engine: EngineProcess | None = None,
) -> FastAPI:
    """The Flowhook ASGI app. Its lifespan opens the store (migrating it), seeds an empty
    database when ``on_bootstrap`` is given, and runs the worker in-process when asked, or
    starts and stops ``engine``, the engine process beside it (``flowhook serve``)."""
    settings = settings or Settings()
    clock = clock or SystemClock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = _database(settings)
        runtime: Runtime | None = None
        started: EngineProcess | None = None
        revocations: RevocationWatch | None = None
        hubs = contextlib.AsyncExitStack()
        tracing.start(settings.otel_endpoint)
        try:
            if run_migrations:
                await migrate(db)
            services = Services(db, clock, settings, db.wakeups["runs"])
            app.state.services = services
            revocations = RevocationWatch(db, services.keys)
            await revocations.start()
            if on_bootstrap is not None:
                seeded = await bootstrap(db, services.keys, services.flows)
                if seeded is not None:
                    on_bootstrap(seeded)
            if engine is not None:
                started = engine
                await engine.start(db)
            elif run_worker:
                runtime = await _run_worker(app, Runtime(db, clock, settings, services))
            app.state.hub = await hubs.enter_async_context(streams.running_hub(db, services))
            yield
        finally:
            await hubs.aclose()
            if started is not None:
                await started.stop()
            if runtime is not None:
                await runtime.stop()
            if revocations is not None:
                await revocations.stop()
            if hasattr(app.state, "services"):
                await app.state.services.runs.active.stop()
            await db.dispose()
            tracing.stop()  # exports the spans still buffered

    app = FastAPI(
        title="Flowhook",
        version="1",
        description="Start workflow runs over HTTP, follow them, and receive signed webhooks.",
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
        default_response_class=ORJSONResponse,
        lifespan=lifespan,
        # Prometheus metrics are ours (/metrics); FastAPI's OpenTelemetry hooks would look up
        # global providers on every request for nothing.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.include_router(system.router)
    app.include_router(runs.router, prefix="/api/v1")
    app.include_router(streams.router, prefix="/api/v1")  # /events/stream before /events/{id}
    app.include_router(flows.router, prefix="/api/v1")
    app.include_router(webhooks.router, prefix="/api/v1")
    app.include_router(hooks.router, prefix="/api/v1")
    app.include_router(schedules.router, prefix="/api/v1")
    app.include_router(signals.router, prefix="/api/v1")
    app.include_router(approvals.router, prefix="/api/v1")
    app.include_router(tasks.router, prefix="/api/v1")
    app.include_router(web_approvals.router)
    app.include_router(web_routes.router)
    app.include_router(web_overview.router)
    app.mount("/static", StaticFiles(directory=web_routes.STATIC_DIR), name="static")
    web_routes.install(app)
    install_allow(app)  # after every route: Allow for 405s; fixed paths keep their methods
    install_openapi(app)
    install_error_handlers(app, html=web_routes.render_error)
    app.add_middleware(
        RequestGuard,
        max_body=settings.max_request_bytes,
        page_headers=PAGE_HEADERS,
        fast_posts={EXECUTE_PATH: handle_execute},  # the hottest route, ahead of FastAPI's
    )
    return app


def _database(settings: Settings) -> Database:
    return Database(
        settings.database_url,
        sqlite_synchronous=settings.sqlite_synchronous,
        secret_key=settings.secret_key,
    )


async def _run_worker(app: FastAPI, runtime: Runtime) -> Runtime:
    """Start the in-process worker, named on ``app.state`` (tests reach it there)."""
    await runtime.start()
    app.state.worker = runtime.worker
    app.state.dispatcher = runtime.dispatcher
    return runtime


def api_app() -> FastAPI:
    """For ``flowhook api --workers N``: an HTTP-only app built from ``FLOWHOOK_*`` (the
    command migrates once before the workers start)."""
    tune_for_server()
    return create_app(Settings(), run_worker=False, run_migrations=False)
