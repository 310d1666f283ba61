"""The dispatcher loop: claim due deliveries fairly, send each, log every attempt.

Every attempt is logged before it is sent and completed after, in its own transactions, so a
process that dies mid-attempt leaves a log line without an end and the delivery is tried
again (same event id) when its lease runs out. The lease is at least three times the request
timeout, so two processes never send the same attempt. Each endpoint has at most
``per_endpoint`` deliveries in flight in this process, and a claim takes at most that many of
one endpoint: a dead endpoint never holds back the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

import aiohttp

from flowhook.clock import Clock
from flowhook.errors import StoreUnavailable
from flowhook.store import webhooks as store
from flowhook.store.db import Database
from flowhook.store.models import Attempt, DeliveryStatus
from flowhook.store.wakeup import Wakeup
from flowhook.targets import GuardedResolver
from flowhook.webhooks import metrics
from flowhook.webhooks.retry import DEFAULT_SCHEDULE, next_attempt_at
from flowhook.webhooks.sender import build_headers, send

__all__ = ["Dispatcher"]

log = logging.getLogger("flowhook.webhooks")


class Dispatcher:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        wakeup: Wakeup,
        *,
        owner: str,
        concurrency: int = 64,
        per_endpoint: int = 8,
        timeout: float = 10.0,
        schedule: Sequence[float] = DEFAULT_SCHEDULE,
        max_attempts: int = 4,
        disable_after: float = 5 * 86400,
        allow_private_targets: bool = False,
        retry_throttled: bool = False,
        poll_interval: float = 5.0,
    ) -> None:
        self.db = db
        self.clock = clock
        self.wakeup = wakeup
        self.owner = owner
        self.concurrency = concurrency
        self.per_endpoint = per_endpoint
        self.timeout = timeout
        self.schedule = tuple(schedule)
        self.max_attempts = max_attempts
        self.disable_after = timedelta(seconds=disable_after)
        self.allow_private = allow_private_targets
        self.retry_throttled = retry_throttled
        self.poll_interval = poll_interval
        self.lease = timedelta(seconds=3 * timeout + 1)
        self.http: aiohttp.ClientSession | None = None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._per_endpoint: Counter[str] = Counter()
        self._stopping = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        if self.http is None:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(allow_private=self.allow_private),
                limit=self.concurrency,
                limit_per_host=self.per_endpoint * 4,
            )
            self.http = aiohttp.ClientSession(connector=connector)

    async def start(self) -> None:
        await self.open()
        self._loop_task = asyncio.create_task(self._loop(), name="flowhook-dispatcher")

    async def stop(self, grace: float = 10.0) -> None:
        self._stopping.set()
        self.wakeup.notify()
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), timeout=grace)
        tasks = [*self._inflight.values(), *([self._loop_task] if self._loop_task else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.http is not None:
            await self.http.close()
            self.http = None

    async def run_once(self) -> int:
        """Claim and start what is due now; how many deliveries were claimed."""
        free = self.concurrency - len(self._inflight)
        if free <= 0:
            return 0
        busy = [ep for ep, n in self._per_endpoint.items() if n >= self.per_endpoint]
        now = self.clock.now()
        async with self.db.transaction() as conn:
            claimed = await store.claim_deliveries(
                conn,
                owner=self.owner,
                now=now,
                lease_until=now + self.lease,
                limit=free,
                per_endpoint=self.per_endpoint,
                busy_endpoints=busy,
            )
        for due in claimed:
            self._per_endpoint[due.endpoint_id] += 1
            self._inflight[due.id] = asyncio.create_task(self._deliver(due))
        return len(claimed)

    async def drain(self) -> None:
        while self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    async def _deliver(self, due: store.DueDelivery) -> None:
        try:
            await self._attempt(due)
        except StoreUnavailable:
            log.warning("delivery %s: store unavailable; retried when its lease ends", due.id)
        except Exception:
            log.exception("delivery %s: unexpected error", due.id)
        finally:
            self._inflight.pop(due.id, None)
            self._per_endpoint[due.endpoint_id] -= 1
            if self._per_endpoint[due.endpoint_id] <= 0:
                del self._per_endpoint[due.endpoint_id]
            self.wakeup.notify()

    async def _attempt(self, due: store.DueDelivery) -> None:
        assert self.http is not None, "open() first"
        now = self.clock.now()
        if due.url is None or not due.enabled:
            reason = "the endpoint was deleted" if due.url is None else "the endpoint is disabled"
            async with self.db.transaction() as conn:
                await store.fail_delivery(conn, due.id, owner=self.owner, error=reason, now=now)
            return
        number = due.attempts + 1
        async with self.db.transaction() as conn:
            if not await store.start_attempt(
                conn, due.id, owner=self.owner, number=number, now=now
            ):
                return
        previous = due.previous_secret
        if previous and (
            due.previous_secret_expires_at is None or due.previous_secret_expires_at <= now
        ):
            previous = None
        headers = build_headers(
            body=due.body,
            event_id=due.event_id,
            event_type=due.event_type,
            delivery_id=due.id,
            attempt=number,
            secret=due.secret,
            previous_secret=previous,
            now=now,
        )
        result = await send(
            self.http,
            due.url,
            due.body,
            headers,
            timeout=self.timeout,
            allow_private=self.allow_private,
            retry_throttled=self.retry_throttled,
        )
        finished = self.clock.now()
        next_at: datetime | None = None
        if result.delivered:
            status = DeliveryStatus.SUCCEEDED
        elif result.retryable:
            next_at = next_attempt_at(
                number, finished, schedule=self.schedule, max_attempts=self.max_attempts
            )
            if next_at is not None and result.retry_after is not None:
                next_at = max(next_at, finished + timedelta(seconds=result.retry_after))
            status = DeliveryStatus.PENDING if next_at is not None else DeliveryStatus.FAILED
        else:
            status = DeliveryStatus.FAILED
        attempt = Attempt(
            number=number,
            started_at=now,
            finished_at=finished,
            duration_ms=result.duration_ms,
            address=result.address,
            status_code=result.status_code,
            response_excerpt=result.excerpt,
            error_class=result.error_class,
            error_detail=result.error_detail,
            next_attempt_at=next_at,
        )
        last_error = f"{result.error_class}: {result.error_detail}" if result.error_class else None
        async with self.db.transaction() as conn:
            if not await store.finish_attempt(
                conn, due.id, owner=self.owner, attempt=attempt, status=status,
                next_attempt_at=next_at, last_error=last_error,
            ):  # fmt: skip
                return
            if status is not DeliveryStatus.PENDING:
                disabled = await store.mark_endpoint_health(
                    conn,
                    due.endpoint_id,
                    succeeded=status is DeliveryStatus.SUCCEEDED,
                    now=finished,
                    disable_before=finished - self.disable_after,
                )
                if disabled:
                    log.warning(
                        "endpoint %s disabled: only failures for %s",
                        due.endpoint_id,
                        self.disable_after,
                    )
        metrics.record_attempt(result.error_class or "delivered", result.duration_ms)
        if result.delivered:
            metrics.record_delivered((finished - due.created_at).total_seconds())

    async def _idle_wait(self) -> None:
        timeout = self.poll_interval
        try:
            async with self.db.read() as conn:
                due = await store.next_due_delivery(conn)
            if due is not None:
                timeout = min(timeout, max(0.0, (due - self.clock.now()).total_seconds()) + 0.005)
        except StoreUnavailable:
            pass
        await self.wakeup.wait(timeout)

    async def _loop(self) -> None:
        backoff = 0.1
        while not self._stopping.is_set():
            self.wakeup.clear()
            try:
                claimed = await self.run_once()
                backoff = 0.1
            except StoreUnavailable:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                log.exception("dispatcher: claim failed")
                await asyncio.sleep(1.0)
                continue
            if claimed and len(self._inflight) < self.concurrency:
                continue
            if len(self._inflight) >= self.concurrency:
                await self.wakeup.wait(self.poll_interval)
            else:
                await self._idle_wait()
