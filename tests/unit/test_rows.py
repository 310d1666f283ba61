"""``from_row`` works out once per class and result shape where each field is: rows of the
same class from differently shaped results still map by name, never by a stale position."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import create_engine, text

from flowhook.store.rows import from_row


@dataclass
class Thing:
    a: str
    b: int = 0
    c: str | None = None


def _rows(sql: str) -> list[object]:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        return list(conn.execute(text(sql)).all())


def test_fields_map_by_name_whatever_the_order_of_the_columns() -> None:
    abc = _rows("SELECT 'x' AS a, 1 AS b, 'y' AS c UNION ALL SELECT 'z', 2, NULL")
    cba = _rows("SELECT 'q' AS c, 5 AS b, 'p' AS a, 9 AS other")
    only_a = _rows("SELECT 'k' AS a")
    for _ in range(2):  # the second time from the plans made the first
        assert [from_row(Thing, r) for r in abc] == [Thing("x", 1, "y"), Thing("z", 2, None)]
        assert from_row(Thing, cba[0]) == Thing("p", 5, "q")
        assert from_row(Thing, only_a[0]) == Thing("k")  # missing fields keep their defaults


def test_given_values_win_and_converters_apply() -> None:
    [row] = _rows("SELECT 'x' AS a, '7' AS b, 'y' AS c")
    assert from_row(Thing, row, {"b": int}) == Thing("x", 7, "y")
    assert from_row(Thing, row, {"b": int}, c="given") == Thing("x", 7, "given")
    assert from_row(Thing, row, {"b": int}, a="A", b=3) == Thing("A", 3, "y")
