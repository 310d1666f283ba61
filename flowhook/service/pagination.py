"""Cursor pagination: a page is ``{"data": [...], "next_cursor": "<last id>" | null}``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from flowhook.errors import InvalidInput
from flowhook.ids import is_id

__all__ = ["Page", "check_cursor", "MAX_LIMIT"]

T = TypeVar("T")
MAX_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    data: list[T]
    next_cursor: str | None


def check_cursor(cursor: str | None, prefix: str) -> str | None:
    if cursor is None or cursor == "":
        return None
    if not is_id(cursor, prefix):
        raise InvalidInput("cursor is not one this list gave out", field="cursor")
    return cursor
