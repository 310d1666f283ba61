"""Endpoint and hook secrets encrypted at rest (DESIGN.md "Secrets and exposure").

The store seals a secret as it writes it and opens it as it reads it, so the layers above
only ever see plaintext. A stored value is self-describing: ``enc:v1:`` and a Fernet token
(AES-128-CBC with HMAC-SHA256) sealed under the newest key; any other value is plaintext
written before secrets were encrypted, read as it is until the migration or
``flowhook secrets rotate`` seals it.

Keys come from ``FLOWHOOK_SECRET_KEY`` (comma-separated, newest first; opening tries each).
Without it, a SQLite database uses a key file beside it (``<database>.key``, mode 0600),
made on first use; PostgreSQL refuses to start.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncConnection

from flowhook.errors import SecretKeyError
from flowhook.store.holding import database_file

__all__ = [
    "PREFIX",
    "SETTING",
    "SecretBox",
    "Keyring",
    "generate_key",
    "parse_keys",
    "key_file_for",
    "cipher",
]

log = logging.getLogger("flowhook")

PREFIX = "enc:v1:"
SETTING = "FLOWHOOK_SECRET_KEY"
HOW_TO_MAKE = "make one with `flowhook secrets generate-key`"
INFO_KEY = "flowhook.keyring"
"""Where a :class:`~flowhook.store.db.Database` puts its keyring in each connection's info."""

_CACHE_SIZE = 4096


def generate_key() -> str:
    """A fresh key: 32 random bytes in URL-safe base64 (44 characters)."""
    return Fernet.generate_key().decode()


def parse_keys(text: str, source: str = SETTING) -> list[str]:
    """The keys in ``text`` (comma-separated, newest first), each checked; errors name the
    source and the key's position, never the key."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise SecretKeyError(f"{source} holds no key; {HOW_TO_MAKE}")
    for n, key in enumerate(keys, 1):
        try:
            raw = base64.urlsafe_b64decode(key.encode("ascii"))
        except (ValueError, binascii.Error):
            raw = b""
        if len(key) != 44 or len(raw) != 32:
            where = f"key {n} of {len(keys)} in {source}" if len(keys) > 1 else source
            raise SecretKeyError(
                f"{where} is not 32 bytes in URL-safe base64 (44 characters); {HOW_TO_MAKE}"
            )
    return keys


class SecretBox:
    """Seals under the newest key, opens under any. Opened values are remembered by their
    sealed form (tokens never repeat), so the dispatcher decrypts an endpoint's secret once,
    not once a delivery."""

    def __init__(self, keys: Sequence[str], source: str = SETTING) -> None:
        fernets = [Fernet(k) for k in keys]
        self.source = source
        self._newest = fernets[0]
        self._any = MultiFernet(fernets)
        self._opened: dict[str, str] = {}

    def seal(self, plaintext: str) -> str:
        return PREFIX + self._newest.encrypt(plaintext.encode()).decode()

    def open(self, stored: str) -> str:
        """The plaintext of a stored value (plaintext rows pass through)."""
        if not stored.startswith(PREFIX):
            return stored
        found = self._opened.get(stored)
        if found is not None:
            return found
        try:
            plaintext = self._any.decrypt(stored[len(PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SecretKeyError(
                f"a stored secret cannot be decrypted with any key in {self.source}: the key "
                "it was encrypted with is missing (keep old keys listed after the newest "
                "until `flowhook secrets rotate` has run)"
            ) from None
        if len(self._opened) >= _CACHE_SIZE:
            del self._opened[next(iter(self._opened))]  # oldest first
        self._opened[stored] = plaintext
        return plaintext

    def sealed_with_newest(self, stored: str) -> bool:
        if not stored.startswith(PREFIX):
            return False
        try:
            self._newest.decrypt(stored[len(PREFIX) :].encode())
        except InvalidToken:
            return False
        return True


def key_file_for(database_url: str) -> Path | None:
    """``<database file>.key`` for a SQLite file; ``None`` for memory or PostgreSQL."""
    path = database_file(database_url)
    return None if path is None else path.with_name(path.name + ".key")


def _load_or_create(path: Path) -> list[str]:
    """The keys in the key file, making it first when there is none. The new file appears
    whole (written beside it, then hard-linked, which fails when one exists), so two
    processes starting at once end up with the same key."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(generate_key() + "\n")
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use theirs
            else:
                _fsync_dir(path.parent)  # the link must outlive a power loss, like the rows
                log.warning(
                    "made a secret key file %s (mode 0600) to encrypt webhook secrets; "
                    "back it up with the database, or set %s",
                    path,
                    SETTING,
                )
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return parse_keys(path.read_text(encoding="ascii"), f"the key file {path}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Keyring:
    """Where a database's keys come from; resolved once, on first use (the start's
    migration), so a missing or malformed key stops the process before it serves."""

    def __init__(self, secret_key: SecretStr | str | None, database_url: str) -> None:
        if isinstance(secret_key, SecretStr):
            secret_key = secret_key.get_secret_value()
        self._given = secret_key or None
        self._url = database_url
        self._box: SecretBox | None = None

    def box(self) -> SecretBox:
        if self._box is None:
            self._box = self._resolve()
        return self._box

    def _resolve(self) -> SecretBox:
        if self._given is not None:
            return SecretBox(parse_keys(self._given), SETTING)
        path = key_file_for(self._url)
        if path is not None:
            return SecretBox(_load_or_create(path), f"the key file {path}")
        if self._url.startswith("sqlite"):
            return SecretBox([generate_key()], "an in-memory key")  # a database in memory
        raise SecretKeyError(
            f"{SETTING} is not set: PostgreSQL needs it to encrypt webhook and hook secrets; "
            f"{HOW_TO_MAKE} and set it on every api and worker process"
        )


def cipher(conn: AsyncConnection) -> SecretBox:
    """The secret box of the database this connection belongs to."""
    keyring = conn.info.get(INFO_KEY)
    if not isinstance(keyring, Keyring):
        raise SecretKeyError("this connection does not come from a flowhook Database")
    return keyring.box()
