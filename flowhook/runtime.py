"""The background machinery of a process: worker, dispatcher, scheduler, retention and the
PostgreSQL listener. ``flowhook serve`` runs it beside the API; ``flowhook worker`` runs it
alone. Stopping drains: no new claims, work in flight gets ``shutdown_grace`` seconds, and
runs still unfinished then are handed back at once instead of waiting for their leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from flowhook.clock import Clock
from flowhook.config import Settings, parse_duration
from flowhook.engine.worker import Worker
from flowhook.service import Services
from flowhook.store.db import Database
from flowhook.store.deliveries import DELIVERY_CHANNEL
from flowhook.store.runs import NOTIFY_CHANNEL
from flowhook.store.wakeup import PgListener
from flowhook.webhooks.dispatcher import Dispatcher

__all__ = ["Runtime"]

log = logging.getLogger("flowhook")


class Runtime:
    def __init__(self, db: Database, clock: Clock, settings: Settings, services: Services) -> None:
        self.db = db
        self.settings = settings
        self.services = services
        self.listener: PgListener | None = None
        self.worker = Worker(
            db,
            clock,
            db.wakeups["runs"],
            concurrency=settings.worker_concurrency,
            lease_seconds=settings.lease_seconds,
            poll_interval=settings.poll_interval,
            max_claims=settings.max_claims,
            allow_private_targets=settings.allow_private_targets,
            max_step_output_bytes=settings.max_step_output_bytes,
            max_map_items=settings.max_map_items,
            max_run_tree=settings.max_run_tree,
            plugins=settings.plugin_modules,
            public_url=settings.public_url or f"http://{settings.host}:{settings.port}",
        )
        self.dispatcher = Dispatcher(
            db,
            clock,
            db.wakeups["deliveries"],
            owner=self.worker.owner,
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
        self.worker.dispatcher = self.dispatcher  # runs' deliveries go to it claimed
        self._stopping = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        dsn = self.db.listen_dsn
        if dsn is not None:  # other processes' commits are heard: their NOTIFY
            self.listener = PgListener(
                dsn,
                {
                    NOTIFY_CHANNEL: self.db.wakeups["runs"],
                    DELIVERY_CHANNEL: self.db.wakeups["deliveries"],
                },
            )
            await self.listener.start()
        await self.worker.start()
        await self.dispatcher.start()
        self._loops = [
            asyncio.create_task(
                self.services.schedules.run_forever(self._stopping), name="flowhook-scheduler"
            ),
            asyncio.create_task(self._retention(), name="flowhook-retention"),
        ]

    async def stop(self) -> None:
        grace = self.settings.shutdown_grace
        self._stopping.set()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=5)
        await asyncio.gather(self.worker.stop(grace), self.dispatcher.stop(grace))
        if self.listener is not None:
            await self.listener.stop()

    async def _retention(self) -> None:
        """Prune what retention allows (service/retention.py), hourly, in small batches."""
        while not self._stopping.is_set():
            try:
                done = await self.services.retention.prune_all()
                if done.runs or done.pages_freed or done.over_budget:
                    log.info(
                        "retention: removed %d finished runs (%d of them past the disk "
                        "budget) and %d signals; gave back %d pages",
                        done.runs + done.over_budget, done.over_budget, done.signals,
                        done.pages_freed,
                    )  # fmt: skip
                self.services.disk.forget()
            except Exception:
                log.exception("retention: prune failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 3600)
