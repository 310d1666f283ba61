"""Flows and their immutable versions."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.store.models import Flow, Mode
from flowhook.store.rows import from_row, owned
from flowhook.store.tables import flow_versions, flows

__all__ = [
    "insert_flow",
    "current_version",
    "add_version",
    "get_flow",
    "list_flows",
    "list_versions",
    "archive_flow",
    "get_definition",
]


async def insert_flow(
    conn: AsyncConnection,
    *,
    flow_id: str,
    workspace_id: str,
    mode: Mode,
    name: str,
    definition: dict[str, Any],
    now: datetime,
) -> Flow:
    """A new flow at version 1; raises ``Duplicate`` when another flow holds its slug."""
    await conn.execute(
        flows.insert().values(
            flow_id=flow_id,
            workspace_id=workspace_id,
            mode=str(mode),
            name=name,
            version=1,
            created_at=now,
            updated_at=now,
            # written only when there is one: the rows a flow without one writes are the same
            # as before the column was added (migration 0028)
            **({"slug": definition["slug"]} if definition.get("slug") else {}),
        )
    )
    await conn.execute(
        flow_versions.insert().values(
            flow_id=flow_id, version=1, definition=definition, created_at=now
        )
    )
    return Flow(flow_id, workspace_id, mode, name, 1, definition, now, now, None)


async def add_version(
    conn: AsyncConnection,
    flow: Flow,
    *,
    name: str,
    definition: dict[str, Any],
    now: datetime,
) -> Flow | None:
    """Make the next version current; ``None`` when another writer got there first. Raises
    ``Duplicate`` when another flow holds the new version's slug."""
    version = flow.version + 1
    result = await conn.execute(
        update(flows)
        .where(
            flows.c.flow_id == flow.flow_id,
            flows.c.version == flow.version,
            flows.c.archived_at.is_(None),
        )
        .values(version=version, name=name, updated_at=now, slug=definition.get("slug"))
    )
    if result.rowcount != 1:
        return None
    await conn.execute(
        flow_versions.insert().values(
            flow_id=flow.flow_id, version=version, definition=definition, created_at=now
        )
    )
    return dataclasses.replace(
        flow, name=name, version=version, definition=definition, updated_at=now, archived_at=None
    )


_FLOW_COLUMNS = (
    flows.c.flow_id,
    flows.c.workspace_id,
    flows.c.mode,
    flows.c.name,
    flow_versions.c.version,
    flow_versions.c.definition,
    flows.c.created_at,
    flows.c.updated_at,
    flows.c.archived_at,
)


def _flow(row: Any) -> Flow:
    return from_row(Flow, row, {"mode": Mode})


def _current_versions() -> Any:
    """Flows with their current version's columns (:data:`_FLOW_COLUMNS`)."""
    return select(*_FLOW_COLUMNS).join(
        flow_versions,
        (flow_versions.c.flow_id == flows.c.flow_id) & (flow_versions.c.version == flows.c.version),
    )


@cache
def _current_statement() -> Any:
    """A flow's current version, not archived, if the workspace and mode own it: the query
    of :func:`get_flow` that accepting a run makes, built once with bound values."""
    return _current_versions().where(
        flows.c.flow_id == bindparam("flow_id", type_=flows.c.flow_id.type),
        flows.c.workspace_id == bindparam("workspace_id", type_=flows.c.workspace_id.type),
        flows.c.mode == bindparam("mode", type_=flows.c.mode.type),
        flows.c.archived_at.is_(None),
    )


async def get_flow(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    flow_id: str,
    *,
    version: int | None = None,
    include_archived: bool = False,
) -> Flow | None:
    """The flow at ``version`` (its current one by default), if the workspace and mode own it."""
    if version is None and not include_archived:  # every accept: a statement built once
        params = {"flow_id": flow_id, "workspace_id": workspace_id, "mode": mode.value}
        row = (await conn.execute(_current_statement(), params)).first()
        return _flow(row) if row else None
    version_match = (
        flow_versions.c.version == flows.c.version
        if version is None
        else flow_versions.c.version == version
    )
    q = (
        select(*_FLOW_COLUMNS)
        .join(flow_versions, (flow_versions.c.flow_id == flows.c.flow_id) & version_match)
        .where(owned(flows.c.flow_id, flow_id, workspace_id, mode))
    )
    if not include_archived:
        q = q.where(flows.c.archived_at.is_(None))
    row = (await conn.execute(q)).first()
    return _flow(row) if row else None


async def list_flows(
    conn: AsyncConnection,
    workspace_id: str,
    mode: Mode,
    *,
    limit: int,
    after: str | None = None,
    slug: str | None = None,
) -> list[Flow]:
    """Current versions, newest flow first; ``after`` is the last flow id of the page before;
    ``slug``: the flow that holds it, if any."""
    q = (
        _current_versions()
        .where(
            flows.c.workspace_id == workspace_id,
            flows.c.mode == str(mode),
            flows.c.archived_at.is_(None),
        )
        .order_by(flows.c.flow_id.desc())
        .limit(limit)
    )
    if slug is not None:
        q = q.where(flows.c.slug == slug)
    if after is not None:
        q = q.where(flows.c.flow_id < after)
    return [_flow(r) for r in (await conn.execute(q)).all()]


async def list_versions(conn: AsyncConnection, flow: Flow) -> list[tuple[int, datetime]]:
    q = (
        select(flow_versions.c.version, flow_versions.c.created_at)
        .where(flow_versions.c.flow_id == flow.flow_id)
        .order_by(flow_versions.c.version.desc())
    )
    return [(r.version, r.created_at) for r in (await conn.execute(q)).all()]


async def archive_flow(
    conn: AsyncConnection, workspace_id: str, mode: Mode, flow_id: str, now: datetime
) -> bool:
    result = await conn.execute(
        update(flows)
        .where(owned(flows.c.flow_id, flow_id, workspace_id, mode), flows.c.archived_at.is_(None))
        .values(archived_at=now, updated_at=now)
    )
    return result.rowcount == 1


async def get_definition(
    conn: AsyncConnection, flow_id: str, version: int
) -> dict[str, Any] | None:
    """A version's definition, whoever owns it (for the engine; versions never change)."""
    q = select(flow_versions.c.definition).where(
        flow_versions.c.flow_id == flow_id, flow_versions.c.version == version
    )
    return (await conn.execute(q)).scalar_one_or_none()


async def current_version(conn: AsyncConnection, flow_id: str) -> int | None:
    """The flow's latest version, whoever owns it (for the engine's flow control)."""
    q = select(flows.c.version).where(flows.c.flow_id == flow_id)
    return (await conn.execute(q)).scalar_one_or_none()


async def names_of(
    conn: AsyncConnection, workspace_id: str, mode: Mode, flow_ids: Sequence[str]
) -> dict[str, str]:
    """The name of each of ``flow_ids`` the workspace and mode own (archived ones too: their
    runs still name them)."""
    if not flow_ids:
        return {}
    q = select(flows.c.flow_id, flows.c.name).where(
        flows.c.flow_id.in_(sorted(set(flow_ids))),
        flows.c.workspace_id == workspace_id,
        flows.c.mode == str(mode),
    )
    return {r.flow_id: r.name for r in (await conn.execute(q)).all()}


async def paused_at(conn: AsyncConnection, flow_ids: list[str]) -> dict[str, datetime]:
    """When each of the paused flows among ``flow_ids`` was paused (not read with the flow:
    the accept path's read stays as it was)."""
    if not flow_ids:
        return {}
    q = select(flows.c.flow_id, flows.c.paused_at).where(
        flows.c.flow_id.in_(flow_ids), flows.c.paused_at.is_not(None)
    )
    return {r.flow_id: r.paused_at for r in (await conn.execute(q)).all()}
