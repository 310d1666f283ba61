"""service.pagination.page_of: a page from the limit + 1 rows a store read."""

from __future__ import annotations

from flowhook.service.pagination import Page, page_of


def test_a_short_read_is_the_last_page() -> None:
    assert page_of(["a", "b"], 2, str.upper) == Page(["a", "b"], None)
    assert page_of([], 5, str.upper) == Page([], None)


def test_the_extra_row_is_dropped_and_the_last_kept_is_the_cursor() -> None:
    assert page_of(["a", "b", "c"], 2, str.upper) == Page(["a", "b"], "B")
