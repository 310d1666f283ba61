"""Event names (SPEC §6 and ours) and the envelope every webhook carries (SPEC §2).

This module sits above the store (it builds :class:`~flowhook.store.models.Event` rows), so
the store never imports it: how long a run lasted (:func:`run_duration_ms`,
:func:`elapsed_ms`) is :mod:`flowhook.store.models`'s, named here too for the engine and the
services."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from flowhook.ids import new_id
from flowhook.store.models import Event, Mode, Run, elapsed_ms, run_duration_ms

__all__ = [
    "EVENT_TYPES",
    "TEST_EVENT",
    "cancelled_event",
    "elapsed_ms",
    "make_event",
    "run_duration_ms",
    "run_event",
]

TEST_EVENT = "webhook.test"
"""Sent by "send a test event" to one endpoint, whatever it chose."""

EVENT_TYPES: dict[str, str] = {
    "flow.started": "A workflow execution begins.",
    "flow.completed": "A workflow finishes successfully.",
    "flow.failed": "A workflow errors or times out.",
    "flow.step_completed": "Each individual step finishes.",
    "flow.step_failed": "A specific step errors.",
    "flow.cancelled": "A workflow run is cancelled.",
    "flow.approval_requested": "A run asks a person to approve or reject a step: the "
    "payload carries single-use approve and reject links.",
    "webhook.delivered": "The service receives an inbound webhook.",
    "webhook.received": "An inbound webhook is received and accepted.",
}


def make_event(
    type_: str,
    *,
    workspace_id: str,
    mode: Mode,
    flow_id: str | None,
    run_id: str | None,
    payload: dict[str, Any],
    now: datetime,
) -> Event:
    """An event whose body is the envelope serialised once, as compact UTF-8 JSON; those
    exact bytes are what is signed and sent on every attempt. The store keeps the payload's
    JSON and rebuilds the same envelope from the row (:func:`flowhook.store.models.envelope`)."""
    return Event(
        id=new_id("evt"),
        workspace_id=workspace_id,
        mode=mode,
        type=type_,
        flow_id=flow_id,
        run_id=run_id,
        created_at=now,
        payload=orjson.dumps(payload),
    )


def run_event(run: Run, type_: str, payload: dict[str, Any], now: datetime) -> Event:
    """An event about ``run`` (its workspace, mode, flow and id in the envelope)."""
    return make_event(
        type_,
        workspace_id=run.workspace_id,
        mode=run.mode,
        flow_id=run.flow_id,
        run_id=run.run_id,
        payload=payload,
        now=now,
    )


def cancelled_event(run: Run, now: datetime) -> Event:
    """``flow.cancelled`` for ``run`` ending at ``now``, whoever ends it (the worker holding
    it, or the API for a run no worker holds): the steps it executed and its duration."""
    payload = {
        "status": "cancelled",
        "steps_executed": run.steps_executed,
        "duration_ms": run_duration_ms(run, now),
    }
    return run_event(run, "flow.cancelled", payload, now)
