"""Alembic environment: run with the connection that :func:`flowhook.store.migrate` hands in."""

from __future__ import annotations

from alembic import context

from flowhook.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only `flowhook migrate` drives this module
    raise RuntimeError("run migrations with `flowhook migrate`")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
