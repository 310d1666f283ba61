"""Flows: create, version, read, list, archive."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from flowhook.clock import Clock
from flowhook.definition import secrets_of, validate_definition
from flowhook.errors import Conflict, Duplicate, InvalidDefinition, InvalidInput, NotFound
from flowhook.ids import is_id, new_id
from flowhook.service.auth import Principal
from flowhook.service.jsonvalues import check_json
from flowhook.service.lookup import missing
from flowhook.service.pagination import Page, listed
from flowhook.store import flows as flows_store
from flowhook.store import pausing, step_secrets
from flowhook.store.db import Connection, Database
from flowhook.store.models import Flow

RESUME_RATE = 1000.0
"""Held runs a resume lets go a second, unless it says another pace: thousands of them take
their turn beside other flows' runs, not ahead of them."""


def _check_flow_id(flow_id: str) -> None:
    if not is_id(flow_id, "wf"):
        raise missing("flow", flow_id)


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

    async def validate(self, definition: Any, who: Principal | None = None) -> dict[str, Any]:
        """The definition as it would be saved; raises what saving it would (400): with
        ``who``, also for a secret its workspace and mode do not hold."""
        check_json(definition, "definition")
        checked = await self._validated(definition)
        if who is not None:
            async with self._db.read() as conn:
                await self._check_secrets(conn, who, checked)
        return checked

    @staticmethod
    async def _check_secrets(conn: Connection, who: Principal, definition: Any) -> None:
        """Refuse a definition whose http steps read a secret the workspace and mode do
        not hold (one deleted later fails the step that reads it, with error type secret)."""
        wanted = secrets_of(definition)
        held = await step_secrets.existing_names(conn, who.workspace_id, who.mode, wanted)
        unknown = sorted(set(wanted) - held)
        if unknown:
            field, label = wanted[unknown[0]]
            raise InvalidDefinition(
                f"{label}: {field} reads secrets.{unknown[0]}, but this workspace has no "
                f"secret {unknown[0]!r} in {who.mode} mode; create it first (POST "
                "/api/v1/secrets)",
                field=field,
            )

    async def create(self, who: Principal, definition: Any) -> Flow:
        definition = await self.validate(definition)
        try:
            async with self._db.transaction() as conn:
                await self._check_secrets(conn, who, definition)
                return await flows_store.insert_flow(
                    conn,
                    flow_id=new_id("wf"),
                    workspace_id=who.workspace_id,
                    mode=who.mode,
                    name=definition["name"],
                    definition=definition,
                    now=self._clock.now(),
                )
        except Duplicate:
            raise await self._slug_taken(who, definition["slug"]) from None

    async def update(self, who: Principal, flow_id: str, definition: Any) -> Flow:
        definition = await self.validate(definition)
        try:
            async with self._db.transaction() as conn:
                flow = await flows_store.get_flow(conn, who.workspace_id, who.mode, flow_id)
                if flow is None:
                    raise missing("flow", flow_id)
                await self._check_secrets(conn, who, definition)
                updated = await flows_store.add_version(
                    conn, flow, name=definition["name"], definition=definition,
                    now=self._clock.now(),
                )  # fmt: skip
        except Duplicate:
            raise await self._slug_taken(who, definition["slug"]) from None
        if updated is None:
            raise Conflict("the flow changed while this update ran; try again")
        return updated

    async def _slug_taken(self, who: Principal, slug: str) -> Conflict:
        holder = await self.by_slug(who, slug)
        which = f" ({holder.flow_id}, {holder.name!r})" if holder is not None else ""
        return Conflict(
            f"slug {slug!r} belongs to another flow of this workspace{which}: a slug names one "
            "flow; change this one's, or save a new version of that flow instead"
        )

    async def by_slug(self, who: Principal, slug: str) -> Flow | None:
        """The flow that holds ``slug`` (not archived), if one does."""
        async with self._db.read() as conn:
            found = await flows_store.list_flows(
                conn, who.workspace_id, who.mode, limit=1, slug=slug
            )
        return found[0] if found else None

    async def names(self, who: Principal, flow_ids: Sequence[str]) -> dict[str, str]:
        """The names of the caller's flows among ``flow_ids`` (for pages that list ids)."""
        async with self._db.read() as conn:
            return await flows_store.names_of(conn, who.workspace_id, who.mode, flow_ids)

    async def get(self, who: Principal, flow_id: str, version: int | None = None) -> Flow:
        async with self._db.read() as conn:
            flow = await flows_store.get_flow(
                conn, who.workspace_id, who.mode, flow_id, version=version
            )
            if flow is not None:
                paused = await flows_store.paused_at(conn, [flow_id])
                flow = dataclasses.replace(flow, paused_at=paused.get(flow_id))
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

    async def list(
        self, who: Principal, *, limit: int, cursor: str | None, slug: str | None = None
    ) -> Page[Flow]:
        async def fetch(conn: Connection, after: str | None, n: int) -> list[Flow]:
            found = await flows_store.list_flows(
                conn, who.workspace_id, who.mode, limit=n, after=after, slug=slug
            )
            paused = await flows_store.paused_at(conn, [f.flow_id for f in found])
            return [dataclasses.replace(f, paused_at=paused.get(f.flow_id)) for f in found]

        return await listed(
            self._db, "wf", limit=limit, cursor=cursor, cursor_of=lambda row: row.flow_id,
            fetch=fetch,
        )  # fmt: skip

    async def pause(self, who: Principal, flow_id: str) -> Flow:
        """Pause the flow: it still accepts executes, and its queued runs (those accepted
        after too: an engine worker hands them back held, seeing the pause within a second)
        wait until :meth:`resume`; runs a worker has started go on."""
        _check_flow_id(flow_id)
        now = self._clock.now()
        async with self._db.transaction() as conn:
            if not await pausing.mark(conn, who.workspace_id, who.mode, flow_id, now):
                raise missing("flow", flow_id)
            await pausing.hold_queued(conn, flow_id)
        return await self.get(who, flow_id)

    async def resume(self, who: Principal, flow_id: str, rate: float | None = None) -> Flow:
        """Resume the flow: its held runs go oldest first, ``rate`` a second (default
        :data:`RESUME_RATE`)."""
        _check_flow_id(flow_id)
        pace = RESUME_RATE if rate is None else rate
        if not 0 < pace <= 100_000:
            raise InvalidInput("rate_per_second must be above 0, at most 100000",
                               field="rate_per_second")  # fmt: skip
        now = self._clock.now()
        async with self._db.transaction() as conn:
            if not await pausing.mark(conn, who.workspace_id, who.mode, flow_id, None):
                raise missing("flow", flow_id)
            await pausing.release(conn, flow_id, now, pace)
        return await self.get(who, flow_id)

    async def archive(self, who: Principal, flow_id: str) -> None:
        async with self._db.transaction() as conn:
            done = await flows_store.archive_flow(
                conn, who.workspace_id, who.mode, flow_id, self._clock.now()
            )
        if not done:
            raise missing("flow", flow_id)
