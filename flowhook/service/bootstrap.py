"""First start: on an empty database, a workspace, a sandbox key, a live key and an example
flow, so a newcomer can call the API at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowhook.service.auth import KeyService, Principal
from flowhook.service.flows import FlowService
from flowhook.store import keys as keys_store
from flowhook.store.db import Database
from flowhook.store.models import Mode

__all__ = ["EXAMPLE_FLOW", "EXAMPLE_PAYLOAD", "Bootstrapped", "bootstrap"]

EXAMPLE_FLOW: dict[str, Any] = {
    "name": "Process order (example)",
    "timeout_seconds": 900,
    "steps": [
        {"id": "check", "type": "condition", "if": "{{ payload.amount > 0 }}", "else": "fail"},
        {"id": "price", "type": "transform", "output": {"total": "{{ payload.amount * 1.2 }}"}},
        {
            "id": "summary",
            "type": "transform",
            "output": {"line": "Order {{ payload.order_id }}: {{ steps.price.output.total }}"},
        },
    ],
    "output": {"order_id": "{{ payload.order_id }}", "total": "{{ steps.price.output.total }}"},
}
EXAMPLE_PAYLOAD: dict[str, Any] = {"order_id": "ord_123", "amount": 42}


@dataclass(frozen=True, slots=True)
class Bootstrapped:
    test_key: str
    live_key: str
    flow_id: str


async def bootstrap(db: Database, keys: KeyService, flows: FlowService) -> Bootstrapped | None:
    """Seed an empty database; ``None`` when it already has a workspace."""
    async with db.read() as conn:
        if await keys_store.count_workspaces(conn) > 0:
            return None
    test = await keys.create(Mode.TEST, "default")
    live = await keys.create(Mode.LIVE, "default")
    who = Principal(test.api_key.workspace_id, Mode.TEST, test.api_key.id)
    flow = await flows.create(who, EXAMPLE_FLOW)
    return Bootstrapped(test.key, live.key, flow.flow_id)
