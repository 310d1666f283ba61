"""A batch of accepts (group commit) reads its Idempotency-Keys in one statement per
workspace and mode, and still answers each request as if it had been committed alone: a
key seen before replays its run (or conflicts on another body), a key past its window is
forgotten and starts a new run, a key repeated inside the batch replays the batch's own
run, and the same key in another workspace is another key."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import event

from flowhook.clock import FakeClock
from flowhook.errors import IdempotencyConflict, NotFound
from flowhook.service import Services
from flowhook.service.idempotency import IDEMPOTENCY_WINDOW
from flowhook.service.runs import Started
from flowhook.store import runs as runs_store
from flowhook.store.db import Database
from flowhook.store.models import Mode
from flowhook.store.wakeup import Wakeup
from tests.integration.test_delivery_claim import _sqlite_plan

FLOW: dict[str, Any] = {
    "name": "keyed",
    "steps": [{"id": "a", "type": "transform", "output": {"x": "{{ payload.x }}"}}],
}


async def test_a_batch_reads_its_keys_once_and_answers_each_as_alone(
    db: Database, services: Services
) -> None:
    clock = FakeClock()
    services = Services(db, clock, services.settings, Wakeup())
    a = await services.keys.authenticate(
        f"Bearer {(await services.keys.create(Mode.TEST, 'acme')).key}"
    )
    b = await services.keys.authenticate(
        f"Bearer {(await services.keys.create(Mode.TEST, 'other')).key}"
    )
    live = await services.keys.authenticate(
        f"Bearer {(await services.keys.create(Mode.LIVE, 'acme')).key}"
    )
    flow_a = (await services.flows.create(a, FLOW)).flow_id
    flow_b = (await services.flows.create(b, FLOW)).flow_id
    flow_live = (await services.flows.create(live, FLOW)).flow_id
    no_flow = "wf_01m820q4ddefvv66zvf1hagfbr"

    def start(who: Any, flow_id: str, x: int, key: str | None) -> Any:
        return services.runs.start(who, flow_id=flow_id, payload={"x": x}, idempotency_key=key)

    old = await start(a, flow_a, 1, "old")
    stale = await start(a, flow_a, 7, "stale")
    clock.advance(IDEMPOTENCY_WINDOW.total_seconds() - 60)
    seen = await start(a, flow_a, 2, "seen")
    clock.advance(120)  # "old" and "stale" are past their window now, "seen" is not

    lookups: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if "idempotency_key IS NOT NULL" in statement:
            lookups.append(statement)

    event.listen(db.writer.sync_engine, "before_cursor_execute", count)
    try:
        answers = await asyncio.gather(
            start(a, flow_a, 2, "seen"),  # the same request again
            start(a, flow_a, 3, "seen"),  # another body under the same key
            start(a, flow_a, 2, "seen"),  # the same request a third time
            start(a, flow_a, 1, "old"),  # past its window: a new run
            start(a, flow_a, 1, "old"),  # repeats that new run
            start(a, flow_a, 4, "new"),
            start(a, flow_a, 4, "new"),  # repeats the batch's own run
            start(b, flow_b, 2, "seen"),  # another workspace's key
            start(live, flow_live, 2, "seen"),  # the same workspace's other mode
            start(a, no_flow, 7, "stale"),  # fails: the key is forgotten all the same
            start(a, flow_a, 7, "stale"),  # so this starts a new run
            start(a, flow_a, 5, None),
            return_exceptions=True,
        )
    finally:
        event.remove(db.writer.sync_engine, "before_cursor_execute", count)

    (again, conflict, third, renewed, renewed_again, new, new_again, elsewhere, other_mode,
     failed, restarted, unkeyed) = answers  # fmt: skip
    assert isinstance(again, Started) and again.replayed
    assert again.run.run_id == seen.run.run_id
    assert isinstance(conflict, IdempotencyConflict)
    assert isinstance(third, Started) and third.replayed
    assert third.run.run_id == seen.run.run_id
    assert isinstance(renewed, Started) and not renewed.replayed
    assert renewed.run.run_id != old.run.run_id
    assert isinstance(renewed_again, Started) and renewed_again.replayed
    assert renewed_again.run.run_id == renewed.run.run_id
    assert isinstance(new, Started) and not new.replayed
    assert isinstance(new_again, Started) and new_again.replayed
    assert new_again.run.run_id == new.run.run_id
    assert isinstance(elsewhere, Started) and not elsewhere.replayed
    assert elsewhere.run.run_id != seen.run.run_id
    assert isinstance(other_mode, Started) and not other_mode.replayed
    assert other_mode.run.run_id not in (seen.run.run_id, elsewhere.run.run_id)
    assert isinstance(failed, NotFound)
    assert isinstance(restarted, Started) and not restarted.replayed
    assert restarted.run.run_id != stale.run.run_id
    assert isinstance(unkeyed, Started) and not unkeyed.replayed
    # One batch, three scopes (acme's sandbox, other's sandbox, acme live): three reads.
    assert len(lookups) == 3, lookups

    # What was committed answers the same way afterwards, one request at a time.
    assert (await start(a, flow_a, 1, "old")).run.run_id == renewed.run.run_id
    assert (await start(a, flow_a, 4, "new")).run.run_id == new.run.run_id
    assert (await start(b, flow_b, 2, "seen")).run.run_id == elsewhere.run.run_id
    assert (await start(live, flow_live, 2, "seen")).run.run_id == other_mode.run.run_id
    assert (await start(a, flow_a, 7, "stale")).run.run_id == restarted.run.run_id
    ids = {
        r.run_id
        for r in (await services.runs.list(a, limit=100, cursor=None)).data  # acme's sandbox runs
    }
    assert ids == {old.run.run_id, stale.run.run_id, seen.run.run_id, renewed.run.run_id,
                   restarted.run.run_id, new.run.run_id, unkeyed.run.run_id}  # fmt: skip


async def test_the_keys_read_on_sqlite_searches_the_unique_index(tmp_path: Path) -> None:
    """The read takes the keys as an ``IN`` list, and the index is partial (``WHERE
    idempotency_key IS NOT NULL``): SQLite still searches it, key by key. PostgreSQL's
    plan of the same read is checked in test_run_statistics.py."""
    plan = await _sqlite_plan(tmp_path, runs_store._by_idempotency_keys("sqlite"))
    assert plan == [
        "SEARCH runs USING INDEX uq_runs_workspace_id_mode_idempotency_key"
        " (workspace_id=? AND mode=? AND idempotency_key=?)"
    ], plan
