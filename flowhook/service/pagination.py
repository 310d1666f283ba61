"""Cursor pagination: a page is ``{"data": [...], "next_cursor": "<last id>" | null}``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from flowhook.errors import InvalidInput
from flowhook.ids import is_id

__all__ = ["Page", "check_cursor", "page_of", "MAX_LIMIT"]

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
