"""Cursor pagination: a page is ``{"data": [...], "next_cursor": "<last id>" | null}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from flowhook.errors import InvalidInput
from flowhook.ids import is_id
from flowhook.store.db import Connection, Database

__all__ = ["Page", "check_cursor", "listed", "page_of", "MAX_LIMIT"]

T = TypeVar("T")
MAX_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    data: list[T]
    next_cursor: str | None


def page_of(rows: list[T], limit: int, cursor_of: Callable[[T], str]) -> Page[T]:
    """The page of up to ``limit + 1`` rows read after the cursor: the extra row only says
    that more follow, and the next cursor is the last row kept."""
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, cursor_of(rows[-1]) if more else None)


def check_cursor(cursor: str | None, prefix: str) -> str | None:
    if cursor is None or cursor == "":
        return None
    if not is_id(cursor, prefix):
        raise InvalidInput("cursor is not one this list gave out", field="cursor")
    return cursor


async def listed(
    db: Database,
    prefix: str,
    *,
    limit: int,
    cursor: str | None,
    fetch: Callable[[Connection, str | None, int], Awaitable[list[T]]],
    cursor_of: Callable[[T], str],
) -> Page[T]:
    """One page of a list, newest first: ``limit`` checked (1 to :data:`MAX_LIMIT`),
    ``cursor`` checked to be an id of the list (``prefix``), then ``fetch(conn, after,
    limit + 1)`` read in one snapshot and cut by :func:`page_of`."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}", field="limit")
    after = check_cursor(cursor, prefix)
    async with db.read() as conn:
        rows = await fetch(conn, after, limit + 1)
    return page_of(rows, limit, cursor_of)
