"""`flowhook db copy`'s pure parts: the order of the tables, the batches' key condition, the
lock a server and a copy take, and the progress lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy.dialects import postgresql

from flowhook.cli_copy import ProgressLines, progress_line, source_url
from flowhook.store.copy import CopyRefused, KeyAdvice, after_key, copy_order, source_keys
from flowhook.store.holding import Held, holding, lock_file_for
from flowhook.store.tables import delivery_attempts, metadata, runs, workers


def test_every_table_is_copied_each_after_the_tables_it_points_at() -> None:
    order = [t.name for t in copy_order()]
    assert sorted(order) == sorted(metadata.tables)
    assert "alembic_version" not in order
    for table in copy_order():
        for fk in table.foreign_keys:
            assert order.index(fk.column.table.name) < order.index(table.name), fk


def _sql(condition: object) -> str:
    compiled = condition.compile(  # type: ignore[attr-defined]
        dialect=postgresql.dialect(), compile_kwargs={"render_postcompile": True}
    )
    return " ".join(str(compiled).split())


def test_the_next_batch_starts_after_the_last_key_of_the_one_before() -> None:
    assert _sql(after_key(runs, ["run_x"])) == "runs.run_id > %(run_id_1)s"
    two = _sql(after_key(delivery_attempts, ["dlv_x", 3]))
    assert two == (
        "delivery_attempts.delivery_id > %(delivery_id_1)s OR "
        "delivery_attempts.delivery_id = %(delivery_id_2)s AND "
        "delivery_attempts.number > %(number_1)s::INTEGER"
    )
    three = _sql(after_key(workers, ["w", "ws_1", "test"]))
    assert three.count(" OR ") == 2 and three.endswith("workers.mode > %(mode_1)s::VARCHAR")


def test_a_copy_and_a_server_exclude_each_other_on_a_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowhook.db'}"
    assert lock_file_for(url) == tmp_path / "flowhook.db.lock"
    shared = [holding(url, exclusive=False), holding(url, exclusive=False)]  # servers share it
    with shared[0], shared[1], pytest.raises(Held), holding(url, exclusive=True):
        pass
    with holding(url, exclusive=True), pytest.raises(Held), holding(url, exclusive=False):
        pass
    with holding(url, exclusive=True):  # released when the holder let go
        pass
    with holding("postgresql://x@h/db", exclusive=True) as none:
        assert none is None


def test_progress_lines_on_a_pipe_say_each_table_once_it_is_done() -> None:
    out = io.StringIO()
    now = [0.0]
    lines = ProgressLines(out, clock=lambda: now[0])
    lines("runs", 0, 10_000)
    now[0] = 1.0
    lines("runs", 5_000, 10_000)
    now[0] = 2.0
    lines("runs", 10_000, 10_000)
    lines("events", 0, 0)
    said = out.getvalue().splitlines()
    assert len(said) == 2
    assert said[0].startswith("runs") and "10,000 / 10,000 rows" in said[0]
    assert "5,000 rows/s" in said[0] and "#" * 24 in said[0]
    assert said[1].startswith("events") and "0 / 0 rows" in said[1]


def test_a_progress_line_shows_the_share_done() -> None:
    line = progress_line("runs", 25, 100, 0.5)
    assert "[######------------------]" in line and "50 rows/s" in line


def test_from_takes_a_path_or_a_url(tmp_path: Path) -> None:
    assert source_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert source_url(str(tmp_path / "f.db")) == f"sqlite:///{tmp_path / 'f.db'}"


def test_the_key_advice_names_the_key_file_never_its_content(tmp_path: Path) -> None:
    path = tmp_path / "my db.key"
    said = KeyAdvice("k" * 44, "file", path).say()
    assert f"FLOWHOOK_SECRET_KEY=$(cat '{path}')" in said and "k" * 44 not in said
    assert "k" * 44 not in KeyAdvice("k" * 44, "setting").say()
    assert "k" * 44 in KeyAdvice("k" * 44, "new").say()  # made for the target: shown once


def test_the_keys_come_from_the_setting_the_key_file_or_are_made(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowhook.db'}"
    made = source_keys(None, url)
    assert made.came_from == "new" and not (tmp_path / "flowhook.db.key").exists()
    (tmp_path / "flowhook.db.key").write_text(made.keys + "\n")
    assert source_keys(None, url) == KeyAdvice(made.keys, "file", tmp_path / "flowhook.db.key")
    assert source_keys(made.keys, url).came_from == "setting"
    with pytest.raises(CopyRefused, match="FLOWHOOK_SECRET_KEY is not set"):
        source_keys(None, "postgresql://u@h/db")
