"""The catalogue of API calls, shared by :class:`Client` and :class:`AsyncClient`."""

from __future__ import annotations

from typing import Any

from flowhook.client._core import Call

__all__ = [
    "execute", "get_run", "list_runs", "cancel", "rerun", "send_signal", "decide", "create_flow", "update_flow", "get_flow",
    "list_flows", "create_endpoint", "list_endpoints", "list_deliveries", "replay_delivery",
    "create_hook", "create_schedule", "list_schedules", "flow_versions", "delete_flow",
    "get_endpoint", "delete_endpoint", "test_endpoint", "list_hooks", "get_hook", "rotate_hook",
    "delete_hook", "update_schedule", "delete_schedule", "workers", "validate_flow",
]  # fmt: skip


def execute(flow_id: str, payload: dict[str, Any] | None, idempotency_key: str | None) -> Call:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    body = {"flow_id": flow_id, "trigger": "api", "payload": payload or {}}
    return Call("POST", "/flows/execute", json=body, headers=headers)


def get_run(run_id: str, wait: float | None = None) -> Call:
    return Call("GET", f"/flows/runs/{run_id}", params={"wait": wait} if wait else None)


def list_runs(flow_id: str | None, status: str | None, limit: int, cursor: str | None) -> Call:
    return Call(
        "GET",
        "/flows/runs",
        params={"flow_id": flow_id, "status": status, "limit": limit, "cursor": cursor},
    )


def cancel(run_id: str) -> Call:
    return Call("POST", f"/flows/runs/{run_id}/cancel")


def rerun(
    run_id: str,
    from_step: str | None,
    flow_version: int | str | None,
    payload: dict[str, Any] | None,
    idempotency_key: str | None,
) -> Call:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    body = {"from_step": from_step, "flow_version": flow_version, "payload": payload}
    body = {k: v for k, v in body.items() if v is not None}
    return Call("POST", f"/flows/runs/{run_id}/rerun", json=body, headers=headers)


def send_signal(name: str, data: dict[str, Any] | None, id: str | None, run_id: str | None) -> Call:
    body: dict[str, Any] = {"name": name, "data": data or {}}
    if id is not None:
        body["id"] = id
    if run_id is not None:
        return Call("POST", f"/flows/runs/{run_id}/signal", json=body)
    return Call("POST", "/signals", json=body)


def decide(run_id: str, step_id: str, approve: bool, comment: str | None) -> Call:
    action = "approve" if approve else "reject"
    body = {"comment": comment} if comment is not None else {}
    return Call("POST", f"/flows/runs/{run_id}/steps/{step_id}/{action}", json=body)


def create_flow(definition: dict[str, Any]) -> Call:
    return Call("POST", "/flows", json=definition)


def update_flow(flow_id: str, definition: dict[str, Any]) -> Call:
    return Call("PUT", f"/flows/{flow_id}", json=definition)


def get_flow(flow_id: str) -> Call:
    return Call("GET", f"/flows/{flow_id}")


def list_flows(limit: int, cursor: str | None, slug: str | None = None) -> Call:
    return Call("GET", "/flows", params={"limit": limit, "cursor": cursor, "slug": slug})


def validate_flow(definition: dict[str, Any]) -> Call:
    return Call("POST", "/flows/validate", json=definition)


def create_endpoint(
    url: str,
    events: list[str],
    description: str,
    *,
    rate_limit: float | None = None,
    fifo: bool = False,
    flow_ids: list[str] | None = None,
) -> Call:
    body: dict[str, Any] = {"url": url, "events": events, "description": description}
    if rate_limit is not None:
        body["rate_limit"] = rate_limit
    if fifo:
        body["ordering"] = "fifo"
    if flow_ids:
        body["filter"] = {"flow_ids": flow_ids}
    return Call("POST", "/webhooks/endpoints", json=body)


def list_endpoints(limit: int) -> Call:
    return Call("GET", "/webhooks/endpoints", params={"limit": limit})


def list_deliveries(status: str | None, limit: int) -> Call:
    return Call("GET", "/webhooks/deliveries", params={"status": status, "limit": limit})


def replay_delivery(delivery_id: str) -> Call:
    return Call("POST", f"/webhooks/deliveries/{delivery_id}/replay")


def create_hook(flow_id: str | None, verify: dict[str, Any] | None, signal: str | None) -> Call:
    body: dict[str, Any] = {"verify": verify}
    if signal is not None:
        body["signal"] = signal
    if flow_id is not None or signal is None:
        body["flow_id"] = flow_id
    return Call("POST", "/hooks", json=body)


def create_schedule(flow_id: str, cron: str, timezone: str, payload: dict[str, Any] | None) -> Call:
    body = {"flow_id": flow_id, "cron": cron, "timezone": timezone, "payload": payload or {}}
    return Call("POST", "/schedules", json=body)


def list_schedules(limit: int) -> Call:
    return Call("GET", "/schedules", params={"limit": limit})


def flow_versions(flow_id: str) -> Call:
    return Call("GET", f"/flows/{flow_id}/versions")


def delete_flow(flow_id: str) -> Call:
    return Call("DELETE", f"/flows/{flow_id}")


def pause_flow(flow_id: str) -> Call:
    return Call("POST", f"/flows/{flow_id}/pause")


def resume_flow(flow_id: str, rate_per_second: float | None = None) -> Call:
    body = {} if rate_per_second is None else {"rate_per_second": rate_per_second}
    return Call("POST", f"/flows/{flow_id}/resume", json=body)


def pause_endpoint(endpoint_id: str) -> Call:
    return Call("POST", f"/webhooks/endpoints/{endpoint_id}/pause")


def resume_endpoint(endpoint_id: str) -> Call:
    return Call("POST", f"/webhooks/endpoints/{endpoint_id}/resume")


def get_endpoint(endpoint_id: str) -> Call:
    return Call("GET", f"/webhooks/endpoints/{endpoint_id}")


def delete_endpoint(endpoint_id: str) -> Call:
    return Call("DELETE", f"/webhooks/endpoints/{endpoint_id}")


def test_endpoint(endpoint_id: str) -> Call:
    return Call("POST", f"/webhooks/endpoints/{endpoint_id}/test")


def list_hooks(limit: int) -> Call:
    return Call("GET", "/hooks", params={"limit": limit})


def get_hook(hook_id: str) -> Call:
    return Call("GET", f"/hooks/{hook_id}")


def rotate_hook(hook_id: str) -> Call:
    return Call("POST", f"/hooks/{hook_id}/rotate")


def delete_hook(hook_id: str) -> Call:
    return Call("DELETE", f"/hooks/{hook_id}")


def update_schedule(schedule_id: str, changes: dict[str, Any]) -> Call:
    return Call("PATCH", f"/schedules/{schedule_id}", json=changes)


def delete_schedule(schedule_id: str) -> Call:
    return Call("DELETE", f"/schedules/{schedule_id}")


def workers() -> Call:
    return Call("GET", "/workers")
