"""The dispatcher loop: claim due deliveries fairly, send each, log every attempt.

Every attempt is logged before it is sent (its line is written in the claim's transaction)
and completed after, so a process that dies mid-attempt leaves a line without an end and the
delivery is tried again (same event id) when its lease runs out. Completions are written in
groups: whatever finished while the previous group was being committed goes in the next
transaction (a :class:`~flowhook.group_commit.GroupCommit` that gathers for
``COMPLETION_GATHER``), so a busy dispatcher writes a few transactions a second, not one per
delivery. The lease is at least three times the request timeout, so two processes never send
the same attempt. The claim loop, its idle wait, start, stop and drain are the
:class:`~flowhook.consumer.Consumer` skeleton's (shared with the engine's worker).

Requests in flight are capped at ``concurrency`` in all and per endpoint by its
:class:`~flowhook.webhooks.slots.EndpointSlots`: up to ``per_endpoint`` while it answers 2xx
fast, 8 (``slots.SLOW``) while it is slow or failing. The process holds up to ``HOLD``
times as many deliveries as an endpoint's slots (claimed, waiting for a request slot, or
waiting for their completion to commit), so an endpoint's next deliveries are at hand the
moment a response comes in, instead of after a commit and a claim (which held one endpoint
far below its rate: bench/README.md, "Figures moved from docstrings"). A claim takes at
most ``HOLD`` times the slots of a slow endpoint of one endpoint, and none of an endpoint
already holding its share: a slow or dead endpoint ties up at most 8 request slots and never
holds back the others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial

from flowhook import tracing
from flowhook.clock import Clock
from flowhook.consumer import Consumer
from flowhook.defaults import (
    WEBHOOK_DISABLE_AFTER_DAYS,
    WEBHOOK_MAX_ATTEMPTS,
    WEBHOOK_RETRY_SCHEDULE,
    WEBHOOK_TIMEOUT,
)
from flowhook.errors import StoreUnavailable
from flowhook.group_commit import GroupCommit
from flowhook.store import attempts, delivery_queue, endpoints, pausing
from flowhook.store.db import Connection, Database
from flowhook.store.deliveries import FIFO, Handoff
from flowhook.store.delivery_queue import DueDelivery
from flowhook.store.error_classes import ErrorClass
from flowhook.store.models import Attempt, DeliveryStatus
from flowhook.store.statistics import StatisticsKeeper
from flowhook.store.wakeup import Wakeup
from flowhook.webhooks import metrics
from flowhook.webhooks.retry import next_attempt_at
from flowhook.webhooks.sender import Result, WebhookClient, build_headers, send
from flowhook.webhooks.slots import SLOW, EndpointSlots

__all__ = ["Dispatcher"]

log = logging.getLogger("flowhook.webhooks")

HOLD = 4
"""Deliveries held per request slot (see the module's docstring)."""
CLAIM_BATCH = 64
"""At most this many deliveries per claim: the per-endpoint ranking sorts twice as many."""
PLANNED_TABLES = ("deliveries", "delivery_attempts")
"""Tables whose statistics PostgreSQL plans the claims and completions with: gathered as the
deliveries this process holds grow (see :class:`StatisticsKeeper`)."""
LATE = 0.05
"""Seconds a rate-limited delivery may wake after its slot and still take it: past that it
reserves a new slot (see ``Dispatcher._paced``). Unless a process keeps stalling, any
second then holds at most about ``rate_limit * (1 + LATE) + 1`` sends, and ordinary timer
jitter never costs a slot."""
REPACE = 2
"""How many new slots a rate-limited delivery that keeps waking late reserves before it goes."""
REMEMBER = timedelta(minutes=5)
"""How long an endpoint's slots above the floor are remembered while this process holds none
of its deliveries: past that it starts again at the floor, as a new one does (and a deleted
endpoint's are dropped)."""
COMPLETION_GATHER = 0.005
"""Seconds the completion writer waits before each transaction, gathering completions. The
webhook has been sent by then; this only delays freeing its slot, and it made the write
transactions many times fewer under load (bench/README.md, "Figures moved from
docstrings")."""


class Dispatcher(Consumer):
    _name = "dispatcher"
    _log = log
    _claim_batch = CLAIM_BATCH

    def __init__(
        self,
        db: Database,
        clock: Clock,
        wakeup: Wakeup,
        *,
        owner: str,
        concurrency: int = 64,
        per_endpoint: int = 16,
        timeout: float = WEBHOOK_TIMEOUT,
        schedule: Sequence[float] = WEBHOOK_RETRY_SCHEDULE,
        max_attempts: int = WEBHOOK_MAX_ATTEMPTS,
        disable_after: float = WEBHOOK_DISABLE_AFTER_DAYS * 86400,
        allow_private_targets: bool = False,
        retry_throttled: bool = False,
        poll_interval: float = 5.0,
    ) -> None:
        super().__init__(db, clock, wakeup, owner, capacity=HOLD * concurrency, poll=poll_interval)
        self.concurrency = concurrency
        self.per_endpoint = per_endpoint
        """Requests in flight to one endpoint at most (while it answers fast)."""
        self.slow_slots = min(SLOW, per_endpoint)
        """Requests in flight to an endpoint that is slow or failing, and to start with."""
        self.timeout = timeout
        self.schedule = tuple(schedule)
        self.max_attempts = max_attempts
        self.disable_after = timedelta(seconds=disable_after)
        self.allow_private = allow_private_targets
        self.retry_throttled = retry_throttled
        self.lease = timedelta(seconds=3 * timeout + 1)
        self.client: WebhookClient | None = None
        """The HTTP client of the attempts, from :meth:`open` until the dispatcher stops."""
        self._per_endpoint: Counter[str] = Counter()
        """Deliveries this process holds per endpoint (claimed and not yet completed)."""
        self._sending: dict[str, EndpointSlots] = {}
        """Per endpoint held: its request slots, ``slow_slots`` up to ``per_endpoint``
        (see :class:`EndpointSlots`); and per endpoint resting, its slots above the floor."""
        self._resting: dict[str, datetime] = {}
        """Endpoints whose slots are remembered while nothing of theirs is held: when they
        are forgotten (``REMEMBER`` after they went quiet), soonest first."""
        self._send_slots = asyncio.Semaphore(concurrency)
        """At most ``concurrency`` requests in flight in all."""
        self._leases: dict[str, datetime] = {}
        """When the lease of each held delivery ends."""
        self._handing: list[Handoff] = []
        """Hand-offs whose transaction is open: what they took counts as held."""
        self._passed_over: set[str] = set()
        """Endpoints the claim loop last passed over, at their share: one that gets room
        wakes it."""
        self.statistics = StatisticsKeeper(db, PLANNED_TABLES)
        """Counts the deliveries this process holds, for the statistics of their tables."""
        self._completions: GroupCommit[attempts.Completion, None] = GroupCommit(
            self._commit_completions,
            max_batch=HOLD * concurrency,  # all it may hold: one transaction takes every one
            gather=COMPLETION_GATHER,
        )

    async def open(self) -> None:
        if self.client is None:
            self.client = WebhookClient(allow_private=self.allow_private)

    async def _stopped(self, unfinished: list[str]) -> None:
        """Stop writing completions: one not committed yet is dropped (as if the process
        had died), and its delivery is tried again when its lease ends."""
        await self._completions.cancel()
        self.statistics.cancel()
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def _claim(self, limit: int) -> int:
        now = self.clock.now()
        # One statement on PostgreSQL (autocommit: no BEGIN and COMMIT round trips), a
        # transaction on SQLite (see delivery_queue.claim_deliveries).
        async with self.db.statement() as conn:
            # a hand-off may have taken some while this waited for the connection
            limit = min(limit, self._capacity - self._held())
            if limit <= 0:
                return 0
            claimed = await delivery_queue.claim_deliveries(
                conn,
                owner=self.owner,
                now=now,
                lease_until=now + self.lease,
                limit=limit,
                per_endpoint=HOLD * self.slow_slots,
                busy_endpoints=self._endpoints_at_cap(),
            )
        for due in claimed:
            self._hold(due, now + self.lease)
        return len(claimed)

    def _hold(self, due: DueDelivery, lease_end: datetime) -> None:
        """Start the attempt of a delivery this process has claimed."""
        if due.id in self._inflight:  # pragma: no cover - leases are renewed before they end
            log.warning("delivery %s: claimed again while still held here", due.id)
            return
        self._per_endpoint[due.endpoint_id] += 1
        if due.endpoint_id not in self._sending:
            self._sending[due.endpoint_id] = EndpointSlots(self.slow_slots, self.per_endpoint)
        elif self._resting:
            self._resting.pop(due.endpoint_id, None)
        self._leases[due.id] = lease_end
        self._inflight[due.id] = asyncio.create_task(self._deliver(due))
        # Without statistics of a backlog PostgreSQL read every due delivery's row for each
        # claim's guard, and with a small table's, all of them for each completion.
        self.statistics.wrote(1)

    # -- deliveries handed over by the engine of this process ----------------------------

    def handoff(self) -> Handoff | None:
        """A hand-off for a transaction of this process that queues deliveries (the engine's
        progress): the ones it takes are written claimed by this dispatcher, and
        :meth:`adopt` starts them once that transaction has committed, without a claim
        transaction of their own (:meth:`drop` if it did not commit). What a hand-off took
        counts as held until then. ``None`` before :meth:`open` and while stopping."""
        if self.client is None or self._stopping.is_set():
            return None
        handoff = Handoff(self.owner, self.lease, self.clock.now, self._room)
        self._handing.append(handoff)
        return handoff

    def _room(self, endpoint_id: str) -> bool:
        """Whether one more delivery to ``endpoint_id`` fits in what this process holds."""
        return self._held() < self._capacity and self._held_of(endpoint_id) < self._share(
            endpoint_id
        )

    def _held(self) -> int:
        """Deliveries held: claimed, or taken by a hand-off whose transaction is open."""
        return len(self._inflight) + sum(h.taken.total() for h in self._handing)

    def _held_of(self, endpoint_id: str) -> int:
        return self._per_endpoint[endpoint_id] + sum(h.taken[endpoint_id] for h in self._handing)

    def _share(self, endpoint_id: str) -> int:
        """The deliveries this process holds of one endpoint at most: ``HOLD`` per request
        slot it has now."""
        slots = self._sending.get(endpoint_id)
        return HOLD * (self.slow_slots if slots is None else slots.limit)

    def adopt(self, handoff: Handoff) -> None:
        """Start the deliveries ``handoff`` took, now that their transaction has committed.
        Once stopping, they are left to be claimed again when their lease ends, as a held
        delivery not yet sent is."""
        self._handing.remove(handoff)
        if not handoff.claimed:
            return
        if self._stopping.is_set():
            log.info("dispatcher: %d deliveries handed over while stopping; they go when their "
                     "lease ends", len(handoff.claimed))  # fmt: skip
            return
        metrics.HANDED_OVER.inc(len(handoff.claimed))
        lease_end = (handoff.now or self.clock.now()) + self.lease
        for due in handoff.claimed:
            self._hold(due, lease_end)

    def drop(self, handoff: Handoff) -> None:
        """``handoff``'s transaction did not commit: it took nothing."""
        self._handing.remove(handoff)

    async def _next_due(self, conn: Connection) -> datetime | None:
        # An endpoint at its cap has due deliveries but takes none now: looking past them
        # avoids claiming every 5 ms for nothing; a delivery it finishes wakes the loop.
        return await delivery_queue.next_due_delivery(conn, self._endpoints_at_cap())

    def _endpoints_at_cap(self) -> list[str]:
        """Endpoints holding all the deliveries this process takes of one endpoint: the
        claim loop passes over them (remembered in :attr:`_passed_over`)."""
        endpoints = set(self._per_endpoint).union(*(h.taken for h in self._handing))
        found = sorted(ep for ep in endpoints if self._held_of(ep) >= self._share(ep))
        self._passed_over = set(found)
        return found

    async def _deliver(self, due: DueDelivery) -> None:
        try:
            await self._attempt(due)
        except StoreUnavailable:
            log.warning("delivery %s: store unavailable; retried when its lease ends", due.id)
        except Exception:
            log.exception("delivery %s: unexpected error", due.id)
        finally:
            self._leases.pop(due.id, None)
            # Claim again only if the last claims may have left due work behind for want of
            # room (a claim after every completion found nothing most of the time, and each
            # cost a write transaction): the process was full, or the loop passed over this
            # endpoint and it has room now (its share moves with its slots, so "it was at
            # its cap" is not enough). New deliveries wake the loop themselves.
            endpoint = due.endpoint_id
            was_full = self._held() >= self._capacity
            self._inflight.pop(due.id, None)
            self._per_endpoint[endpoint] -= 1
            if self._per_endpoint[endpoint] <= 0:
                del self._per_endpoint[endpoint]
                self._rest(endpoint)
            if endpoint in self._passed_over and self._held_of(endpoint) < self._share(endpoint):
                self._passed_over.discard(endpoint)
                was_full = True
            if was_full:
                self.wakeup.notify()

    def _rest(self, endpoint: str) -> None:
        """This process holds nothing of ``endpoint`` now: remember its slots if they are
        above the floor (dropping them restarted a busy endpoint at 8 between two claims,
        and cost throughput), and forget those of the endpoints quiet for ``REMEMBER``."""
        now = self.clock.now()
        if self._sending[endpoint].limit > self.slow_slots:
            self._resting[endpoint] = now + REMEMBER  # not resting before: soonest first
        else:
            del self._sending[endpoint]  # at the floor: nothing to remember
        while self._resting:
            quiet = next(iter(self._resting))
            if self._resting[quiet] > now:
                break
            del self._resting[quiet]
            del self._sending[quiet]

    async def _attempt(self, due: DueDelivery) -> None:
        """One attempt: send the request (unless the endpoint is paused, gone or disabled),
        then wait until its outcome is committed."""
        assert self.client is not None, "open() first"
        number = due.attempts  # counted and logged by the claim
        if due.paused_at is not None and await self._put_back(due):
            return
        if due.url is None or not due.enabled:
            await self._complete(self._undeliverable(due, number))
            return
        slots = self._sending[due.endpoint_id]
        async with slots:
            held_from = time.monotonic()
            if due.rate_limit:  # wait for the send time the endpoint's rate gives it
                await self._paced(due)
            async with self._send_slots:
                started = self.clock.now()  # the attempt starts when its request may go out
                if not await self._lease_covers_request(due, started):
                    return  # another process holds it now: it sends this attempt
                assert due.url is not None
                headers = self._headers(due, number, started)
                trace = _trace(due)
                span_id = tracing.delivery_span_id(due.id, number)
                headers["traceparent"] = tracing.header(trace, span_id)
                result = await send(
                    self.client,
                    due.url,
                    due.body,
                    headers,
                    timeout=self.timeout,
                    allow_private=self.allow_private,
                    retry_throttled=self.retry_throttled,
                )
            # the slot's whole time, a rate limit's wait included: a paced endpoint gets no
            # more slots than its rate fills
            slots.answered(result.delivered, time.monotonic() - held_from)
        finished = self.clock.now()
        if tracing.ENABLED:
            _attempt_span(due, number, trace, span_id, started, finished, result)
        await self._complete(self._outcome(due, number, started, finished, result))
        metrics.record_attempt(result.error_class or "delivered", result.duration_ms)
        if result.delivered:
            metrics.record_delivered((finished - due.created_at).total_seconds())

    async def _put_back(self, due: DueDelivery) -> bool:
        """The claim read the endpoint paused (the delivery was queued, or fell due, while
        the pause was on its way): hold it again, no attempt used, unless it was resumed
        since. Rare: a pause holds what is pending, and what is queued after it is queued
        held."""
        held = await self.db.retrying(  # a deadlock broken by PostgreSQL: again
            lambda conn: pausing.put_back(conn, due.id, due.endpoint_id, due.attempts, self.owner)
        )
        if held:
            log.info("delivery %s: endpoint %s is paused; held again", due.id, due.endpoint_id)
        return held

    async def _paced(self, due: DueDelivery) -> None:
        """Reserve this delivery's send time on its endpoint's shared schedule (at most
        ``rate_limit`` a second across every process) and sleep until then.

        A delivery that comes to its send more than ``LATE`` after its slot (the process
        stalled while it slept, or the reservation's commit was slow) reserves a new one:
        otherwise every delivery whose slot fell in a stall would go out at once, more than
        ``rate_limit`` in a second. It does so at most ``REPACE`` times, so a process that
        keeps stalling still sends."""
        for _ in range(1 + REPACE):
            async with self.db.transaction() as conn:
                slot = await endpoints.reserve_send(conn, due.endpoint_id, self.clock.now())
            await self.clock.sleep_until(slot)
            if (self.clock.now() - slot).total_seconds() <= LATE:
                return

    def _undeliverable(self, due: DueDelivery, number: int) -> attempts.Completion:
        """The failed attempt of a delivery whose endpoint was deleted or disabled."""
        now = self.clock.now()
        gone = due.url is None
        kind = ErrorClass.ENDPOINT_DELETED if gone else ErrorClass.ENDPOINT_DISABLED
        return attempts.Completion(
            due.id,
            due.endpoint_id,
            Attempt(
                number, now, now, 0,
                error_class=kind,
                error_detail="the endpoint was deleted" if gone else "the endpoint is disabled",
            ),
            DeliveryStatus.FAILED,
            None,
            "the endpoint was deleted" if gone else "the endpoint is disabled",
            fifo=due.ordering == FIFO,
        )  # fmt: skip

    @staticmethod
    def _headers(due: DueDelivery, number: int, now: datetime) -> dict[str, str]:
        """The signed headers of attempt ``number``: the previous secret signs too until it
        expires."""
        previous = due.previous_secret
        if previous and (
            due.previous_secret_expires_at is None or due.previous_secret_expires_at <= now
        ):
            previous = None
        return build_headers(
            body=due.body,
            event_id=due.event_id,
            event_type=due.event_type,
            delivery_id=due.id,
            attempt=number,
            secret=due.secret,
            previous_secret=previous,
            now=now,
        )

    def _outcome(
        self,
        due: DueDelivery,
        number: int,
        started: datetime,
        finished: datetime,
        result: Result,
    ) -> attempts.Completion:
        """What becomes of the delivery after this attempt's ``result``: succeeded, pending
        (a retryable failure with attempts left, never sooner than a Retry-After), or failed."""
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
            started_at=started,
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
        return attempts.Completion(
            due.id, due.endpoint_id, attempt, status, next_at, last_error,
            fifo=due.ordering == FIFO,
        )  # fmt: skip

    async def _lease_covers_request(self, due: DueDelivery, now: datetime) -> bool:
        """A held delivery may wait for a request slot (a slow endpoint answers its earlier
        ones first): when what is left of its lease could not cover a whole request, renew
        the lease first, so no other process can claim and send it meanwhile. ``False`` when
        the lease was already lost."""
        until = self._leases.get(due.id)
        if until is None or until - now > timedelta(seconds=self.timeout + 1):
            return True
        async with self.db.transaction() as conn:
            renewed = await delivery_queue.renew_delivery_lease(
                conn, due.id, owner=self.owner, until=now + self.lease
            )
        if renewed:
            self._leases[due.id] = now + self.lease
        else:
            log.warning("delivery %s: lease lost while it waited; not sent here", due.id)
        return renewed

    async def _complete(self, completion: attempts.Completion) -> None:
        """Queue a completion for the next group commit and wait until it is durable."""
        await self._completions.submit(completion)
        if completion.status is DeliveryStatus.PENDING:
            self.wakeup.notify()  # a retry is due: the idle wait may be longer than its backoff

    async def _commit_completions(self, completions: Sequence[attempts.Completion]) -> list[None]:
        """One group commit, run again if it loses a lock conflict (it wrote nothing then)."""
        await self.db.retrying(partial(self._write_completions, completions=completions))
        return [None] * len(completions)

    async def _write_completions(
        self, conn: Connection, completions: Sequence[attempts.Completion]
    ) -> None:
        """One group commit of finished attempts, and endpoint health: per endpoint, the last
        final outcome of the group; endpoints in id order (the lock order rule), so two
        processes marking the same endpoints cannot deadlock."""
        final = {c.endpoint_id: c for c in completions if c.status is not DeliveryStatus.PENDING}
        # Only successes (the usual group): their endpoints' health goes with the attempts.
        succeeded = all(c.status is DeliveryStatus.SUCCEEDED for c in final.values())
        for delivery_id in await attempts.finish_attempts(
            conn, completions, owner=self.owner, healthy=sorted(final) if succeeded else ()
        ):
            log.warning(
                "delivery %s: its lease moved on before this attempt ended; the attempt is "
                "logged, the delivery is left to the process that holds it now",
                delivery_id,
            )
        if succeeded:
            return
        healthy: list[str] = []  # successes in a row of the id order: one statement
        for endpoint_id in sorted(final):
            c = final[endpoint_id]
            if c.status is DeliveryStatus.SUCCEEDED:
                healthy.append(endpoint_id)
                continue
            await endpoints.mark_endpoints_healthy(conn, healthy)
            healthy = []
            when = c.attempt.finished_at or self.clock.now()
            if await endpoints.mark_endpoint_health(
                conn,
                c.endpoint_id,
                succeeded=False,
                now=when,
                disable_before=when - self.disable_after,
            ):
                log.warning(
                    "endpoint %s disabled: only failures for %s", c.endpoint_id, self.disable_after
                )
        await endpoints.mark_endpoints_healthy(conn, healthy)


def _trace(due: DueDelivery) -> tracing.TraceParent:
    """The trace a delivery attempt belongs to: its event's run's, under the run's span; an
    event of no run (a test event) starts a trace of its own."""
    if due.run_id is None:
        return tracing.TraceParent(tracing.new_trace_id(), "0" * 16)
    trace = tracing.run_trace(due.run_id, due.traceparent)
    return tracing.TraceParent(trace.trace_id, tracing.run_span_id(due.run_id), trace.flags)


def _attempt_span(
    due: DueDelivery,
    number: int,
    trace: tracing.TraceParent,
    span_id: str,
    started: datetime,
    finished: datetime,
    result: Result,
) -> None:
    """Export the span of one delivery attempt (OpenTelemetry on)."""
    assert due.url is not None
    attributes = tracing.http_attributes("POST", due.url, result.status_code, secret_path=True)
    attributes.update(
        {
            "flowhook.delivery_id": due.id, "flowhook.event_id": due.event_id,
            "flowhook.event": due.event_type, "flowhook.endpoint_id": due.endpoint_id,
            "flowhook.delivery_attempt": number,
        }
    )  # fmt: skip
    if due.run_id is not None:
        attributes["flowhook.run_id"] = due.run_id
    if due.flow_id is not None:
        attributes["flowhook.flow_id"] = due.flow_id
    tracing.emit(
        "webhook delivery", trace=trace, span_id=span_id, start_at=started, end_at=finished,
        kind="client", attributes=attributes, error=result.error_class,
    )  # fmt: skip
