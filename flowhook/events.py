"""Event names (SPEC §6 and ours) and the envelope every webhook carries (SPEC §2)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from flowhook.clock import isoformat
from flowhook.ids import new_id
from flowhook.store.models import Event, Mode

__all__ = ["EVENT_TYPES", "TEST_EVENT", "make_event"]

TEST_EVENT = "webhook.test"
"""Sent by "send a test event" to one endpoint, whatever it chose."""

EVENT_TYPES: dict[str, str] = {
    "flow.started": "A workflow execution begins.",
    "flow.completed": "A workflow finishes successfully.",
    "flow.failed": "A workflow errors or times out.",
    "flow.step_completed": "Each individual step finishes.",
    "flow.step_failed": "A specific step errors.",
    "flow.cancelled": "A workflow run is cancelled (ours, not in the spec).",
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
    exact bytes are what is stored, signed and sent on every attempt."""
    body = orjson.dumps(
        {
            "event": type_,
            "flow_id": flow_id,
            "run_id": run_id,
            "timestamp": isoformat(now),
            "payload": payload,
        }
    )
    return Event(
        id=new_id("evt"),
        workspace_id=workspace_id,
        mode=mode,
        type=type_,
        flow_id=flow_id,
        run_id=run_id,
        created_at=now,
        body=body,
    )
