"""Flows: create, version, read, list, archive."""

from __future__ import annotations

import asyncio
from typing import Any

from flowhook.clock import Clock
from flowhook.definition import validate_definition
from flowhook.errors import Conflict, NotFound
from flowhook.ids import new_id
from flowhook.service.auth import Principal
from flowhook.service.jsonvalues import check_json
from flowhook.service.lookup import missing
from flowhook.service.pagination import Page, listed
from flowhook.store import flows as flows_store
from flowhook.store.db import Database
from flowhook.store.models import Flow

__all__ = ["FlowService"]


class FlowService:
    def __init__(self, db: Database, clock: Clock, *, allow_private_targets: bool = False) -> None:
        self._db = db
        self._clock = clock
        self._allow_private = allow_private_targets

    async def _validated(self, definition: Any) -> dict[str, Any]:
        """The definition, checked off the event loop: compiling its expressions may take
        a second or more (bounded by validate.COMPILE_SECONDS), and every tenant's requests
        go on meanwhile."""
        return await asyncio.to_thread(
            validate_definition, definition, allow_private_targets=self._allow_private
        )

    async def create(self, who: Principal, definition: Any) -> Flow:
        check_json(definition, "definition")
        definition = await self._validated(definition)
        async with self._db.transaction() as conn:
            return await flows_store.insert_flow(
                conn,
                flow_id=new_id("wf"),
                workspace_id=who.workspace_id,
                mode=who.mode,
                name=definition["name"],
                definition=definition,
                now=self._clock.now(),
            )

    async def update(self, who: Principal, flow_id: str, definition: Any) -> Flow:
        check_json(definition, "definition")
        definition = await self._validated(definition)
        async with self._db.transaction() as conn:
            flow = await flows_store.get_flow(conn, who.workspace_id, who.mode, flow_id)
            if flow is None:
                raise missing("flow", flow_id)
            updated = await flows_store.add_version(
                conn, flow, name=definition["name"], definition=definition, now=self._clock.now()
            )
        if updated is None:
            raise Conflict("the flow changed while this update ran; try again")
        return updated

    async def get(self, who: Principal, flow_id: str, version: int | None = None) -> Flow:
        async with self._db.read() as conn:
            flow = await flows_store.get_flow(
                conn, who.workspace_id, who.mode, flow_id, version=version
            )
        if flow is None:
            if version is not None:
                raise NotFound(f"no version {version} of flow {flow_id!r}")
            raise missing("flow", flow_id)
        return flow

    async def versions(self, who: Principal, flow_id: str) -> list[dict[str, Any]]:
        async with self._db.read() as conn:
            flow = await flows_store.get_flow(conn, who.workspace_id, who.mode, flow_id)
            if flow is None:
                raise missing("flow", flow_id)
            rows = await flows_store.list_versions(conn, flow)
        return [{"version": v, "created_at": at} for v, at in rows]

    async def list(self, who: Principal, *, limit: int, cursor: str | None) -> Page[Flow]:
        return await listed(
            self._db, "wf", limit=limit, cursor=cursor, cursor_of=lambda row: row.flow_id,
            fetch=lambda conn, after, n: flows_store.list_flows(
                conn, who.workspace_id, who.mode, limit=n, after=after
            ),
        )  # fmt: skip

    async def archive(self, who: Principal, flow_id: str) -> None:
        async with self._db.transaction() as conn:
            done = await flows_store.archive_flow(
                conn, who.workspace_id, who.mode, flow_id, self._clock.now()
            )
        if not done:
            raise missing("flow", flow_id)
