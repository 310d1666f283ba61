"""The application factory: routes, error handlers, and the life of the store and worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from flowhook.api.errors import install_error_handlers
from flowhook.api.middleware import RequestGuard
from flowhook.api.responses import ORJSONResponse
from flowhook.api.routes import flows, hooks, runs, schedules, system, webhooks
from flowhook.clock import Clock, SystemClock
from flowhook.config import Settings, parse_duration
from flowhook.engine.worker import Worker
from flowhook.service import Services
from flowhook.service.bootstrap import Bootstrapped, bootstrap
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.store.runs import NOTIFY_CHANNEL
from flowhook.store.wakeup import PgListener
from flowhook.store.webhooks import DELIVERY_CHANNEL
from flowhook.web import routes as web_routes
from flowhook.webhooks.dispatcher import Dispatcher

__all__ = ["create_app"]

log = logging.getLogger("flowhook")


def create_app(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    run_worker: bool = True,
    run_migrations: bool = True,
    on_bootstrap: Callable[[Bootstrapped], None] | None = None,
) -> FastAPI:
    """The Flowhook ASGI app. Its lifespan opens the store (migrating it), seeds an empty
    database when ``on_bootstrap`` is given, and runs the worker in-process when asked."""
    settings = settings or Settings()
    clock = clock or SystemClock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
        wakeup = db.wakeups["runs"]
        listener: PgListener | None = None
        worker: Worker | None = None
        dispatcher: Dispatcher | None = None
        scheduler: asyncio.Task[None] | None = None
        stopping = asyncio.Event()
        try:
            if run_migrations:
                await migrate(db)
            services = Services(db, clock, settings, wakeup)
            app.state.services = services
            if on_bootstrap is not None:
                seeded = await bootstrap(db, services.keys, services.flows)
                if seeded is not None:
                    on_bootstrap(seeded)
            if run_worker:
                if not db.is_sqlite:
                    listener = PgListener(
                        settings.database_url.replace("+asyncpg", ""),
                        {NOTIFY_CHANNEL: wakeup, DELIVERY_CHANNEL: db.wakeups["deliveries"]},
                    )
                    await listener.start()
                worker = Worker(
                    db,
                    clock,
                    wakeup,
                    concurrency=settings.worker_concurrency,
                    lease_seconds=settings.lease_seconds,
                    poll_interval=settings.poll_interval,
                    max_claims=settings.max_claims,
                    allow_private_targets=settings.allow_private_targets,
                    plugins=settings.plugin_modules,
                )
                await worker.start()
                app.state.worker = worker
                dispatcher = Dispatcher(
                    db,
                    clock,
                    db.wakeups["deliveries"],
                    owner=worker.owner,
                    concurrency=settings.dispatcher_concurrency,
                    per_endpoint=settings.webhook_endpoint_concurrency,
                    timeout=settings.webhook_timeout,
                    schedule=settings.retry_schedule,
                    max_attempts=settings.webhook_max_attempts,
                    disable_after=parse_duration(settings.webhook_disable_after),
                    allow_private_targets=settings.allow_private_targets,
                    retry_throttled=settings.webhook_retry_throttled,
                    poll_interval=settings.poll_interval,
                )
                await dispatcher.start()
                app.state.dispatcher = dispatcher
                scheduler = asyncio.create_task(
                    services.schedules.run_forever(stopping), name="flowhook-scheduler"
                )
            yield
        finally:
            stopping.set()
            if scheduler is not None:
                await scheduler
            if dispatcher is not None:
                await dispatcher.stop()
            if worker is not None:
                await worker.stop()
            if listener is not None:
                await listener.stop()
            await db.dispose()

    app = FastAPI(
        title="Flowhook",
        version="1",
        description="Start workflow runs over HTTP, follow them, and receive signed webhooks.",
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
        default_response_class=ORJSONResponse,
        lifespan=lifespan,
    )
    app.include_router(system.router)
    app.include_router(runs.router, prefix="/api/v1")
    app.include_router(flows.router, prefix="/api/v1")
    app.include_router(webhooks.router, prefix="/api/v1")
    app.include_router(hooks.router, prefix="/api/v1")
    app.include_router(schedules.router, prefix="/api/v1")
    app.include_router(web_routes.router)
    app.mount("/static", StaticFiles(directory=web_routes.STATIC_DIR), name="static")
    web_routes.install(app)
    install_error_handlers(app, html=web_routes.render_error)
    app.add_middleware(RequestGuard, max_body=settings.max_request_bytes)
    return app
