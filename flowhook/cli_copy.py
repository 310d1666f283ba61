"""``flowhook db copy``'s display: a line per table (updated in place on a terminal, plain
lines elsewhere), then the verified counts and what to set on the servers. The copying
itself is :mod:`flowhook.store.copy`'s."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowhook.store.copy import Copied

__all__ = ["Interrupted", "ProgressLines", "progress_line", "run", "source_url", "summary"]

BAR = 24
PLAIN_EVERY = 5.0
"""Seconds between a long table's plain lines when the output is not a terminal."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the copy (its transaction rolled back)."""


def run(work: Coroutine[Any, Any, Copied]) -> Copied:
    """``work`` on an event loop until it ends, or until SIGINT or SIGTERM cancels it:
    then :class:`Interrupted`, whatever error the cancelled statement became on its way out
    (a driver may report a cancelled query as a failure of its own)."""
    stopped = False

    async def main() -> Copied:
        nonlocal stopped
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        return await work

    try:
        return asyncio.run(main())
    except BaseException:
        if stopped:
            raise Interrupted from None
        raise


def source_url(given: str) -> str:
    """``--from`` as a database URL: a URL as it is, anything else a SQLite file's path."""
    if "://" in given:
        return given
    return f"sqlite:///{Path(given).expanduser().resolve()}"


def progress_line(table: str, done: int, total: int, seconds: float) -> str:
    """``runs        [########----------------]   40,000 / 100,000 rows  21,350 rows/s``"""
    filled = BAR if total == 0 else min(BAR, BAR * done // total)
    rate = done / seconds if seconds > 0 else 0.0
    return (
        f"{table:<18} [{'#' * filled}{'-' * (BAR - filled)}] "
        f"{done:>10,} / {total:,} rows  {rate:,.0f} rows/s"
    )


class ProgressLines:
    """The ``progress`` callback of :func:`flowhook.store.copy.copy_database`: on a
    terminal one line per table rewritten in place as batches land; elsewhere a line when a
    table is done (and every :data:`PLAIN_EVERY` seconds of a long one)."""

    def __init__(self, out: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.tty = out.isatty()
        self.clock = clock
        self.table = ""
        self.since = 0.0
        self.said = 0.0

    def __call__(self, table: str, done: int, total: int) -> None:
        now = self.clock()
        if table != self.table:
            self.table, self.since, self.said = table, now, now
        line = progress_line(table, done, total, now - self.since)
        finished = done >= total
        if self.tty:
            self.out.write("\r\x1b[2K" + line + ("\n" if finished else ""))
        elif finished or now - self.said >= PLAIN_EVERY:
            self.out.write(line + "\n")
            self.said = now
        self.out.flush()


def summary(copied: Copied) -> list[str]:
    """The lines after the copy: rows per table, the totals, the key to set."""
    width = max((len(name) for name in copied.counts), default=0)
    lines = [f"  {name:<{width}}  {n:>10,} rows" for name, n in copied.counts.items()]
    rate = copied.rows / copied.seconds if copied.seconds > 0 else 0.0
    lines += [
        f"copied {copied.rows:,} rows of {len(copied.counts)} tables in {copied.seconds:.1f} s "
        f"({rate:,.0f} rows/s); each table's row count matches the source's",
    ]
    if copied.key is not None:
        lines.append(copied.key.say())
    lines.append(
        "next: start `flowhook api` and `flowhook worker` (or `flowhook serve`) with "
        "FLOWHOOK_DATABASE_URL set to the --to URL and that FLOWHOOK_SECRET_KEY"
    )
    return lines
