"""Webhook endpoints, deliveries and events: the use cases behind Settings → Webhooks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from flowhook.clock import Clock
from flowhook.config import Settings, parse_duration
from flowhook.errors import Conflict, InvalidInput
from flowhook.events import EVENT_TYPES, TEST_EVENT, make_event
from flowhook.ids import is_id, new_id
from flowhook.service.auth import Principal
from flowhook.service.lookup import find, missing
from flowhook.service.pagination import Page, check_cursor, listed
from flowhook.signing import new_secret
from flowhook.store import deliveries as deliveries_store
from flowhook.store import delivery_reads, pausing
from flowhook.store import endpoints as endpoints_store
from flowhook.store import events as events_store
from flowhook.store import retention as retention_store
from flowhook.store.db import Connection, Database
from flowhook.store.models import Delivery, DeliveryStatus, Endpoint, Event, Mode
from flowhook.targets import TargetRefused, check_url

__all__ = ["WebhookService", "SUBSCRIBABLE", "Recovery"]

SUBSCRIBABLE = tuple(EVENT_TYPES)
MAX_URL = 2048
RECOVER_LIMIT = 1000
"""Failed deliveries one recover call looks at; the answer's next_cursor continues."""
RECOVER_BATCH = 200
"""Failed deliveries replayed per transaction."""


@dataclass(frozen=True, slots=True)
class Recovery:
    replayed: list[Delivery]
    skipped: int
    next_cursor: str | None = None


class WebhookService:
    def __init__(self, db: Database, clock: Clock, settings: Settings) -> None:
        self._db = db
        self._clock = clock
        self._settings = settings

    # Endpoints

    def _check_url(self, url: str, mode: Mode) -> str:
        if len(url) > MAX_URL:
            raise InvalidInput(f"url must be at most {MAX_URL} characters", field="url")
        try:
            return check_url(
                url,
                allow_private=self._settings.allow_private_targets,
                require_https=mode is Mode.LIVE,
            )
        except TargetRefused as exc:
            raise InvalidInput(f"url refused: {exc.message}", field="url") from None

    @staticmethod
    def _check_events(events: list[str]) -> list[str]:
        if not events:
            raise InvalidInput("events must name at least one event", field="events")
        unknown = sorted(set(events) - set(SUBSCRIBABLE))
        if unknown:
            raise InvalidInput(
                f"unknown event {unknown[0]!r}; valid events: {', '.join(SUBSCRIBABLE)}",
                field="events",
            )
        return sorted(set(events))

    async def create_endpoint(
        self,
        who: Principal,
        *,
        url: str,
        events: list[str],
        description: str = "",
        enabled: bool = True,
        rate_limit: float | None = None,
        ordering: str | None = None,
        filter: list[str] | None = None,
    ) -> Endpoint:
        now = self._clock.now()
        endpoint = Endpoint(
            id=new_id("ep"),
            workspace_id=who.workspace_id,
            mode=who.mode,
            url=self._check_url(url, who.mode),
            description=description,
            enabled=enabled,
            events=self._check_events(events),
            secret=new_secret(),
            created_at=now,
            updated_at=now,
            rate_limit=_check_rate(rate_limit),
            ordering=_check_ordering(ordering),
            filter_flow_ids=_check_flow_ids(filter),
        )
        async with self._db.transaction() as conn:
            await endpoints_store.insert_endpoint(conn, endpoint)
        return endpoint

    async def get_endpoint(self, who: Principal, endpoint_id: str) -> Endpoint:
        endpoint = await find(
            self._db, "endpoint", "ep", endpoint_id,
            lambda conn: endpoints_store.get_endpoint(
                conn, endpoint_id, who.workspace_id, who.mode
            ),
        )  # fmt: skip
        return self._current(endpoint)

    def _current(self, endpoint: Endpoint) -> Endpoint:
        """Drop a rotated-out secret whose grace period is over."""
        expires = endpoint.previous_secret_expires_at
        if endpoint.previous_secret and expires is not None and expires <= self._clock.now():
            endpoint.previous_secret = None
            endpoint.previous_secret_expires_at = None
        return endpoint

    async def list_endpoints(
        self, who: Principal, *, limit: int, cursor: str | None
    ) -> Page[Endpoint]:
        found = await listed(
            self._db, "ep", limit=limit, cursor=cursor, cursor_of=lambda row: row.id,
            fetch=lambda conn, after, n: endpoints_store.list_endpoints(
                conn, who.workspace_id, who.mode, limit=n, after=after
            ),
        )  # fmt: skip
        return Page([self._current(r) for r in found.data], found.next_cursor)

    async def update_endpoint(
        self, who: Principal, endpoint_id: str, changes: dict[str, Any]
    ) -> Endpoint:
        endpoint = await self.get_endpoint(who, endpoint_id)
        events_changed = False
        if changes.get("url") is not None:
            endpoint.url = self._check_url(changes["url"], who.mode)
        if changes.get("events") is not None:
            endpoint.events = self._check_events(changes["events"])
            events_changed = True
        if changes.get("description") is not None:
            endpoint.description = changes["description"]
        if changes.get("enabled") is not None:
            if changes["enabled"] and not endpoint.enabled:
                endpoint.disabled_reason = None
                endpoint.failing_since = None
            endpoint.enabled = bool(changes["enabled"])
        was_fifo = endpoint.ordering == deliveries_store.FIFO
        if "rate_limit" in changes:  # null clears it
            endpoint.rate_limit = _check_rate(changes["rate_limit"])
        if "ordering" in changes:
            endpoint.ordering = _check_ordering(changes["ordering"])
        if "filter" in changes:
            given = changes["filter"]  # {"flow_ids": […]} from the API, the list from a form
            flow_ids = given.get("flow_ids") if isinstance(given, dict) else given
            endpoint.filter_flow_ids = _check_flow_ids(flow_ids)
        endpoint.updated_at = now = self._clock.now()
        async with self._db.transaction() as conn:
            await endpoints_store.update_endpoint(conn, endpoint, events_changed=events_changed)
            if (
                was_fifo and endpoint.ordering != deliveries_store.FIFO
            ):  # what it held back goes now
                await deliveries_store.release_all(conn, endpoint.id, now)
        return endpoint

    async def pause_endpoint(self, who: Principal, endpoint_id: str) -> Endpoint:
        """Hold the endpoint's deliveries (pending and to come), no attempt used; attempts
        under way finish. Pausing a paused endpoint changes nothing."""
        if not is_id(endpoint_id, "ep"):
            raise missing("endpoint", endpoint_id)
        now = self._clock.now()

        async def pause(conn: Connection) -> None:
            if not await pausing.mark_endpoint(conn, who.workspace_id, who.mode, endpoint_id, now):
                raise missing("endpoint", endpoint_id)
            await pausing.hold_deliveries(conn, endpoint_id, now)

        await self._db.retrying(pause)  # a deadlock with a claim or completion: again
        return await self.get_endpoint(who, endpoint_id)

    async def resume_endpoint(self, who: Principal, endpoint_id: str) -> Endpoint:
        """Let the endpoint's held deliveries go, oldest first."""
        if not is_id(endpoint_id, "ep"):
            raise missing("endpoint", endpoint_id)

        async def resume(conn: Connection) -> None:
            if not await pausing.mark_endpoint(conn, who.workspace_id, who.mode, endpoint_id, None):
                raise missing("endpoint", endpoint_id)
            await pausing.release_deliveries(conn, endpoint_id, self._clock.now())

        await self._db.retrying(resume)
        return await self.get_endpoint(who, endpoint_id)

    async def delete_endpoint(self, who: Principal, endpoint_id: str) -> None:
        """Delete the endpoint; its pending deliveries fail (nowhere to send them), those it
        held (paused, or FIFO behind another) too: they are let go to fail."""
        if not is_id(endpoint_id, "ep"):
            raise missing("endpoint", endpoint_id)

        async def delete(conn: Connection) -> None:
            # under its lock: a fan-out or put-back that read it paused has written its held
            # rows by now (and sees it gone afterwards), so the release below reaches them
            await deliveries_store.lock_endpoint(conn, endpoint_id)
            if not await endpoints_store.delete_endpoint(
                conn, who.workspace_id, who.mode, endpoint_id
            ):
                raise missing("endpoint", endpoint_id)
            now = self._clock.now()
            await deliveries_store.release_all(conn, endpoint_id, now)
            await pausing.release_deliveries(conn, endpoint_id, now)

        await self._db.retrying(delete)

    async def rotate_secret(
        self, who: Principal, endpoint_id: str, grace_seconds: float | None = None
    ) -> Endpoint:
        """A new secret; the old one keeps signing ``webhook-signature`` (and
        ``X-Service-Signature``) until the grace period ends. Grace 0 switches at once."""
        endpoint = await self.get_endpoint(who, endpoint_id)
        grace = (
            parse_duration(self._settings.webhook_secret_grace)
            if grace_seconds is None
            else grace_seconds
        )
        if grace < 0 or grace > 30 * 86400:
            raise InvalidInput("grace_seconds must be between 0 and 2592000", field="grace_seconds")
        now = self._clock.now()
        if grace > 0:
            endpoint.previous_secret = endpoint.secret
            endpoint.previous_secret_expires_at = now + timedelta(seconds=grace)
        else:
            endpoint.previous_secret = None
            endpoint.previous_secret_expires_at = None
        endpoint.secret = new_secret()
        endpoint.updated_at = now
        async with self._db.transaction() as conn:
            await endpoints_store.update_endpoint(conn, endpoint, events_changed=False)
        return endpoint

    async def promote_secret(self, who: Principal, endpoint_id: str) -> Endpoint:
        """End a rotation's grace period now: only the new secret signs from here on."""
        endpoint = await self.get_endpoint(who, endpoint_id)
        endpoint.previous_secret = None
        endpoint.previous_secret_expires_at = None
        endpoint.updated_at = self._clock.now()
        async with self._db.transaction() as conn:
            await endpoints_store.update_endpoint(conn, endpoint, events_changed=False)
        return endpoint

    async def send_test(self, who: Principal, endpoint_id: str) -> Event:
        endpoint = await self.get_endpoint(who, endpoint_id)
        now = self._clock.now()
        event = make_event(
            TEST_EVENT,
            workspace_id=who.workspace_id,
            mode=who.mode,
            flow_id=None,
            run_id=None,
            payload={"message": "a test event from Flowhook", "endpoint_id": endpoint.id},
            now=now,
        )
        async with self._db.transaction() as conn:
            await events_store.insert_events(conn, [event], to_endpoint=endpoint.id)
        return event

    async def failed_count(self, who: Principal, endpoint: Endpoint) -> int:
        async with self._db.read() as conn:
            found = await delivery_reads.failed_deliveries_between(
                conn, endpoint.id, endpoint.created_at, self._clock.now()
            )
        return len(found)

    async def delivered_later(self, who: Principal, shown: Sequence[Delivery]) -> dict[str, str]:
        """For each failed delivery of ``shown`` whose event a later delivery (a replay, a
        recovery) brought to the same endpoint, that delivery's id: the pages say it got
        through instead of counting it failed."""
        failed = [d for d in shown if d.status is DeliveryStatus.FAILED]
        if not failed:
            return {}
        async with self._db.read() as conn:
            return await delivery_reads.delivered_later(conn, failed)

    async def health(self, who: Principal, endpoints: list[Endpoint]) -> dict[str, dict[str, int]]:
        """Deliveries of the last 24 h per endpoint and status (a failed one a replay
        delivered counts as ``redelivered``)."""
        async with self._db.read() as conn:
            return await delivery_reads.endpoint_stats(
                conn, [e.id for e in endpoints], self._clock.now() - timedelta(hours=24)
            )

    # Deliveries

    async def list_deliveries(
        self,
        who: Principal,
        *,
        limit: int,
        cursor: str | None,
        status: str | None = None,
        endpoint_id: str | None = None,
        event: str | None = None,
        run_id: str | None = None,
    ) -> Page[Delivery]:
        wanted: DeliveryStatus | None = None
        if status:
            try:
                wanted = DeliveryStatus(status)
            except ValueError:
                raise InvalidInput(
                    "status must be one of pending, succeeded, failed", field="status"
                ) from None
        return await listed(
            self._db, "dlv", limit=limit, cursor=cursor, cursor_of=lambda row: row.id,
            fetch=lambda conn, after, n: delivery_reads.list_deliveries(
                conn, who.workspace_id, who.mode, limit=n, after=after, status=wanted,
                endpoint_id=endpoint_id or None, event_type=event or None, run_id=run_id or None,
            ),
        )  # fmt: skip

    async def get_delivery(self, who: Principal, delivery_id: str) -> tuple[Delivery, Event | None]:
        """The delivery and its event, read in one snapshot."""

        async def fetch(conn: Connection) -> tuple[Delivery, Event | None] | None:
            delivery = await delivery_reads.get_delivery(
                conn, who.workspace_id, who.mode, delivery_id
            )
            if delivery is None:
                return None
            ws, mode = who.workspace_id, who.mode
            return delivery, await events_store.get_event(conn, ws, mode, delivery.event_id)

        return await find(self._db, "delivery", "dlv", delivery_id, fetch)

    async def replay(self, who: Principal, delivery_id: str) -> Delivery:
        """A new delivery of the same event bytes and event id to the same endpoint; the
        original keeps its own history and schedule."""
        original, event = await self.get_delivery(who, delivery_id)
        if event is not None and event.body == retention_store.CLEARED_BODY:
            raise Conflict(
                "this delivery's event body was cleared by retention "
                "(FLOWHOOK_DELIVERY_RETENTION_DAYS after it was delivered): it cannot be sent again"
            )
        async with self._db.transaction() as conn:
            return await self._replay(conn, original)

    async def _replay(self, conn: Any, original: Delivery) -> Delivery:
        copy = original.replayed(new_id("dlv"), self._clock.now())
        endpoint = await endpoints_store.get_endpoint(conn, original.endpoint_id)
        fifo = paused = []
        if endpoint is not None:
            fifo = [endpoint.id] if endpoint.ordering == deliveries_store.FIFO else []
            paused = [endpoint.id] if endpoint.paused_at is not None else []
        # behind the ones in hand
        await deliveries_store.insert_deliveries(conn, [copy], fifo=fifo, paused=paused)
        found = await delivery_reads.due_times(conn, copy.id)
        if found is not None:  # as written: held, when its endpoint is paused or FIFO busy
            copy.next_attempt_at, copy.due_at = found
            await delivery_reads.explain_held(conn, [copy])
        return copy

    async def recover(
        self,
        who: Principal,
        endpoint_id: str,
        since: datetime,
        until: datetime | None = None,
        *,
        cursor: str | None = None,
    ) -> Recovery:
        """Replay the endpoint's failed deliveries created in [since, until], skipping events
        that a later delivery to it already delivered or is delivering.

        Bounded: ``since`` is clamped to the retention window (older deliveries are pruned),
        at most :data:`RECOVER_LIMIT` failed deliveries are looked at per call, in transactions of
        :data:`RECOVER_BATCH`; ``next_cursor`` continues where this call stopped."""
        endpoint = await self.get_endpoint(who, endpoint_id)
        now = self._clock.now()
        until = until or now
        if since > until:
            raise InvalidInput("since must be before until", field="since")
        since = max(since, now - timedelta(days=self._settings.retention_days))
        after = check_cursor(cursor, "dlv")
        replayed: list[Delivery] = []
        skipped = looked = 0
        limit = RECOVER_LIMIT
        while looked < limit:
            want = min(RECOVER_BATCH, limit - looked)
            async with self._db.transaction() as conn:
                failed = await delivery_reads.failed_deliveries_between(
                    conn, endpoint.id, since, until, after=after, limit=want
                )
                handled = await delivery_reads.events_in_hand(
                    conn, endpoint.id, {d.event_id for d in failed}
                )
                for delivery in failed:
                    if delivery.event_id in handled:
                        skipped += 1
                        continue
                    handled.add(delivery.event_id)
                    replayed.append(await self._replay(conn, delivery))
            looked += len(failed)
            if len(failed) < want:
                return Recovery(replayed, skipped, None)
            after = failed[-1].id
        return Recovery(replayed, skipped, after)

    # Events

    async def list_events(
        self,
        who: Principal,
        *,
        limit: int,
        cursor: str | None,
        event: str | None = None,
        run_id: str | None = None,
    ) -> Page[Event]:
        return await listed(
            self._db, "evt", limit=limit, cursor=cursor, cursor_of=lambda row: row.id,
            fetch=lambda conn, after, n: events_store.list_events(
                conn, who.workspace_id, who.mode, limit=n, after=after,
                event_type=event or None, run_id=run_id or None,
            ),
        )  # fmt: skip

    async def get_event(self, who: Principal, event_id: str) -> Event:
        return await find(
            self._db, "event", "evt", event_id,
            lambda conn: events_store.get_event(conn, who.workspace_id, who.mode, event_id),
        )  # fmt: skip


def _check_rate(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 10000:
        raise InvalidInput(
            f"rate_limit must be a number of deliveries a second above 0 and at most 10000, "
            f"not {value!r}",
            field="rate_limit",
        )
    return float(value)


def _check_ordering(value: str | None) -> str | None:
    if value not in (None, deliveries_store.FIFO):
        raise InvalidInput(f'ordering must be "fifo" or null, not {value!r}', field="ordering")
    return value


def _check_flow_ids(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 100:
        raise InvalidInput("filter.flow_ids must be a list of at most 100 flow ids",
                           field="filter.flow_ids")  # fmt: skip
    for flow_id in value:
        if not isinstance(flow_id, str) or not is_id(flow_id, "wf"):
            raise InvalidInput(f"filter.flow_ids: {flow_id!r} is not a flow id (wf_…)",
                               field="filter.flow_ids")  # fmt: skip
    return sorted(set(value))
