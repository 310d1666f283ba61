"""The socket between `flowhook serve`'s API and engine processes (flowhook.peer), both ends
in one test process: wake-ups and event announcements cross, coalesced; a closed end is
noticed by the other."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from flowhook.peer import PeerLink, attach_api, attach_engine
from flowhook.store.db import Database


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_wakeups_cross_coalesced_and_events_carry_the_lowest_id(tmp_path: Path) -> None:
    a, b = pair()
    api_db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    engine_db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    lost: list[str] = []
    api = PeerLink(a, on_lost=lambda: lost.append("api"))
    engine = PeerLink(b, on_lost=lambda: lost.append("engine"))
    attach_api(api, api_db)
    attach_engine(engine, engine_db)
    announced: list[str | None] = []
    api_db.on_events = announced.append
    api.start()
    engine.start()
    try:
        for _ in range(100):
            api_db.wakeups["runs"].notify()  # a commit that queued a run, 100 times in a turn
        api_db.wakeups["deliveries"].notify()
        await turns()
        assert api.sent == 1  # one message for the whole turn
        assert await engine_db.wakeups["runs"].wait(1.0)
        assert await engine_db.wakeups["deliveries"].wait(1.0)

        assert engine_db.on_events is not None
        engine_db.on_events("evt_02")
        engine_db.on_events("evt_01")
        await turns()
        assert announced == ["evt_01"]
        engine.events(None)  # unknown: the hub looks back
        await turns()
        assert announced == ["evt_01", None]

        engine.say("ready")
        await asyncio.wait_for(api.ready.wait(), 1.0)
        assert lost == []
    finally:
        api.close()
        await turns()
        engine.close()
        await api_db.dispose()
        await engine_db.dispose()
    assert lost == ["engine"]  # the engine's end saw the API's close


async def test_a_dead_peer_is_noticed_and_sending_to_it_is_harmless() -> None:
    a, b = pair()
    gone = asyncio.Event()
    link = PeerLink(a, on_lost=gone.set)
    link.start()
    try:
        b.close()
        await asyncio.wait_for(gone.wait(), 1.0)
        link.wake("runs")
        await turns()
        assert link.lost.is_set()
    finally:
        link.close()


@pytest.mark.parametrize("flag", ["stopping"])
async def test_flags_reach_their_handler(flag: str) -> None:
    a, b = pair()
    heard: list[str] = []
    sender = PeerLink(a, on_lost=lambda: None)
    receiver = PeerLink(b, on_lost=lambda: None)
    receiver.on_stopping = lambda: heard.append(flag)
    sender.start()
    receiver.start()
    try:
        sender.say(flag)
        for _ in range(50):
            await asyncio.sleep(0.001)
            if heard:
                break
        assert heard == [flag]
    finally:
        sender.close()
        receiver.close()
