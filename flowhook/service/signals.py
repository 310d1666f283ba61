"""Signals: sent to every run waiting for one (``POST /signals``) or to one run
(``POST /flows/runs/{id}/signal``); each resumes the ``wait`` steps it matches now, and is
kept for the runs that reach their ``wait`` later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowhook.clock import Clock
from flowhook.errors import Conflict, Duplicate, InvalidInput
from flowhook.ids import is_id, new_id
from flowhook.service.auth import Principal
from flowhook.service.jsonvalues import encode_json
from flowhook.service.lookup import missing
from flowhook.store import runs as runs_store
from flowhook.store import signals as signals_store
from flowhook.store.db import Connection, Database
from flowhook.store.signals import Signal

__all__ = ["SignalService", "Sent", "MAX_NAME", "MAX_ID", "check_name", "store_signal"]

MAX_NAME = 200
MAX_ID = 255


@dataclass(frozen=True, slots=True)
class Sent:
    signal: Signal
    matched: int
    """How many ``wait`` steps it resumed now (0 for a signal ``id`` sent before)."""
    duplicate: bool = False
    """Its ``id`` was sent before: ``signal`` is that first signal, and nothing more was done."""


def check_name(name: Any, field: str = "name") -> None:
    """A signal name: 1 to 200 printable characters, or 400 naming ``field``."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not name.isprintable():
        raise InvalidInput(
            f"{field} must be 1 to {MAX_NAME} printable characters, such as order.paid",
            field=field,
        )


async def store_signal(conn: Connection, signal: Signal) -> Sent:
    """In the caller's write transaction: store ``signal`` and resume the ``wait`` steps it
    matches; a ``dedup_key`` used before answers the first signal and does nothing."""
    await signals_store.lock_name(conn, signal.workspace_id, signal.mode, signal.name)
    earlier = await signals_store.insert_signal(conn, signal)
    if earlier is not None:
        return Sent(earlier, 0, duplicate=True)
    resumed = await signals_store.deliver(conn, signal, signal.created_at)
    return Sent(signal, len(resumed))


def _check(name: Any, data: Any, dedup_key: Any) -> None:
    check_name(name)
    if not isinstance(data, dict):
        raise InvalidInput('data must be a JSON object, such as {"order_id": "o_1"}', field="data")
    if dedup_key is not None and (
        not isinstance(dedup_key, str) or not 1 <= len(dedup_key) <= MAX_ID
    ):
        raise InvalidInput(f"id must be 1 to {MAX_ID} characters", field="id")


class SignalService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self._db = db
        self._clock = clock

    async def send(
        self,
        who: Principal,
        name: str,
        data: dict[str, Any] | None = None,
        *,
        dedup_key: str | None = None,
        run_id: str | None = None,
    ) -> Sent:
        """Store a signal and resume the ``wait`` steps it matches, in one transaction. To
        one run (``run_id``): that run's ``wait`` on ``name``, whatever its ``match``; a run
        that has ended answers 409. The same ``dedup_key`` again answers the first signal
        and resumes nothing."""
        data = {} if data is None else data
        _check(name, data, dedup_key)
        encode_json(data, "data")  # storable as sent, or 400 naming the field
        if run_id is not None and not is_id(run_id, "run"):
            raise missing("run", run_id)
        now = self._clock.now()
        signal = Signal(
            id=new_id("sig"), workspace_id=who.workspace_id, mode=who.mode, name=name,
            data=data, created_at=now, run_id=run_id, dedup_key=dedup_key,
        )  # fmt: skip
        try:
            return await self._send(who, signal)
        except Duplicate:  # the same id, sent with another name at the same time
            return await self._send(who, signal)

    async def _send(self, who: Principal, signal: Signal) -> Sent:
        run_id = signal.run_id
        async with self._db.transaction() as conn:
            if run_id is not None:
                run = await runs_store.get_run(conn, who.workspace_id, who.mode, run_id)
                if run is None:
                    raise missing("run", run_id)
                if run.status.terminal:
                    earlier = await signals_store.sent_before(conn, signal)
                    if earlier is not None:  # a retry of a signal sent before it ended
                        return Sent(earlier, 0, duplicate=True)
                    raise Conflict(
                        f"run {run_id!r} has already ended ({run.status}): it waits for nothing",
                        code="run_finished",
                    )
            return await store_signal(conn, signal)
