"""The event hub on both backends: commits of this process and of another, ids that commit
out of order, one read shared by many streams, slow clients dropped, the cap per key, and
streams closed when their key is revoked or their session ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from flowhook.clock import SystemClock
from flowhook.config import Settings
from flowhook.errors import RateLimited
from flowhook.events import make_event
from flowhook.service import Principal
from flowhook.service.auth import KeyService
from flowhook.service.sessions import session_hash
from flowhook.service.streams import EventHub, Subscription, sse_message
from flowhook.store import events as events_store
from flowhook.store import keys as keys_store
from flowhook.store import sessions as sessions_store
from flowhook.store.db import Database
from flowhook.store.models import Event, Mode
from flowhook.store.sessions import WebSession

WHO = Principal(workspace_id="ws_a", mode=Mode.TEST, key_id="key_a")
OTHER = Principal(workspace_id="ws_b", mode=Mode.TEST, key_id="key_b")


def event(run_id: str, type_: str = "flow.step_completed", who: Principal = WHO) -> Event:
    return make_event(
        type_,
        workspace_id=who.workspace_id,
        mode=who.mode,
        flow_id="wf_1",
        run_id=run_id,
        payload={"n": 1},
        now=SystemClock().now(),
    )


async def commit(db: Database, batch: list[Event]) -> None:
    async with db.transaction() as conn:
        await events_store.insert_events(conn, batch)


async def received(sub: Subscription, count: int) -> list[Event]:
    got: list[Event] = []
    async with asyncio.timeout(20):
        while len(got) < count:
            got += [e for e, _ in await sub.next_batch(1.0)]
    return got


async def settled(hub: EventHub, quiet: float = 0.5) -> int:
    """The hub's reads once it has made none for ``quiet`` seconds. On PostgreSQL the
    listener's connect asks for a catch-up read; when that read already finds an event, the
    event's own notification still comes after it and makes one more read, which finds
    nothing new."""
    async with asyncio.timeout(20):
        while True:
            reads = hub.reads
            await asyncio.sleep(quiet)
            if hub.reads == reads:
                return reads


@pytest.fixture
async def other(settings: Settings) -> AsyncIterator[Database]:
    """The same database as another process sees it (its own engine, no shared signal)."""
    second = Database(
        settings.database_url, sqlite_synchronous="NORMAL", secret_key=settings.secret_key
    )
    yield second
    await second.dispose()


async def started(db: Database, **kw: object) -> EventHub:
    hub = EventHub(db, **kw)  # type: ignore[arg-type]
    await hub.start()
    return hub


async def test_commits_of_this_process_reach_the_run_stream(db: Database) -> None:
    hub = await started(db, poll_interval=60)
    try:
        sub = hub.subscribe(WHO, run_id="run_1")
        elsewhere = hub.subscribe(OTHER, run_id="run_2")
        batch = [event("run_1", "flow.started"), event("run_1"), event("run_2", who=OTHER)]
        await commit(db, batch)
        got = await received(sub, 2)
        assert [e.id for e in got] == [e.id for e in batch[:2]]
        assert [e.body for e in got] == [e.body for e in batch[:2]]
        assert [e.id for e in await received(elsewhere, 1)] == [batch[2].id]
    finally:
        await hub.stop()


async def test_commits_of_another_process_reach_the_streams(db: Database, other: Database) -> None:
    # PostgreSQL: NOTIFY (the catch-up poll is a minute away); SQLite: the catch-up poll.
    hub = await started(db, poll_interval=0.2 if db.is_sqlite else 60)
    try:
        sub = hub.subscribe(WHO)
        batch = [event("run_1"), event("run_2")]
        await commit(other, batch)
        assert [e.id for e in await received(sub, 2)] == [e.id for e in batch]
    finally:
        await hub.stop()


async def test_an_id_that_commits_after_a_later_one_is_not_skipped(
    db: Database, other: Database
) -> None:
    hub = await started(db, poll_interval=0.2 if db.is_sqlite else 60)
    try:
        sub = hub.subscribe(WHO)
        early, late = event("run_1"), event("run_1")
        assert early.id < late.id
        await commit(db, [late])
        assert [e.id for e in await received(sub, 1)] == [late.id]
        await commit(other, [early])  # made first, committed last, by another process
        assert [e.id for e in await received(sub, 1)] == [early.id]
        again = event("run_1")
        older = event("run_1")
        await commit(db, [older])
        await commit(db, [again])
        got = await received(sub, 2)
        assert sorted(e.id for e in got) == sorted([again.id, older.id])
        await asyncio.sleep(0.5)  # catch-up polls pass: nothing is handed out twice
        assert await sub.next_batch(0.01) == []
    finally:
        await hub.stop()


async def test_many_streams_share_one_read(db: Database) -> None:
    hub = await started(db, poll_interval=60)
    try:
        subs = [hub.subscribe(WHO) for _ in range(50)]
        await commit(db, [event("run_0")])
        for sub in subs:
            await received(sub, 1)
        reads = await settled(hub)
        batch = [event(f"run_{i}") for i in range(5)]
        await commit(db, batch)
        for sub in subs:
            assert [e.id for e in await received(sub, 5)] == [e.id for e in batch]
        assert hub.reads - reads == 1  # one read for the 50 streams
    finally:
        await hub.stop()


async def test_filters_of_a_workspace_stream(db: Database) -> None:
    hub = await started(db, poll_interval=60)
    try:
        only_done = hub.subscribe(WHO, event_type="flow.completed")
        only_other_flow = hub.subscribe(WHO, flow_id="wf_2")
        batch = [event("run_1"), event("run_1", "flow.completed"), event("run_3", who=OTHER)]
        await commit(db, batch)
        assert [e.id for e in await received(only_done, 1)] == [batch[1].id]
        await asyncio.sleep(0.2)
        assert await only_other_flow.next_batch(0.01) == []
    finally:
        await hub.stop()


async def test_a_slow_client_is_dropped_not_buffered(db: Database) -> None:
    hub = await started(db, poll_interval=60, queue_size=3)
    try:
        slow = hub.subscribe(WHO)
        await commit(db, [event("run_1") for _ in range(5)])
        async with asyncio.timeout(20):
            while not slow.ended:
                await asyncio.sleep(0.01)
        assert slow.dropped and len(slow.pending) == 3
        assert hub.open_streams == 0
    finally:
        await hub.stop()


async def test_the_cap_per_key_and_closing(db: Database) -> None:
    hub = await started(db, poll_interval=60, max_per_key=2)
    try:
        a, b = hub.subscribe(WHO), hub.subscribe(WHO, run_id="run_1")
        with pytest.raises(RateLimited) as refused:
            hub.subscribe(WHO)
        assert "FLOWHOOK_MAX_STREAMS_PER_KEY" in refused.value.message
        hub.subscribe(OTHER)  # another key has its own share
        hub.unsubscribe(a)
        hub.unsubscribe(a)  # twice is harmless
        c = hub.subscribe(WHO)
        hub.close()
        assert b.ended and c.ended and not b.dropped
        assert await b.next_batch(5) == []  # returns at once: the stream is over
    finally:
        await hub.stop()


def test_the_message_carries_the_envelope_as_stored() -> None:
    e = event("run_1")
    assert sse_message(e) == (
        b"id: " + e.id.encode() + b"\nevent: flow.step_completed\ndata: " + e.body + b"\n\n"
    )


async def test_the_catch_up_read_runs_however_busy_the_hub_is(
    db: Database, other: Database
) -> None:
    """Wake-ups from this process never stop, and another process's event whose id is older
    than those already read still arrives (on SQLite only the catch-up read finds it)."""
    hub = await started(db, poll_interval=0.3)
    busy = True

    async def keep_busy() -> None:
        while busy:
            await commit(db, [event("run_busy")])
            await asyncio.sleep(0.02)

    chatter = asyncio.create_task(keep_busy())
    try:
        sub = hub.subscribe(WHO, run_id="run_quiet")
        quiet = event("run_quiet")  # made now, committed after newer ones were read
        await asyncio.sleep(0.2)
        await commit(other, [quiet])
        assert [e.id for e in await received(sub, 1)] == [quiet.id]
    finally:
        busy = False
        await chatter
        await hub.stop()


async def test_a_stream_never_gets_what_it_resumed_after(db: Database) -> None:
    """The catch-up read hands out recent events the hub had not seen (it read nothing while
    no stream was open); a run stream resuming after one of them does not get it again."""
    old = [event("run_1"), event("run_1")]
    await commit(db, old)
    hub = await started(db, poll_interval=0.1)
    try:
        resumed = hub.subscribe(WHO, run_id="run_1", after=old[1].id)
        fresh = hub.subscribe(WHO, run_id="run_1")  # dedupes against its history instead
        got = await received(fresh, 2)  # the catch-up read came
        assert [e.id for e in got] == [e.id for e in old]
        new = event("run_1")
        await commit(db, [new])
        assert [e.id for e in await received(resumed, 1)] == [new.id]
    finally:
        await hub.stop()


async def _ended(sub: Subscription) -> None:
    async with asyncio.timeout(20):
        while not sub.ended:
            await sub.next_batch(1.0)


async def test_a_revoked_key_or_an_ended_session_closes_its_streams(db: Database) -> None:
    clock = SystemClock()
    keys = KeyService(db, clock)
    a, b = [await keys.create(Mode.TEST, "ws") for _ in range(2)]
    who_a, who_b = (Principal(k.api_key.workspace_id, Mode.TEST, k.api_key.id) for k in (a, b))
    token = "t" * 43
    session = WebSession(
        who_b.key_id, who_b.workspace_id, Mode.TEST, "csrf", clock.now() + timedelta(hours=1)
    )
    async with db.transaction() as conn:
        await sessions_store.insert_session(conn, session_hash(token), session, clock.now())
    hub = await started(db, poll_interval=60, recheck_every=3600)
    try:
        workspace, run = hub.subscribe(who_a), hub.subscribe(who_a, run_id="run_1")
        page = hub.subscribe(who_b, run_id="run_1", session=session_hash(token))
        kept = hub.subscribe(who_b)
        async with db.transaction() as conn:  # as another process would: nothing told
            await keys_store.revoke_key(conn, who_a.key_id, clock.now())
            await sessions_store.delete_session(conn, session_hash(token))
        hub.credentials_ended()  # what RevocationWatch and sign-out call
        await _ended(workspace)
        await _ended(run)
        await _ended(page)
        assert not kept.ended and hub.open_streams == 1
        await commit(db, [event("run_1", who=who_b)])
        assert len(await received(kept, 1)) == 1
    finally:
        await hub.stop()


async def test_streams_are_checked_again_at_each_heartbeat_untold(db: Database) -> None:
    clock = SystemClock()
    created = await KeyService(db, clock).create(Mode.TEST, "ws")
    who = Principal(created.api_key.workspace_id, Mode.TEST, created.api_key.id)
    hub = await started(db, poll_interval=60, recheck_every=0.2)
    try:
        sub = hub.subscribe(who)
        async with asyncio.timeout(20):
            while hub.rechecks < 2:
                await asyncio.sleep(0.05)
        assert not sub.ended  # a valid key's stream is left alone
        async with db.transaction() as conn:
            await keys_store.revoke_key(conn, who.key_id, clock.now())
        await _ended(sub)  # no credentials_ended(): the backstop found it
    finally:
        await hub.stop()


async def test_a_long_poll_s_wake_up_comes_for_an_event_made_before_it_that_commits_after(
    db: Database,
) -> None:
    """An event's id is made before its transaction commits: the engine made the run's
    ``flow.completed`` before the long poll began, and committed it after the poll's read
    saw the run still running. The wake-up must come all the same (with a bound by id it
    did not, and the poll waited for its fallback); and a wake-up is no stream: it takes no
    share of the key's."""
    hub = await started(db, poll_interval=60, max_per_key=1)
    try:
        made_before = event("run_1", "flow.completed")
        await asyncio.sleep(0.01)  # the watch begins a few milliseconds after its id
        woken = hub.watch(WHO, "run_1")
        stream = hub.subscribe(WHO, run_id="run_2")  # the key's one stream: still allowed
        assert hub.open_streams == 1
        await commit(db, [made_before])
        assert [e.id for e in await received(woken, 1)] == [made_before.id]
        hub.unsubscribe(woken)
        hub.unsubscribe(stream)
        assert hub.open_streams == 0
    finally:
        await hub.stop()
