"""The composition root: the one module that puts the API (:mod:`flowhook.api`) and the
pages (:mod:`flowhook.web`) on one app, with the store, the services and the engine's life
around them. Nothing else imports both faces (``tests/unit/test_layers.py`` holds this)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import FastAPI

from flowhook import tracing
from flowhook.api import mount as api
from flowhook.api.allow import install_allow
from flowhook.api.docs_page import install_docs
from flowhook.api.errors import install_error_handlers
from flowhook.api.fast import EXECUTE_PATH, handle_execute
from flowhook.api.middleware import RequestGuard
from flowhook.api.openapi import install_openapi
from flowhook.api.responses import ORJSONResponse
from flowhook.clock import Clock, SystemClock
from flowhook.config import Settings
from flowhook.gctune import tune_for_server
from flowhook.peer import EngineProcess
from flowhook.runtime import Runtime
from flowhook.service import Services
from flowhook.service.auth import RevocationWatch
from flowhook.service.bootstrap import Bootstrapped, bootstrap
from flowhook.serving.streams import running_hub
from flowhook.store.db import Database
from flowhook.store.migrate import migrate
from flowhook.web import mount as web
from flowhook.web.security import PAGE_HEADERS

__all__ = ["create_app", "api_app"]


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
    life = _Life(settings, clock or SystemClock(), run_worker, run_migrations, on_bootstrap, engine)
    app = FastAPI(
        title="Flowhook",
        version="1",
        description="Start workflow runs over HTTP, follow them, and receive signed webhooks.",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # ours, served from the package (api/docs_page.py), not a CDN
        redoc_url=None,
        default_response_class=ORJSONResponse,
        lifespan=life.lifespan,
        # Prometheus metrics are ours (/metrics); FastAPI's OpenTelemetry hooks would look up
        # global providers on every request for nothing.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    api.mount(app)
    web.mount(app)
    _install_edges(app, settings)
    return app


def _install_edges(app: FastAPI, settings: Settings) -> None:
    """What wraps every route of both faces: ``Allow`` on a 405, the OpenAPI document, the
    error handlers (a page's errors as a page), and the request guard in front of all."""
    install_allow(app)  # after every route: Allow for 405s; fixed paths keep their methods
    install_openapi(app)
    install_docs(app)
    install_error_handlers(app, html=web.render_error)
    app.add_middleware(
        RequestGuard,
        max_body=settings.max_request_bytes,
        page_headers=PAGE_HEADERS,
        fast_posts={EXECUTE_PATH: handle_execute},  # the hottest route, ahead of FastAPI's
    )


@dataclass(frozen=True, slots=True)
class _Life:
    """What the app's lifespan starts, in order, and stops, in the reverse order."""

    settings: Settings
    clock: Clock
    run_worker: bool
    run_migrations: bool
    on_bootstrap: Callable[[Bootstrapped], None] | None
    engine: EngineProcess | None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        db = _database(self.settings)
        tracing.start(self.settings.otel_endpoint)
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(tracing.stop)  # last: exports the spans still buffered
            stack.push_async_callback(db.dispose)
            if self.run_migrations:
                await migrate(db)
            services = Services(db, self.clock, self.settings, db.wakeups["runs"])
            app.state.services = services
            stack.push_async_callback(services.runs.active.stop)
            await self._start(app, db, services, stack)
            app.state.hub = await stack.enter_async_context(running_hub(db, services))
            yield

    async def _start(
        self, app: FastAPI, db: Database, services: Services, stack: contextlib.AsyncExitStack
    ) -> None:
        """Watch for revoked keys and queued tasks, seed an empty database when asked, and start the engine:
        the process beside this one, or the worker in this one."""
        revocations = RevocationWatch(db, services.keys)
        stack.push_async_callback(revocations.stop)
        await revocations.start()
        stack.push_async_callback(services.tasks.stop)
        await services.tasks.start()
        if self.on_bootstrap is not None:
            seeded = await bootstrap(db, services.keys, services.flows)
            if seeded is not None:
                self.on_bootstrap(seeded)
        if self.engine is not None:
            stack.push_async_callback(self.engine.stop)
            await self.engine.start(db)
        elif self.run_worker:
            runtime = await _run_worker(app, Runtime(db, self.clock, self.settings, services))
            stack.push_async_callback(runtime.stop)


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
