"""Who holds a SQLite database file: the servers that run on it, or a copy that reads it.

``flowhook serve``, ``api`` and ``worker`` hold a *shared* advisory lock (``flock``) on
``<database>.lock`` beside a SQLite file for as long as they run (several may share one file);
``flowhook db copy`` takes an *exclusive* one without waiting, so it refuses a source a
running server holds, and a server refuses to start while a copy reads its file. The kernel
lets the lock go when the process ends, however it ends (``kill -9`` included), so a lock
file left behind holds nothing. PostgreSQL and databases in memory have no such file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import make_url

__all__ = ["Held", "database_file", "lock_file_for", "holding"]


class Held(Exception):
    """The lock is held the other way (a server holds the file a copy wants, or the reverse)."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.path = path


def database_file(database_url: str) -> Path | None:
    """The SQLite file a URL names; ``None`` for memory or PostgreSQL."""
    url = make_url(database_url)
    if not url.drivername.startswith("sqlite"):
        return None
    name = url.database or ""
    if name.startswith("file:"):
        name = name.removeprefix("file:").split("?", 1)[0]
    if not name or name == ":memory:" or url.query.get("mode") == "memory":
        return None
    return Path(name)


def lock_file_for(database_url: str) -> Path | None:
    """``<database file>.lock`` for a SQLite file; ``None`` for memory or PostgreSQL."""
    path = database_file(database_url)
    return None if path is None else path.with_name(path.name + ".lock")


@contextlib.contextmanager
def holding(database_url: str, *, exclusive: bool) -> Iterator[Path | None]:
    """Hold the database's lock file (shared for a server, exclusive for a copy) for the
    block, without waiting: raises :class:`Held` when it is held the other way. Yields the
    lock file, or ``None`` where there is none (PostgreSQL, memory, a directory this process
    may not write to: nothing to hold there)."""
    path = lock_file_for(database_url)
    fd = None
    if path is not None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            path = None  # a read-only directory: the lock is advisory, go on without it
    try:
        if fd is not None and path is not None:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                raise Held(path) from None
        yield path
    finally:
        if fd is not None:
            os.close(fd)  # the lock goes with the last descriptor of this open file
