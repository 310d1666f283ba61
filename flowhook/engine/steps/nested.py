"""What the steps that start runs (``flow``, ``parallel``, ``map``) read and write of the
runs they start: a small port over the store, which a unit test replaces with a fake."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from flowhook.store import children as children_store
from flowhook.store import control as control_store
from flowhook.store import events as events_store
from flowhook.store import flows as flows_store
from flowhook.store import runs as runs_store
from flowhook.store import trees as trees_store
from flowhook.store.models import Event, Flow, Mode, Run

if TYPE_CHECKING:
    from flowhook.store.db import Connection as AsyncConnection

__all__ = ["NestedStore", "STORE"]


class NestedStore(Protocol):
    async def get_flow(
        self, conn: AsyncConnection, workspace_id: str, mode: Mode, flow_id: str
    ) -> Flow | None:
        """A flow of the workspace and mode (another's is not found)."""

    async def take_child(self, conn: AsyncConnection, tree_run_id: str, budget: int) -> str | None:
        """One more run of the tree, in the transaction that inserts it; ``None`` when it may
        start, else why not (``budget``, ``cancelled``)."""

    async def insert_run(self, conn: AsyncConnection, run: Run) -> None: ...

    async def insert_parts(
        self, conn: AsyncConnection, parts: Sequence[Run], *, released: int
    ) -> None:
        """Queue the parts, the first ``released`` claimable now."""

    async def lock_parent(self, conn: AsyncConnection, parent_run_id: str) -> None:
        """Serialise the run with the ends of the runs it started."""

    async def child_at(self, conn: AsyncConnection, parent_run_id: str, idx: int) -> Run | None: ...

    async def parts_at(self, conn: AsyncConnection, parent_run_id: str, idx: int) -> list[Run]: ...

    async def stop(
        self, conn: AsyncConnection, run_id: str, now: datetime, *, idx: int | None = None
    ) -> list[Run]:
        """Cancel the unfinished runs the run started (at step ``idx`` only, if given) and
        theirs, their concurrency slots given on; the runs ended here."""

    async def insert_events(self, conn: AsyncConnection, events: Sequence[Event]) -> None: ...


class _Store:
    """:class:`NestedStore` on the store."""

    async def get_flow(
        self, conn: AsyncConnection, workspace_id: str, mode: Mode, flow_id: str
    ) -> Flow | None:
        return await flows_store.get_flow(conn, workspace_id, mode, flow_id)

    async def take_child(self, conn: AsyncConnection, tree_run_id: str, budget: int) -> str | None:
        return await trees_store.take_child(conn, tree_run_id, budget)

    async def insert_run(self, conn: AsyncConnection, run: Run) -> None:
        await runs_store.insert_run(conn, run)

    async def insert_parts(
        self, conn: AsyncConnection, parts: Sequence[Run], *, released: int
    ) -> None:
        await children_store.insert_parts(conn, parts, released=released)

    async def lock_parent(self, conn: AsyncConnection, parent_run_id: str) -> None:
        await children_store.lock_parent(conn, parent_run_id)

    async def child_at(self, conn: AsyncConnection, parent_run_id: str, idx: int) -> Run | None:
        return await children_store.child_at(conn, parent_run_id, idx)

    async def parts_at(self, conn: AsyncConnection, parent_run_id: str, idx: int) -> list[Run]:
        return await children_store.parts_at(conn, parent_run_id, idx)

    async def stop(
        self, conn: AsyncConnection, run_id: str, now: datetime, *, idx: int | None = None
    ) -> list[Run]:
        ended = await children_store.cancel_children(conn, [run_id], now, idx=idx)
        await control_store.free_slots(conn, ended, now)
        return ended

    async def insert_events(self, conn: AsyncConnection, events: Sequence[Event]) -> None:
        await events_store.insert_events(conn, events)


STORE: NestedStore = _Store()
