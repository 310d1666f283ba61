"""The cap on a workspace's unfinished runs (``FLOWHOOK_MAX_ACTIVE_RUNS_PER_WORKSPACE``): an
execute past it answers 429 with ``Retry-After``, so one tenant's flood cannot grow the
queue every tenant's runs wait in without bound.

No execute pays a query for it. Each API process counts the queued and running top-level runs
of the workspaces that executed lately, in one read at most every ``interval`` seconds, in the
background, and adds what it accepted itself since; the check is a dictionary lookup. The
count may run past the cap by what the processes accept between two reads (a second's worth),
which is what a cap meant against floods needs. Each mode of a workspace has its own count:
sandbox experiments never hold back live runs."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

from flowhook.errors import RateLimited, StoreUnavailable
from flowhook.service.auth import Principal
from flowhook.store import control as control_store
from flowhook.store.db import Database

__all__ = ["ActiveRuns"]

log = logging.getLogger("flowhook")

_Scope = tuple[str, str]


class ActiveRuns:
    def __init__(self, db: Database, limit: int, *, interval: float = 1.0) -> None:
        self._db = db
        self.limit = limit
        """0: no cap."""
        self._interval = interval
        self._counted: dict[_Scope, int] = {}
        """Unfinished runs per (workspace, mode) at the last read."""
        self._since: collections.Counter[_Scope] = collections.Counter()
        """Runs this process accepted since that read."""
        self._due = 0.0
        self._reading: asyncio.Task[None] | None = None
        self.reads = 0

    def check(self, who: Principal) -> None:
        """Raise 429 when ``who``'s workspace (in its mode) has ``limit`` runs unfinished."""
        if self.limit <= 0:
            return
        scope = (who.workspace_id, str(who.mode))
        self._since[scope] += 0  # a workspace met: counted at the next read
        if time.monotonic() >= self._due and self._reading is None:
            self._reading = asyncio.create_task(self._read(), name="flowhook-active-runs")
        if self._counted.get(scope, 0) + self._since[scope] >= self.limit:
            raise RateLimited(
                f"this workspace has {self.limit} runs queued or running, the most it may have "
                "(FLOWHOOK_MAX_ACTIVE_RUNS_PER_WORKSPACE); try again when some have finished",
                retry_after=max(1, round(self._interval)),
            )

    def accepted(self, who: Principal) -> None:
        """A run of ``who`` was accepted (counted until the next read sees it)."""
        if self.limit > 0:
            self._since[(who.workspace_id, str(who.mode))] += 1

    async def _read(self) -> None:
        try:
            scopes = list(self._since)
            self._since = collections.Counter()
            self._due = time.monotonic() + self._interval
            counted = await self._count(scopes)
            self._counted = counted  # workspaces that executed nothing lately are forgotten
            self.reads += 1
        except StoreUnavailable as exc:  # keep the last counts; read again next time
            log.warning("counting unfinished runs per workspace failed: %s", exc)
        finally:
            self._reading = None

    async def _count(self, scopes: list[_Scope]) -> dict[_Scope, int]:
        workspaces = sorted({w for w, _ in scopes})
        if not workspaces:
            return {}
        async with self._db.read() as conn:
            counted = await control_store.active_counts(conn, workspaces)
        wanted = set(scopes)
        return {scope: n for scope, n in counted.items() if scope in wanted}

    async def stop(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
