"""The worker: claim due runs in batches, run each as an asyncio task, keep leases alive,
and interrupt runs someone cancelled.

The claim loop, its idle wait, start, stop and drain are the skeleton the webhook
dispatcher shares (:class:`~flowhook.consumer.Consumer`). It never holds more than
``concurrency`` runs. Runs' progress is written by one
:class:`~flowhook.group_commit.GroupCommit`; stopping waits for it, then hands back the runs
it cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import aiohttp

from flowhook import logs
from flowhook.clock import Clock
from flowhook.consumer import Consumer
from flowhook.engine.executor import DEFAULT_MAX_OUTPUT_BYTES, Executor
from flowhook.errors import StoreUnavailable, WriteConflict
from flowhook.group_commit import GroupCommit
from flowhook.plugins import load_plugins
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store.db import Connection as AsyncConnection
from flowhook.store.db import Database
from flowhook.store.deliveries import Handoff
from flowhook.store.models import Run, RunStatus
from flowhook.store.wakeup import Wakeup
from flowhook.targets import guarded_connector

__all__ = ["Worker", "new_owner_id", "redo_alone", "CANCEL_CHECK_SECONDS"]

log = logging.getLogger("flowhook.engine")

CANCEL_CHECK_SECONDS = 0.5
"""How often a worker looks for cancel requests on the runs it holds."""

PROGRESS_BATCH = 64
"""Runs' progress per group-commit transaction. On SQLite a transaction runs on the event
loop's thread, so a smaller batch keeps the API answering between them (accept p99 under
load) at the cost of a few more commits."""


def redo_alone(exc: BaseException) -> bool:
    """Whether a failed progress batch is redone one run at a time (``GroupCommit``'s
    ``isolate``), so one run's bad write fails that run alone. Safe when the transaction is
    known to have written nothing: any error raised before COMMIT, a COMMIT the server
    refused, and a lost lock conflict that outlived its retries (:class:`WriteConflict`).
    Not when the connection was lost (a COMMIT may have landed: the runs resume from what
    the database holds), nor on cancellation."""
    if not isinstance(exc, Exception):
        return False
    return isinstance(exc, WriteConflict) or not isinstance(exc, StoreUnavailable)


class Taker(Protocol):
    """What takes the deliveries a progress transaction queues (the webhook dispatcher)."""

    def handoff(self) -> Handoff | None: ...

    def adopt(self, handoff: Handoff) -> None: ...

    def drop(self, handoff: Handoff) -> None: ...


def new_owner_id() -> str:
    return f"{socket.gethostname()[:32]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker(Consumer):
    _name = "worker"
    _log = log

    def __init__(
        self,
        db: Database,
        clock: Clock,
        wakeup: Wakeup,
        *,
        concurrency: int = 64,
        lease_seconds: float = 30.0,
        poll_interval: float = 5.0,
        max_claims: int = 5,
        allow_private_targets: bool = False,
        max_step_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        max_map_items: int = 1000,
        max_run_tree: int = 10_000,
        plugins: list[str] | None = None,
        owner: str | None = None,
        public_url: str = "http://127.0.0.1:8080",
    ) -> None:
        super().__init__(
            db,
            clock,
            wakeup,
            owner or new_owner_id(),
            capacity=concurrency,
            poll=poll_interval,
        )
        self.concurrency = concurrency
        self.lease = timedelta(seconds=lease_seconds)
        self._max_claims = max_claims
        self._allow_private = allow_private_targets
        self._max_output = max_step_output_bytes
        self._max_map_items = max_map_items
        self._max_run_tree = max_run_tree
        load_plugins(plugins or [])
        self.dispatcher: Taker | None = None
        """The dispatcher of this process, which takes the deliveries the progress
        transactions queue (``None``: they are claimed from the queue)."""
        self._writes: GroupCommit[runs_store.Progress, bool] = GroupCommit(
            self._commit_progress, max_batch=PROGRESS_BATCH, isolate=redo_alone
        )
        self.executor = Executor(
            db,
            clock,
            self.owner,
            max_claims=max_claims,
            max_output_bytes=max_step_output_bytes,
            max_map_items=max_map_items,
            max_run_tree=max_run_tree,
            apply=self._writes.submit,
            public_url=public_url,
        )
        self._public_url = public_url
        self._turns = runs_store.Turns()
        """Which workspace's queue had the last turn of this worker's claims."""

    async def open(self) -> None:
        """Create the shared HTTP session (without starting the loops; tests drive run_once)."""
        if self.http is None:
            connector = guarded_connector(allow_private=self._allow_private, limit=256)
            self.http = aiohttp.ClientSession(connector=connector)
            self.executor = Executor(
                self.db,
                self.clock,
                self.owner,
                http=self.http,
                allow_private_targets=self._allow_private,
                max_claims=self._max_claims,
                max_output_bytes=self._max_output,
                max_map_items=self._max_map_items,
                max_run_tree=self._max_run_tree,
                apply=self._writes.submit,
                public_url=self._public_url,
            )

    async def _commit_progress(self, batch: Sequence[runs_store.Progress]) -> list[bool]:
        """Group commit: the progress of every run that reached a write meanwhile, in one
        transaction, run again if it loses a lock conflict (it wrote nothing then). With a
        dispatcher in this process (``handoff``), the deliveries the transaction queues go
        to it claimed, and it starts them once the transaction has committed."""
        taker = self.dispatcher
        handoff = taker.handoff() if taker is not None else None

        async def write(conn: AsyncConnection) -> list[bool]:
            if handoff is not None:
                handoff.reset()  # a try that rolled back took nothing
            return await runs_store.apply_progress(conn, batch, owner=self.owner, handoff=handoff)

        if taker is None or handoff is None:
            return await self.db.retrying(write)
        try:
            applied = await self.db.retrying(write)
        except BaseException:
            taker.drop(handoff)
            raise
        try:
            taker.adopt(handoff)
        except Exception:  # committed all the same: its deliveries go when their lease ends
            log.exception("worker: the dispatcher could not take the deliveries handed over")
        return applied

    def _side_loops(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {"flowhook-heartbeat": self._heartbeat(), "flowhook-cancels": self._watch_cancels()}

    async def _stopped(self, unfinished: list[str]) -> None:
        """Once the progress written so far is committed, hand back the runs ``stop``
        cancelled, so another process resumes them at once."""
        await self._writes.wait_idle()
        if not unfinished:
            return
        try:
            handed = await self.db.retrying(
                lambda conn: runs_store.hand_back(
                    conn, owner=self.owner, run_ids=unfinished, now=self.clock.now()
                )
            )
            log.info("worker: handed back %d unfinished runs", handed)
        except Exception:
            log.exception("worker: hand-back failed; the runs resume when their leases end")

    async def _claim(self, limit: int) -> int:
        now = self.clock.now()
        async with self.db.statement() as conn:  # a read of the queues, one UPDATE … RETURNING
            claimed = await runs_store.claim_runs(
                conn,
                owner=self.owner,
                now=now,
                lease_until=now + self.lease,
                limit=limit,
                turns=self._turns,
            )
            # runs of a paused flow that have not started are handed back held: read after
            # the claim, so a pause committed before it is seen (a run claimed before the
            # pause starts: it was in a worker's hands)
            fresh = {r.flow_id for r in claimed if r.status is RunStatus.QUEUED}
            paused = await flows_store.paused_at(conn, sorted(fresh)) if fresh else {}
        for run in claimed:
            self._inflight[run.run_id] = asyncio.create_task(
                self._execute(run, paused=run.flow_id in paused)
            )
        return len(claimed)

    async def _next_due(self, conn: AsyncConnection) -> datetime | None:
        return await runs_store.next_due(conn)

    async def _execute(self, run: Run, *, paused: bool = False) -> None:
        logs.run_id.set(run.run_id)
        logs.flow_id.set(run.flow_id)
        left: RunStatus | None = None
        try:
            left = await self.executor.execute(run, paused=paused)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, WriteConflict):
                log.error("run %s: its progress could not be written: %s", run.run_id, exc)
            elif isinstance(exc, StoreUnavailable):
                log.warning("run %s: store unavailable (%s)", run.run_id, exc)
            else:
                log.exception("run %s: unexpected error in the engine", run.run_id)
            await self._release(run.run_id)
        finally:
            was_full = len(self._inflight) >= self.concurrency
            self._inflight.pop(run.run_id, None)
            # Claim again when runs may be waiting for room, or when this run was handed back
            # until a time the idle wait does not know yet (a delay, a retry backoff, a flow's
            # concurrency cap); not after every finished run (that claim found nothing most
            # of the time, and cost a write transaction).
            if was_full or (left is not None and not left.terminal):
                self.wakeup.notify()

    async def _release(self, run_id: str) -> None:
        """Hand back a run whose write failed, at once: it resumes from its last committed
        step (here or in another worker) instead of waiting for its lease to end. The claim
        counts (``count_claim``), so a run that can never be written ends ``worker_lost``."""
        try:
            released = await self.db.retrying(
                lambda conn: runs_store.hand_back(
                    conn, owner=self.owner, run_ids=[run_id], now=self.clock.now(), count_claim=True
                )
            )
        except Exception as exc:
            log.warning(
                "run %s: not released (%s); it resumes when its lease expires",
                run_id,
                exc,
                exc_info=not isinstance(exc, StoreUnavailable),
            )
            return
        if released:
            log.warning("run %s: released; it resumes from its last committed step", run_id)
            self.wakeup.notify()

    async def beat(self, run_ids: Sequence[str]) -> int:
        """One heartbeat: extend this worker's leases on ``run_ids`` (retried when it loses a
        lock conflict); how many it still held."""
        until = self.clock.now() + self.lease
        return await self.db.retrying(
            lambda conn: runs_store.extend_leases(
                conn, owner=self.owner, run_ids=run_ids, until=until
            )
        )

    async def _heartbeat(self) -> None:
        interval = self.lease.total_seconds() / 3
        wait = interval
        while not self._stopping.is_set():
            await asyncio.sleep(wait)
            wait = interval
            held = list(self._inflight)
            if not held:
                continue
            try:
                await self.beat(held)
            except Exception as exc:
                # Not silent, and soon again: two missed beats leave a third of the lease.
                wait = min(interval, 1.0)
                log.error(
                    "worker: heartbeat failed (%s); %d leases not extended, trying again in %.1fs",
                    exc,
                    len(held),
                    wait,
                    exc_info=not isinstance(exc, StoreUnavailable),
                )

    async def _watch_cancels(self) -> None:
        """Interrupt a step in flight when its run is cancelled (an http request, a python
        function awaiting): the executor then ends the run ``cancelled``. A branch or item
        stopped because a sibling failed is not interrupted: it ends at its next write."""
        while not self._stopping.is_set():
            await asyncio.sleep(CANCEL_CHECK_SECONDS)
            busy = [r for r in self.executor.in_step if r in self._inflight]
            if not busy:
                continue
            try:
                async with self.db.read() as conn:
                    wanted = await runs_store.cancel_requested_among(conn, busy)
            except Exception:
                log.exception("worker: cancel check failed")
                continue
            for run_id in wanted:
                task = self._inflight.get(run_id)
                if task is not None and run_id in self.executor.in_step:
                    self.executor.cancelling.add(run_id)
                    task.cancel()
