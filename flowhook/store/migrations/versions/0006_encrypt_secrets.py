"""encrypt endpoint and hook secrets at rest

Revision ID: 0006
Revises: 0005

Widens the endpoint secret columns to hold a sealed value (``enc:v1:`` and a Fernet token),
then seals every plaintext secret with the key :func:`flowhook.store.migrate.migrate` hands
in (``config.attributes["secret_box"]``). SQLite changes the column type by adding the new
column, copying, dropping the old one and renaming: a rebuilt table would cascade-delete the
endpoints' event subscriptions.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from flowhook.store import secrets
from flowhook.store.crypto import SecretBox

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COLUMNS = (("secret", False), ("previous_secret", True))


def _box() -> SecretBox:
    box = context.config.attributes.get("secret_box")
    if not isinstance(box, SecretBox):
        raise RuntimeError("run migrations with `flowhook migrate`: it brings the secret key")
    return box


def _retype(type_: sa.types.TypeEngine[str], old: sa.types.TypeEngine[str]) -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name, nullable in _COLUMNS:
            op.alter_column("webhook_endpoints", name, type_=type_, existing_type=old,
                            existing_nullable=nullable)  # fmt: skip
        return
    ddl = type_.compile(dialect=op.get_bind().dialect)
    for name, nullable in _COLUMNS:
        fill = "" if nullable else " NOT NULL DEFAULT ''"
        op.execute(f"ALTER TABLE webhook_endpoints ADD COLUMN {name}_new {ddl}{fill}")
        op.execute(f"UPDATE webhook_endpoints SET {name}_new = {name}")
        op.execute(f"ALTER TABLE webhook_endpoints DROP COLUMN {name}")
        op.execute(f"ALTER TABLE webhook_endpoints RENAME COLUMN {name}_new TO {name}")


def upgrade() -> None:
    _retype(sa.Text(), sa.String(length=100))
    done = secrets.reseal(op.get_bind(), _box(), mode="seal", packed_ids=False)  # text until 0023
    done.raise_if_unreadable(_box().source)


def downgrade() -> None:
    """Back to plaintext (the columns stay wide: a sealed-then-opened secret fits either)."""
    done = secrets.reseal(op.get_bind(), _box(), mode="open", packed_ids=False)
    done.raise_if_unreadable(_box().source)
