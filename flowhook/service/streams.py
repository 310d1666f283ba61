"""Live event streams (Server-Sent Events): one hub per API process fans the events that any
process commits out to the streams open on this one.

On PostgreSQL the hub hears of every commit by NOTIFY on
:data:`~flowhook.store.events.EVENTS_CHANNEL`; on SQLite, of this process's commits at once
(``Database.on_events``). Either tells it the lowest event id the transaction wrote. It then
reads the events from there, once for all its streams, and hands each stream the ones it
wants. An id is made before its
transaction commits, so ids do not commit in order: reading from the transaction's lowest id
(not from the highest id seen) and remembering the ids already handed out for
:data:`HORIZON_MS` keeps a late commit from being skipped or sent twice. A catch-up read of
the last :data:`LOOKBACK_MS` every ``poll_interval`` covers a notification that never came
(SQLite with the engine in another process, a LISTEN connection being re-made), and each
run stream reads its run's events again at every heartbeat, so a missed wake-up loses
nothing.

A stream lasts only as long as what opened it: when a key is revoked or a session ends (in
this process, or in another: :class:`~flowhook.service.auth.RevocationWatch`), the hub reads
which of its streams' keys and sessions still hold, in one query, and closes the rest before
it hands out another event; it reads them every ``recheck_every`` seconds too, as a backstop.

Bounded: each stream holds at most ``queue_size`` events not yet sent; a client slower than
that is dropped (its connection closed; it may resume with ``Last-Event-ID``), and a key
may hold ``max_per_key`` streams open on one process (429 beyond).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from flowhook.backoff import backoff
from flowhook.clock import Clock, SystemClock
from flowhook.errors import InvalidInput, RateLimited, StoreUnavailable
from flowhook.events import EVENT_TYPES, TEST_EVENT
from flowhook.ids import id_floor, id_millis, is_id
from flowhook.service.auth import Principal
from flowhook.store import events as events_store
from flowhook.store import keys as keys_store
from flowhook.store import sessions as sessions_store
from flowhook.store.db import Database
from flowhook.store.models import Event, Mode
from flowhook.store.wakeup import PgListener, Wakeup

__all__ = [
    "EventHub",
    "Subscription",
    "TERMINAL_EVENTS",
    "HEARTBEAT",
    "sse_message",
    "run_messages",
    "scope_messages",
    "check_last_event_id",
    "check_event_filter",
]

log = logging.getLogger("flowhook.streams")

TERMINAL_EVENTS = frozenset({"flow.completed", "flow.failed", "flow.cancelled"})
"""A run stream ends after one of these."""

HEARTBEAT = b": keep-alive\n\n"
"""A comment line: proxies see traffic on an idle stream and keep it open."""

HORIZON_MS = 30_000
"""How long the hub remembers the ids it handed out: a transaction that commits events
more than this after making their ids may reach open streams late or not at all (they are
in the table all the same: a reconnect with ``Last-Event-ID`` reads them)."""

LOOKBACK_MS = 5_000
"""The catch-up read's window, behind the newest time."""

READ_BATCH = 500
HISTORY_PAGE = 64
"""Events of a run's history read at a time (a step's output, in its event, may be 256 KiB)."""
MAX_CHUNK = 1 << 20
"""The most one write of a stream's history sends (one event larger than this goes alone)."""


def sse_message(event: Event) -> bytes:
    """One Server-Sent Events message: ``id``, ``event``, and the stored envelope as
    ``data``, byte for byte (it is compact JSON: one line)."""
    lines = b"\ndata: ".join(event.body.split(b"\n"))
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (event.id.encode(), event.type.encode(), lines)


def check_last_event_id(value: str | None) -> str | None:
    """``Last-Event-ID`` as a cursor: an event id, or nothing (400 for anything else)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if not is_id(value, "evt"):
        raise InvalidInput("Last-Event-ID must be an event id (evt_…)", field="Last-Event-ID")
    return value


def check_event_filter(event: str | None) -> str | None:
    if event is None or event == "":
        return None
    if event not in EVENT_TYPES and event != TEST_EVENT:
        known = ", ".join(sorted(EVENT_TYPES))
        raise InvalidInput(f"event must be one of {known}", field="event")
    return event


class Subscription:
    """One open stream's share of the hub: what it wants, and a bounded queue of events."""

    __slots__ = (
        "_limit",
        "dropped",
        "ended",
        "event_type",
        "flow_id",
        "is_stream",
        "key_id",
        "mode",
        "pending",
        "ready",
        "run_id",
        "session",
        "since",
        "workspace_id",
    )  # fmt: skip

    def __init__(
        self,
        who: Principal,
        limit: int,
        *,
        run_id: str | None = None,
        flow_id: str | None = None,
        event_type: str | None = None,
        since: str | None = None,
        session: str | None = None,
        is_stream: bool = True,
    ) -> None:
        self.key_id = who.key_id
        self.is_stream = is_stream
        """``False``: a long poll's wake-up (:meth:`EventHub.watch`), no share of its key's."""
        self.session = session
        """The hash of the settings-screen session it was opened with (the run page's)."""
        self.workspace_id = who.workspace_id
        self.mode: Mode = who.mode
        self.run_id = run_id
        self.flow_id = flow_id
        self.event_type = event_type
        self.since = since
        """Only events with a higher id (a stream of what happens from now on)."""
        self.pending: collections.deque[tuple[Event, bytes]] = collections.deque()
        """Events not yet sent, each with its message (made once for every stream)."""
        self.ready = asyncio.Event()
        self.ended = False
        """Set when the hub lets go: the server is stopping, or the client fell behind."""
        self.dropped = False
        self._limit = limit

    def wants(self, e: Event) -> bool:
        if self.since is not None and e.id <= self.since:
            return False
        if self.run_id is not None:
            return e.run_id == self.run_id
        return (
            e.workspace_id == self.workspace_id
            and e.mode == self.mode
            and (self.flow_id is None or e.flow_id == self.flow_id)
            and (self.event_type is None or e.type == self.event_type)
        )

    def offer(self, e: Event, message: bytes) -> bool:
        """Queue ``e``; ``False`` (and the stream is over) when the queue is full."""
        if len(self.pending) >= self._limit:
            self.dropped = True
            self.end()
            return False
        self.pending.append((e, message))
        self.ready.set()
        return True

    def end(self) -> None:
        self.ended = True
        self.ready.set()

    async def next_batch(self, timeout: float) -> list[tuple[Event, bytes]]:
        """The queued events, waiting up to ``timeout`` seconds for one ([] on timeout or
        when the stream ended)."""
        if not self.pending and not self.ended:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.ready.wait()
        self.ready.clear()
        batch = list(self.pending)
        self.pending.clear()
        return batch


class _Announcements(PgListener):
    """LISTEN for committed events; each notification's payload is a transaction's lowest
    event id."""

    def __init__(self, dsn: str, poke: Callable[[str | None], None]) -> None:
        self._poke = poke
        lost = _LostWakeup(poke)
        super().__init__(dsn, {events_store.EVENTS_CHANNEL: lost})

    def _on_notify(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        self._poke(payload or None)


class _LostWakeup(Wakeup):
    """What the listener pokes when it (re)connects: notifications may have been missed."""

    def __init__(self, poke: Callable[[str | None], None]) -> None:
        super().__init__()
        self._poke = poke

    def notify(self) -> None:
        self._poke(None)


class EventHub:
    def __init__(
        self,
        db: Database,
        *,
        poll_interval: float = 1.0,
        queue_size: int = 1000,
        max_per_key: int = 100,
        recheck_every: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        self._db = db
        self._recheck_every = recheck_every
        self._clock = clock or SystemClock()
        self._recheck = False
        """Set by :meth:`credentials_ended`: check every stream's key and session now."""
        self._poll = poll_interval
        self._queue_size = queue_size
        self._max_per_key = max_per_key
        self._by_run: dict[str, set[Subscription]] = {}
        self._by_scope: dict[tuple[str, Mode], set[Subscription]] = {}
        self._per_key: collections.Counter[str] = collections.Counter()
        self._count = 0
        """Subscriptions: open streams and long polls' wake-ups (the hub reads while any is)."""
        self._watching = 0
        """Of them, long polls' wake-ups (:meth:`watch`)."""
        self._seen: set[str] = set()
        self._cursor: str | None = None
        self._floor: str | None = None
        """The lowest id announced since the last read (``None``: nothing announced)."""
        self._lookback = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listener: _Announcements | None = None
        self.closing = False
        self.reads = 0
        """How many reads the hub made (tests and benchmarks look)."""
        self.rechecks = 0
        """How many times it checked its streams' keys and sessions (tests look)."""

    @property
    def open_streams(self) -> int:
        return self._count - self._watching

    async def start(self) -> None:
        self.closing = False
        dsn = self._db.listen_dsn
        if dsn is None:
            self._db.on_events = self.announce
        else:  # NOTIFY tells this process too: the in-process signal would double the reads
            self._listener = _Announcements(dsn, self.announce)
            await self._listener.start()
        self._task = asyncio.create_task(self._run(), name="flowhook-event-hub")

    def close(self) -> None:
        """End every open stream now (the server is stopping); new ones end at once."""
        self.closing = True
        for sub in self._all():
            sub.end()

    async def stop(self) -> None:
        self.close()
        if self._db.on_events == self.announce:
            self._db.on_events = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None

    def subscribe(
        self,
        who: Principal,
        *,
        run_id: str | None = None,
        flow_id: str | None = None,
        event_type: str | None = None,
        after: str | None = None,
        session: str | None = None,
    ) -> Subscription:
        """A new stream's subscription; 429 when ``who``'s key holds its share already. It
        gets only events after ``after``; a workspace stream without it, from now on. It
        ends when ``who``'s key is revoked, or ``session`` (a session's hash) ends."""
        if self._per_key[who.key_id] >= self._max_per_key:
            raise RateLimited(
                f"this API key has {self._max_per_key} streams open, the most it may have "
                "(FLOWHOOK_MAX_STREAMS_PER_KEY); close one first",
                retry_after=1,
            )
        now = id_floor("evt", _now_ms())
        # A run's stream dedupes against its history; ``after`` bounds both kinds.
        since = after if run_id is not None else (after or now)
        sub = Subscription(
            who, self._queue_size, run_id=run_id, flow_id=flow_id, event_type=event_type,
            since=since, session=session,
        )  # fmt: skip
        self._per_key[who.key_id] += 1
        return self._add(sub, now)

    def watch(self, who: Principal, run_id: str) -> Subscription:
        """A long poll's wake-up: ``ready`` is set when an event of ``run_id`` commits from
        now on (or the hub lets go). Not a stream: it takes no share of the key's and
        is not counted in :attr:`open_streams`; it ends as streams do when the key is
        revoked. :meth:`unsubscribe` it when done."""
        # Every event of the run the hub reads from now on, whatever its id: an event's id
        # is made before its transaction commits, so one made before this call may commit
        # after the caller's read of the run (a bound by id lost such wake-ups).
        sub = Subscription(who, self._queue_size, run_id=run_id, is_stream=False)
        self._watching += 1
        return self._add(sub, id_floor("evt", _now_ms()))

    def _add(self, sub: Subscription, now: str) -> Subscription:
        if self._count == 0:
            self._cursor = now
        if sub.run_id is not None:
            self._by_run.setdefault(sub.run_id, set()).add(sub)
        else:
            self._by_scope.setdefault((sub.workspace_id, sub.mode), set()).add(sub)
        self._count += 1
        if self.closing:
            sub.end()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        index: dict[Any, set[Subscription]]
        key: Any
        if sub.run_id is not None:
            index, key = self._by_run, sub.run_id
        else:
            index, key = self._by_scope, (sub.workspace_id, sub.mode)
        subs = index.get(key)
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        if not subs:
            del index[key]
        if sub.is_stream:
            self._per_key[sub.key_id] -= 1
            if self._per_key[sub.key_id] <= 0:
                del self._per_key[sub.key_id]
        else:
            self._watching -= 1
        self._count -= 1
        sub.end()

    def credentials_ended(self) -> None:
        """A key may have been revoked or a session ended: check every open stream's now."""
        self._recheck = True
        self._wake.set()

    async def _check_credentials(self) -> None:
        """End the streams whose key was revoked or whose session ended (one read for all)."""
        subs = self._all()
        keys = {s.key_id for s in subs}
        sessions = {s.session for s in subs if s.session is not None}
        self.rechecks += 1
        async with self._db.read() as conn:
            revoked = await keys_store.revoked_among(conn, keys)
            ended = await sessions_store.ended_among(conn, sessions, self._clock.now())
        for sub in subs:
            if sub.key_id in revoked or sub.session in ended:
                log.info("event streams: a stream's key was revoked or its session ended; closed")
                self.unsubscribe(sub)

    def announce(self, floor: str | None) -> None:
        """Events were committed, the lowest of them ``floor`` (``None``: unknown, so look
        back)."""
        if floor is None:
            self._lookback = True
        elif self._floor is None or floor < self._floor:
            self._floor = floor
        self._wake.set()

    def _all(self) -> list[Subscription]:
        subs = [s for group in self._by_run.values() for s in group]
        return subs + [s for group in self._by_scope.values() for s in group]

    async def _run(self) -> None:
        failures = 0
        clock = asyncio.get_running_loop().time
        due = clock() + self._poll  # the next catch-up read, however busy the hub is
        recheck_due = clock() + self._recheck_every  # the backstop of credentials_ended
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(due, recheck_due) - clock())):
                    await self._wake.wait()
            self._wake.clear()
            floor, self._floor = self._floor, None
            lookback, self._lookback = self._lookback or clock() >= due, False
            recheck, self._recheck = self._recheck or clock() >= recheck_due, False
            if lookback:
                due = clock() + self._poll
            if recheck:
                recheck_due = clock() + self._recheck_every
            if self._count == 0:
                self._seen.clear()
                continue
            try:
                if recheck:  # first: no event reaches a stream whose key was revoked
                    await self._check_credentials()
                await self._catch_up(floor, lookback)
                failures = 0
            except StoreUnavailable as exc:  # streams wait; reads resume when it is back
                failures += 1
                log.warning("event streams: reading new events failed: %s", exc)
                self._lookback = True
                self._recheck = self._recheck or recheck
                await asyncio.sleep(backoff(failures, 0.2, 5.0))
            except Exception:
                failures += 1
                log.exception("event streams: reading new events failed")
                self._lookback = True
                self._recheck = self._recheck or recheck
                await asyncio.sleep(backoff(failures, 0.2, 5.0))

    async def _catch_up(self, floor: str | None, lookback: bool) -> None:
        now = _now_ms()
        horizon = id_floor("evt", now - HORIZON_MS)
        start = self._cursor or id_floor("evt", now)
        if floor is not None:
            start = min(start, id_floor("evt", id_millis(floor)))
        if lookback:
            start = min(start, id_floor("evt", now - LOOKBACK_MS))
            self._seen = {i for i in self._seen if i >= horizon}
        start = max(start, horizon)
        self.reads += 1
        # With no workspace stream open, only the runs followed have events to hand out:
        # read theirs alone (another tenant's burst of events is then nothing to read).
        runs = None if self._by_scope else list(self._by_run)
        async with self._db.read() as conn:
            if lookback:
                await self._read_missing(conn, start, runs)
            else:
                await self._read_all(conn, start, runs)

    async def _read_all(self, conn: Any, after: str, runs: list[str] | None) -> None:
        while True:
            batch = await events_store.events_after(conn, after, limit=READ_BATCH, run_ids=runs)
            self._deliver(batch)
            if len(batch) < READ_BATCH:
                return
            after = batch[-1].id

    async def _read_missing(self, conn: Any, after: str, runs: list[str] | None) -> None:
        """The ids after ``after`` first (an index alone), then only the unseen rows."""
        while True:
            ids = await events_store.event_ids_after(
                conn, after, limit=READ_BATCH * 4, run_ids=runs
            )
            missing = [i for i in ids if i not in self._seen]
            if missing:
                self._deliver(await events_store.events_by_id(conn, missing))
            if len(ids) < READ_BATCH * 4:
                return
            after = ids[-1]

    def _deliver(self, batch: list[Event]) -> None:
        for e in batch:
            if e.id in self._seen:
                continue
            self._seen.add(e.id)
            if self._cursor is None or e.id > self._cursor:
                self._cursor = e.id
            targets = list(self._by_scope.get((e.workspace_id, e.mode), ()))
            if e.run_id is not None and e.run_id in self._by_run:
                targets += self._by_run[e.run_id]
            message: bytes | None = None
            for sub in targets:
                if not sub.wants(e):
                    continue
                message = message or sse_message(e)
                if not sub.offer(e, message):
                    log.info("event streams: a client fell behind; its stream is closed")
                    self.unsubscribe(sub)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def run_messages(
    hub: EventHub,
    db: Database,
    sub: Subscription,
    *,
    after: str | None,
    heartbeat: float,
) -> AsyncIterator[bytes]:
    """A run's stream: its events so far (after ``after``), then each new one; it ends after
    the run's terminal event (or at once for a finished run whose history is sent)."""
    assert sub.run_id is not None
    run_id = sub.run_id
    sent: set[str] = set()
    last = after
    try:
        while True:
            async with db.read() as conn:
                status = await events_store.run_status(conn, run_id)
            # the history in pages, each sent before the next is read: a connection holds
            # one page, however long the run's history is
            while True:
                async with db.read() as conn:
                    history = await events_store.list_events_for_run(
                        conn, run_id, after=last, limit=HISTORY_PAGE
                    )
                messages, terminal = _unsent(history, sent)
                for chunk in _chunked(messages):
                    yield chunk
                if terminal:
                    return
                last = max([last or "", *(e.id for e in history)]) or None
                if len(history) < HISTORY_PAGE:
                    break
            if status is None or status in ("completed", "failed", "cancelled"):
                return  # finished (its terminal event, if any, was in the history)
            async for chunk in _live(sub, sent, heartbeat):
                if not chunk:  # the terminal event was sent
                    return
                yield chunk
            if sub.ended:
                return
            # a heartbeat passed without news: read the run again, in case a wake-up was lost
    finally:
        hub.unsubscribe(sub)


def _unsent(history: list[Event], sent: set[str]) -> tuple[list[bytes], bool]:
    """The messages of a run's events not sent yet, up to its terminal event; and whether
    that was among them."""
    messages: list[bytes] = []
    for e in history:
        if e.id in sent:
            continue
        sent.add(e.id)
        messages.append(sse_message(e))
        if e.type in TERMINAL_EVENTS:
            return messages, True
    return messages, False


def _chunked(messages: Iterable[bytes]) -> Iterator[bytes]:
    """``messages`` joined into writes of at most :data:`MAX_CHUNK` bytes (one message
    larger than that goes alone)."""
    chunk: list[bytes] = []
    size = 0
    for message in messages:
        if chunk and size + len(message) > MAX_CHUNK:
            yield b"".join(chunk)
            chunk, size = [], 0
        chunk.append(message)
        size += len(message)
    if chunk:
        yield b"".join(chunk)


async def _live(sub: Subscription, sent: set[str], heartbeat: float) -> AsyncIterator[bytes]:
    """The subscription's events as messages until a heartbeat passes with none (one
    comment line, then this ends so the caller may look at the store) or the stream ends.
    Each batch of events is one chunk (one write); an empty chunk follows a run's terminal
    event."""
    while not sub.ended:
        batch = await sub.next_batch(heartbeat)
        if sub.dropped:
            return
        if not batch:
            if not sub.ended:
                yield HEARTBEAT
            return
        chunk: list[bytes] = []
        for e, message in batch:
            if e.id in sent:
                continue
            sent.add(e.id)
            chunk.append(message)
            if sub.run_id is not None and e.type in TERMINAL_EVENTS:
                yield b"".join(chunk)
                yield b""
                return
        if chunk:
            yield b"".join(chunk)


async def scope_messages(
    hub: EventHub,
    db: Database,
    sub: Subscription,
    *,
    after: str | None,
    heartbeat: float,
) -> AsyncIterator[bytes]:
    """A workspace and mode's events (filtered by the subscription), endless: those after
    ``after`` first when it is given, then each new one."""
    sent: set[str] = set()
    recent = id_floor("evt", _now_ms() - HORIZON_MS)
    try:
        while after is not None:
            async with db.read() as conn:
                history = await events_store.scope_events_after(
                    conn, sub.workspace_id, sub.mode, after, limit=HISTORY_PAGE,
                    flow_id=sub.flow_id, event_type=sub.event_type,
                )  # fmt: skip
            sent.update(e.id for e in history if e.id >= recent)  # the hub may hand these over
            for chunk in _chunked(sse_message(e) for e in history):
                yield chunk
            after = history[-1].id if len(history) == HISTORY_PAGE else None
        while not sub.ended:
            async for chunk in _live(sub, sent, heartbeat):
                yield chunk
            if len(sent) > 10_000:
                sent.clear()  # only ids the history sent are worth remembering, briefly
    finally:
        hub.unsubscribe(sub)
