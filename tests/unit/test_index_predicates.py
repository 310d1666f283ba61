"""The partial indexes over a status or ``held`` (flowhook/store/tables.py) and the guards the
queries state (flowhook/store/guards.py) agree term for term: SQLite uses a partial index
only for a query whose WHERE has the index's own term."""

from __future__ import annotations

from typing import Any

import pytest

from flowhook.store import tables
from flowhook.store.guards import (
    ACTIVE_RUN,
    ACTIVE_RUN_INDEX,
    PENDING_DELIVERY,
    PENDING_DELIVERY_INDEX,
    held_is,
    status_in,
)
from flowhook.store.models import (
    DELIVERY_TRANSITIONS,
    TRANSITIONS,
    DeliveryStatus,
    Held,
    RunStatus,
    active,
)


def partial_indexes() -> dict[str, Any]:
    return {
        str(ix.name): ix
        for table in tables.metadata.tables.values()
        for ix in table.indexes
        if ix.dialect_options["sqlite"].get("where") is not None
    }


def predicate(name: str) -> str:
    return str(partial_indexes()[name].dialect_options["sqlite"]["where"].text)


def test_every_partial_index_is_the_same_on_both_backends() -> None:
    for name, ix in partial_indexes().items():
        sqlite, postgresql = (ix.dialect_options[d]["where"].text for d in ("sqlite", "postgresql"))
        assert sqlite == postgresql, name


@pytest.mark.parametrize("name", ["ix_runs_claimable", "ix_runs_queue"])
def test_the_queue_s_indexes_hold_the_active_runs(name: str) -> None:
    assert predicate(name) == ACTIVE_RUN_INDEX == "status IN ('queued', 'running')"
    assert f"runs.{predicate(name)}" == ACTIVE_RUN  # what the claim and its reads state
    assert status_in(None, active(TRANSITIONS)) == ACTIVE_RUN_INDEX
    assert {RunStatus(s) for s in ("queued", "running")} == {s for s in RunStatus if s.active}


@pytest.mark.parametrize(
    "name",
    [
        "ix_deliveries_due",
        "ix_deliveries_due_at",
        "ix_deliveries_pending",
        "ix_deliveries_endpoint_due",
    ],
)
def test_the_due_deliveries_indexes_hold_the_pending_ones(name: str) -> None:
    assert predicate(name) == PENDING_DELIVERY_INDEX == "status = 'pending'"
    assert f"deliveries.{predicate(name)}" == PENDING_DELIVERY
    assert status_in(None, active(DELIVERY_TRANSITIONS)) == PENDING_DELIVERY_INDEX
    assert active(DELIVERY_TRANSITIONS) == (DeliveryStatus.PENDING,)


def test_the_held_runs_indexes() -> None:
    assert predicate("ix_runs_held") == held_is(Held.CONCURRENCY) == "held = 'concurrency'"
    assert predicate("ix_runs_debounce") == held_is(Held.DEBOUNCE) == "held = 'debounce'"
    assert held_is(Held.THROTTLE, "runs") == "runs.held = 'throttle'"


def test_the_overview_s_indexes() -> None:
    assert predicate("ix_runs_queued") == "status = 'queued'"
    assert predicate("ix_runs_completed") == "status = 'completed' AND root_run_id IS NULL"


def test_every_status_or_held_predicate_comes_from_the_guards() -> None:
    """A partial index of runs or deliveries over a status or ``held`` written by hand
    would be caught here."""
    terms = {
        ACTIVE_RUN_INDEX,
        PENDING_DELIVERY_INDEX,
        *(status_in(None, [s]) for s in (*RunStatus, *DeliveryStatus)),
        *(held_is(h) for h in Held),
    }
    for table in (tables.runs, tables.deliveries):
        for ix in table.indexes:
            where = ix.dialect_options["sqlite"].get("where")
            text = "" if where is None else str(where.text)
            if "status" in text or "held" in text:
                assert text.split(" AND ")[0] in terms, ix.name
