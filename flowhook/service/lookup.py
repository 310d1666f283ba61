"""Finding one resource of the caller's workspace and mode by its id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from flowhook.errors import NotFound
from flowhook.ids import is_id
from flowhook.store.db import Connection, Database

__all__ = ["find", "missing"]

T = TypeVar("T")


def missing(what: str, item_id: str) -> NotFound:
    """The one answer for an id that is malformed, unknown or another tenant's: the three
    are never told apart, so ids of other workspaces cannot be probed."""
    return NotFound(f"no {what} {item_id!r} in this workspace and mode")


async def find(
    db: Database,
    what: str,
    prefix: str,
    item_id: str,
    fetch: Callable[[Connection], Awaitable[T | None]],
) -> T:
    """``fetch``'s row for ``item_id`` (an id with ``prefix``), read in one snapshot; raises
    :func:`missing` when there is none, without a query for an id of the wrong shape."""
    found = None
    if is_id(item_id, prefix):
        async with db.read() as conn:
            found = await fetch(conn)
    if found is None:
        raise missing(what, item_id)
    return found
