"""``flowhook serve`` as two cooperating processes: the API, and an engine process (worker,
webhook dispatcher, scheduler, retention) it starts beside itself, so the two use two cores.

They share the database file and one Unix socket pair (a stream of newline-ended messages),
made by the API process before it starts the engine and inherited by it. Nothing else is on disk and nothing
polls: each process watches its end with the event loop (``add_reader``), so a message costs
one ``send`` and wakes the other side at once, and the socket tells each side when the other
is gone (end of file), however it ended, ``kill -9`` included.

What travels (short text messages, several wake-ups coalesced into one per loop turn):

- API → engine: ``runs`` and ``deliveries``, whenever a commit in the API process queued
  that kind of work (a run accepted, a signal, a cancel request, a test webhook), which is
  what the in-process :class:`~flowhook.store.wakeup.Wakeup` did when both shared a process;
- engine → API: ``tasks`` after a commit that queued a ``task`` step's task, which wakes the
  workers' claims waiting in the API process (``POST /api/v1/tasks/claim``);
  ``events:<id>`` after a commit that wrote events, with the lowest id it
  wrote, so the API process's event streams hear of the engine's events as they did of their
  own (``Database.on_events``); ``ready`` once the engine has started; ``stopping`` when it
  was told to stop (SIGTERM: to it alone, or to the process group, as ``systemd`` and
  ``timeout`` do), so the API process stops too and takes the engine's exit as an orderly one.

Each process stops when the other does: the engine asks the kernel to kill it when the API
process dies (``PR_SET_PDEATHSIG``, Linux; elsewhere it drains on end of file), as a crash of
the one ``serve`` process killed both before; the API process drains and exits non-zero
when the engine is gone. Nothing is lost either way: runs and deliveries are in the database,
and leases hand back what a dead process held.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

from flowhook.config import Settings
from flowhook.store.db import Database
from flowhook.store.sqlite_inline import lock_waits

__all__ = [
    "PeerLink",
    "EngineProcess",
    "attach_api",
    "attach_engine",
    "die_with_parent",
    "log_lock_waits",
]

log = logging.getLogger("flowhook")

READY = "ready"
STOPPING = "stopping"
EVENTS = "events:"
KINDS = ("runs", "deliveries", "tasks")
TO_ENGINE = ("runs", "deliveries")
"""What the API process's commits queue for the engine's worker and dispatcher; the engine's
own commits queue ``tasks`` for the API's claims (the worker protocol's long polls)."""
START_TIMEOUT = 120.0
"""Seconds the API process waits for its engine to say it started."""
MAX_MESSAGE = 65536


class PeerLink:
    """One end of the socket pair: sends coalesced messages, hands received ones to
    ``on_wake`` / ``on_events`` / the ready flag, and calls ``on_lost`` once when the other
    end is gone."""

    def __init__(self, sock: socket.socket, on_lost: Callable[[], None]) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._on_lost = on_lost
        self.on_wake: Callable[[str], None] | None = None
        self.on_events: Callable[[str | None], None] | None = None
        self.on_stopping: Callable[[], None] | None = None
        self.ready = asyncio.Event()
        self.lost = asyncio.Event()
        self._kinds: set[str] = set()
        self._floor: str | None = None
        self._events = False
        self._flags: list[str] = []
        self._scheduled = False
        self._writing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._partial = b""
        self.sent = 0
        """Messages sent (tests and benchmarks look)."""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._readable)

    def close(self) -> None:
        if self._loop is not None and self._sock.fileno() != -1:
            self._loop.remove_reader(self._sock.fileno())
            if self._writing:
                self._loop.remove_writer(self._sock.fileno())
        self._sock.close()

    # sending

    def wake(self, kind: str) -> None:
        self._kinds.add(kind)
        self._schedule()

    def events(self, floor: str | None) -> None:
        if floor is None:
            self._events = True  # unknown: the other side looks back
        elif self._floor is None or floor < self._floor:
            self._floor = floor
        self._schedule()

    def say(self, flag: str) -> None:
        self._flags.append(flag)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and not self._writing and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self.lost.is_set():
            return
        parts = [*self._flags, *sorted(self._kinds)]
        if self._floor is not None:
            parts.append(EVENTS + self._floor)
        elif self._events:
            parts.append(EVENTS)
        if not parts:
            return
        try:
            message = (" ".join(parts) + "\n").encode()
            sent = self._sock.send(message)
            if sent < len(message):  # the buffer is all but full: the rest when it drains
                self._flags = [message[sent:].decode()]
                self._kinds.clear()
                self._floor = None
                self._events = False
                raise BlockingIOError
        except BlockingIOError:  # the other side is behind: send when it has read
            if not self._writing and self._loop is not None:
                self._writing = True
                self._loop.add_writer(self._sock.fileno(), self._writable)
            return
        except OSError:
            self._gone()
            return
        self.sent += 1
        self._flags.clear()
        self._kinds.clear()
        self._floor = None
        self._events = False

    def _writable(self) -> None:
        if self._loop is not None:
            self._loop.remove_writer(self._sock.fileno())
        self._writing = False
        self._flush()

    # receiving

    def _readable(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._gone()
                return
            if not data:
                self._gone()
                return
            data = self._partial + data
            complete, _, self._partial = data.rpartition(b"\n")
            for part in complete.decode().split():
                self._receive(part)

    def _receive(self, part: str) -> None:
        if part.startswith(EVENTS):
            if self.on_events is not None:
                self.on_events(part[len(EVENTS) :] or None)
        elif part in KINDS:
            if self.on_wake is not None:
                self.on_wake(part)
        elif part == READY:
            self.ready.set()
        elif part == STOPPING and self.on_stopping is not None:
            self.on_stopping()

    def _gone(self) -> None:
        if self.lost.is_set():
            return
        self.lost.set()
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
        self._on_lost()


def attach_api(link: PeerLink, db: Database) -> None:
    """The API process's side: its wake-ups also go to the engine, and the engine's event
    announcements reach whatever listens here (the event streams' hub)."""
    for kind in TO_ENGINE:
        db.wakeups[kind].forward = functools.partial(link.wake, kind)
    link.on_wake = lambda kind: db.wakeups[kind].notify()  # tasks the engine queued

    def announce(floor: str | None) -> None:
        if db.on_events is not None:
            db.on_events(floor)  # type: ignore[arg-type]  # the hub takes None: look back

    link.on_events = announce


def attach_engine(link: PeerLink, db: Database) -> None:
    """The engine process's side: wake-ups from the API poke its worker and dispatcher, and
    each commit that wrote events is announced to the API process."""
    link.on_wake = lambda kind: db.wakeups[kind].notify()
    db.wakeups["tasks"].forward = functools.partial(link.wake, "tasks")
    db.on_events = link.events


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); ``False`` when
    that is not available or the parent is gone already."""
    if sys.platform != "linux":
        return os.getppid() == parent_pid
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == parent_pid


class EngineProcess:
    """The API process's handle on its engine: started in the app's lifespan (after the
    store is migrated and seeded), stopped (SIGTERM, so it drains) at its end. When the
    engine exits on its own, ``on_lost`` is called (``flowhook serve`` stops its server)."""

    def __init__(self, settings: Settings, on_lost: Callable[[], None]) -> None:
        self._settings = settings
        self._on_lost = on_lost
        self.proc: subprocess.Popen[bytes] | None = None
        self.link: PeerLink | None = None
        self.failed = False
        """The engine exited while the server was not stopping."""
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self, db: Database) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        s = self._settings
        env = {
            **os.environ,
            "FLOWHOOK_DATABASE_URL": s.database_url,
            "FLOWHOOK_HOST": s.host,
            "FLOWHOOK_PORT": str(s.port),
        }
        command = [sys.executable, "-m", "flowhook", "engine", "--peer-fd", str(theirs.fileno())]
        command += ["--parent-pid", str(os.getpid())]
        try:
            # From the event loop's (main) thread, on purpose: PR_SET_PDEATHSIG follows the
            # thread that made the child, so that thread must live as long as the server.
            # (A fork takes a millisecond; this runs once, before the server takes requests.)
            self.proc = subprocess.Popen(  # noqa: ASYNC220, S603 - our own command line
                command, env=env, pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()
        link = PeerLink(mine, self._lost)
        link.on_stopping = self._engine_stopping
        if db.listen_dsn is None:  # else the database's NOTIFY tells every process already
            attach_api(link, db)
        self.link = link
        link.start()
        ready = asyncio.ensure_future(link.ready.wait())
        lost = asyncio.ensure_future(link.lost.wait())
        await asyncio.wait({ready, lost}, timeout=START_TIMEOUT, return_when="FIRST_COMPLETED")
        ready.cancel()
        lost.cancel()
        if not link.ready.is_set():
            await self.stop()
            raise RuntimeError("the engine process did not start (see its log above)")
        log.info("engine process %d started", self.proc.pid)

    def _engine_stopping(self) -> None:
        if not self._stopping:
            self._stopping = True
            log.info("the engine process is stopping; so is the server")
            self._on_lost()

    def _lost(self) -> None:
        if self._stopping:
            return
        self.failed = True
        log.error("the engine process exited; stopping the server (runs resume on restart)")
        self._on_lost()

    async def stop(self) -> None:
        """SIGTERM the engine (it drains for up to FLOWHOOK_SHUTDOWN_GRACE seconds) and wait
        for it; SIGKILL if it outstays that by far."""
        self._stopping = True
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, self._settings.shutdown_grace + 15)
            except subprocess.TimeoutExpired:
                log.error("the engine process did not stop in time; killing it")
                proc.kill()
                await asyncio.to_thread(proc.wait)
        if self.link is not None:
            self.link.close()
            self.link = None
            log_lock_waits("API")


def log_lock_waits(process: str) -> None:
    """Say how often this process waited for the other's write lock (SQLite)."""
    log.info(
        "%s process: %d waits for the other process's write lock, %.1f s in all",
        process,
        lock_waits.count,
        lock_waits.seconds,
    )
