"""Step secrets: named values ``{{ secrets.NAME }}`` gives an http step. Set, replaced, listed
(names and times, never values) and deleted; read only by the engine as it sends a request."""

from __future__ import annotations

from flowhook.clock import Clock
from flowhook.definition import SECRET_NAME, is_secret_name
from flowhook.errors import Conflict, Duplicate, InvalidInput, NotFound
from flowhook.service.auth import Principal
from flowhook.store import step_secrets as store
from flowhook.store.db import Database
from flowhook.store.step_secrets import SecretInfo

__all__ = ["SecretService", "SecretInfo", "MAX_VALUE_CHARS"]

MAX_VALUE_CHARS = 8192


def _checked_name(name: str) -> str:
    if not is_secret_name(name):
        raise InvalidInput(
            f"name must match {SECRET_NAME.pattern} (upper case, digits and _, a letter first, "
            "at most 64 characters)",
            field="name",
        )
    return name


def _checked_value(value: str) -> str:
    if not value or len(value) > MAX_VALUE_CHARS:
        raise InvalidInput(f"value must be 1 to {MAX_VALUE_CHARS} characters long", field="value")
    return value


def _missing(name: str) -> NotFound:
    return NotFound(f"no secret {name!r} in this workspace and mode")


class SecretService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def create(self, who: Principal, name: str, value: str) -> SecretInfo:
        name, value = _checked_name(name), _checked_value(value)
        try:
            async with self._db.transaction() as conn:
                return await store.insert_secret(
                    conn, who.workspace_id, who.mode, name, value, self._clock.now()
                )
        except Duplicate:
            raise Conflict(
                f"secret {name!r} already exists in this workspace and mode; PUT "
                f"/api/v1/secrets/{name} replaces its value",
                code="secret_exists",
            ) from None

    async def replace(self, who: Principal, name: str, value: str) -> SecretInfo:
        value = _checked_value(value)
        if not is_secret_name(name):
            raise _missing(name)
        async with self._db.transaction() as conn:
            found = await store.replace_secret(
                conn, who.workspace_id, who.mode, name, value, self._clock.now()
            )
        if found is None:
            raise _missing(name)
        return found

    async def list(self, who: Principal) -> list[SecretInfo]:
        async with self._db.read() as conn:
            return await store.list_secrets(conn, who.workspace_id, who.mode)

    async def delete(self, who: Principal, name: str) -> None:
        deleted = False
        if is_secret_name(name):
            async with self._db.transaction() as conn:
                deleted = await store.delete_secret(conn, who.workspace_id, who.mode, name)
        if not deleted:
            raise _missing(name)
