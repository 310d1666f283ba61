"""what a run costs on disk: event bodies rebuilt, not stored; SQLite's keyed tables clustered

Revision ID: 0020
Revises: 0019

An event's body is the envelope of SPEC §2 around its payload; the envelope repeats the row's
own columns (type, flow and run ids, the time), about 150 of its bytes. ``events.payload``
now keeps the payload's JSON alone and the body is rebuilt from the row, byte for byte the
same (``flowhook.store.models.envelope``), so a replay still sends and signs what was sent
first. Each existing event is split here: its payload is taken out of the stored body and
the envelope rebuilt around it; where that gives the stored bytes exactly (every event this
code wrote), ``body`` becomes NULL, otherwise it keeps them and they are what is sent.

The index of a run's events is on ``run_id`` alone (it was ``(run_id, id)``): on SQLite its
entries hold the event's id all the same (the primary key of a table without rowids), so
they still come in id order; on PostgreSQL B-tree deduplication keeps one entry per run.

On SQLite, ``events``, ``run_steps`` and ``delivery_attempts`` become ``WITHOUT ROWID``
tables: their rows are stored in their primary key's order, in the key's own B-tree, instead
of a table of rowids beside an index repeating the key. Those three are rebuilt (copied into
the new table, the old one dropped): no foreign key points at them, so dropping them deletes
nothing elsewhere.

Measured with 200,000 events (``flowhook migrate`` on a 2-core machine): 5.5 s on SQLite
(the rebuilt tables' old pages stay in the file as free pages until it is vacuumed), 6.9 s
on PostgreSQL (each event row rewritten once; autovacuum reclaims the old versions):
about half a minute per million events.

"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from alembic import op

from flowhook.store.models import envelope
from flowhook.store.types import JSONType, UTCDateTime

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_BATCH = 5000

_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _tables(suffix: str, *, rowid: bool) -> dict[str, sa.Table]:
    """The three rebuilt tables as this migration leaves them (``rowid=False``) or as it found them,
    named ``<name><suffix>``."""
    md = sa.MetaData(naming_convention=_CONVENTION)
    kw: dict[str, Any] = {} if rowid else {"sqlite_with_rowid": False}
    sa.Table("runs", md, sa.Column("run_id", sa.String(40), primary_key=True))
    sa.Table("deliveries", md, sa.Column("id", sa.String(40), primary_key=True))

    def at(name: str, required: bool = True) -> sa.Column[Any]:
        return sa.Column(name, UTCDateTime(), nullable=not required)

    events = sa.Table(
        "events" + suffix,
        md,
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("workspace_id", sa.String(40), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("flow_id", sa.String(40)),
        sa.Column("run_id", sa.String(40)),
        at("created_at"),
        *([] if rowid else [sa.Column("payload", sa.LargeBinary(), nullable=False)]),
        sa.Column("body", sa.LargeBinary(), nullable=rowid is False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        **kw,
    )
    steps = sa.Table(
        "run_steps" + suffix,
        md,
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        at("started_at", False),
        at("finished_at", False),
        sa.Column("duration_ms", sa.BigInteger()),
        sa.Column("output", JSONType),
        sa.Column("error", JSONType),
        sa.Column("interrupted", JSONType),
        sa.Column("reused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name="fk_run_steps_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "idx", name="pk_run_steps"),
        **kw,
    )
    attempts = sa.Table(
        "delivery_attempts" + suffix,
        md,
        sa.Column("delivery_id", sa.String(40), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        at("started_at"),
        at("finished_at", False),
        sa.Column("duration_ms", sa.BigInteger()),
        sa.Column("address", sa.String(100)),
        sa.Column("status_code", sa.Integer()),
        sa.Column("response_excerpt", sa.Text()),
        sa.Column("error_class", sa.String(32)),
        sa.Column("error_detail", sa.Text()),
        at("next_attempt_at", False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["deliveries.id"],
            name="fk_delivery_attempts_delivery_id_deliveries",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("delivery_id", "number", name="pk_delivery_attempts"),
        **kw,
    )
    return {"events": events, "run_steps": steps, "delivery_attempts": attempts}


def split(row: Any, created_at: datetime) -> tuple[bytes, bytes | None]:
    """An event row's (payload, body): the payload taken out of its stored body, and the body
    only when the envelope rebuilt around that payload is not exactly the stored bytes."""
    body = bytes(row.body)
    try:
        payload = orjson.dumps(orjson.loads(body)["payload"])
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return b"null", body
    rebuilt = envelope(row.type, row.flow_id, row.run_id, created_at, payload)
    return payload, (None if rebuilt == body else body)


_OLD_COLUMNS = ("id", "workspace_id", "mode", "type", "flow_id", "run_id", "created_at", "body")


def _old_events(bind: Any, created_at: Any) -> Iterator[list[Any]]:
    """The events as 0018 keeps them, in id order, ``_BATCH`` at a time; ``created_at`` of
    the type given."""
    old = sa.table(
        "events",
        *(sa.column(c) for c in _OLD_COLUMNS if c != "created_at"),
        sa.column("created_at", created_at),
    )
    after = ""
    while True:
        q = sa.select(old).where(old.c.id > after).order_by(old.c.id).limit(_BATCH)
        rows = bind.execute(q).all()
        if not rows:
            return
        yield rows
        after = rows[-1].id


def _sqlite_time(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _upgrade_sqlite(bind: Any) -> None:
    for name, table in _tables("_0019", rowid=False).items():
        table.create(bind)
        columns = [c.name for c in table.c]
        if name == "events":  # created_at as stored (text), rows re-inserted as they were
            insert = sa.text(
                f"INSERT INTO {table.name} ({', '.join(columns)})"
                f" VALUES ({', '.join(':' + c for c in columns)})"
            )
            for rows in _old_events(bind, sa.Text()):
                values = []
                for r in rows:
                    payload, body = split(r, _sqlite_time(r.created_at))
                    values.append({**r._asdict(), "payload": payload, "body": body})
                bind.execute(insert, values)
        else:
            listed = ", ".join(columns)
            bind.execute(
                sa.text(f"INSERT INTO {table.name} ({listed}) SELECT {listed} FROM {name}")
            )
        bind.execute(sa.text(f"DROP TABLE {name}"))
        bind.execute(sa.text(f"ALTER TABLE {table.name} RENAME TO {name}"))
    op.create_index("ix_events_run_id", "events", ["run_id"])
    op.create_index("ix_events_workspace_id_mode_id", "events", ["workspace_id", "mode", "id"])


def _upgrade_postgresql(bind: Any) -> None:
    op.drop_index("ix_events_run_id_id", table_name="events")
    op.create_index("ix_events_run_id", "events", ["run_id"])
    op.add_column("events", sa.Column("payload", sa.LargeBinary(), nullable=True))
    op.alter_column("events", "body", existing_type=sa.LargeBinary(), nullable=True)
    update = sa.text("UPDATE events SET payload = :payload, body = :body WHERE id = :k")
    for rows in _old_events(bind, UTCDateTime()):
        values = []
        for r in rows:
            payload, body = split(r, r.created_at)
            values.append({"k": r.id, "payload": payload, "body": body})
        bind.execute(update, values)
    op.alter_column("events", "payload", existing_type=sa.LargeBinary(), nullable=False)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _upgrade_sqlite(bind)
    else:
        _upgrade_postgresql(bind)


def downgrade() -> None:
    """Every body stored whole again (rebuilt where it was not kept); SQLite's three tables
    with rowids again."""
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    new = sa.table(
        "events",
        *(sa.column(c) for c in ("id", "type", "flow_id", "run_id", "payload", "body")),
        sa.column("created_at", UTCDateTime()),
    )
    after = ""
    while True:
        q = sa.select(new).where(new.c.id > after).order_by(new.c.id).limit(_BATCH)
        rows = bind.execute(q).all()
        if not rows:
            break
        whole = [
            {
                "k": r.id,
                "body": envelope(r.type, r.flow_id, r.run_id, r.created_at, bytes(r.payload)),
            }
            for r in rows
            if r.body is None
        ]
        if whole:
            bind.execute(sa.text("UPDATE events SET body = :body WHERE id = :k"), whole)
        after = rows[-1].id
    if not sqlite:
        op.drop_index("ix_events_run_id", table_name="events")
        op.create_index("ix_events_run_id_id", "events", ["run_id", "id"])
        op.drop_column("events", "payload")
        op.alter_column("events", "body", existing_type=sa.LargeBinary(), nullable=False)
        return
    for name, table in _tables("_0018", rowid=True).items():
        table.create(bind)
        listed = ", ".join(c.name for c in table.c)
        bind.execute(sa.text(f"INSERT INTO {table.name} ({listed}) SELECT {listed} FROM {name}"))
        bind.execute(sa.text(f"DROP TABLE {name}"))
        bind.execute(sa.text(f"ALTER TABLE {table.name} RENAME TO {name}"))
    op.create_index("ix_events_run_id_id", "events", ["run_id", "id"])
    op.create_index("ix_events_workspace_id_mode_id", "events", ["workspace_id", "mode", "id"])
