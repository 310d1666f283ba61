"""What the sync and async clients share: building requests and reading answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from flowhook.client._errors import APIError

__all__ = ["Call", "Run", "RunAccepted", "TERMINAL", "api_base", "parse_error"]

TERMINAL = frozenset({"completed", "failed", "cancelled"})


def api_base(base_url: str) -> str:
    """``http://host:8080`` or ``http://host:8080/api/v1`` → ``http://host:8080/api/v1``."""
    base = base_url.rstrip("/")
    return base if base.endswith("/api/v1") else base + "/api/v1"


@dataclass(frozen=True, slots=True)
class RunAccepted:
    run_id: str
    flow_id: str
    status: str
    queued_at: str
    rerun_of: str | None = None
    """The run this one reruns (an answer to ``rerun``)."""


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    flow_id: str
    status: str
    output: Any = None
    error: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    steps_executed: int = 0
    queued_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_ms: int | None = None
    rerun_of: str | None = None
    parent_run_id: str | None = None
    """The run whose ``flow`` step started this one."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Run:
        return cls(
            run_id=body["run_id"],
            flow_id=body["flow_id"],
            status=body["status"],
            output=body.get("output"),
            error=body.get("error"),
            steps=body.get("steps") or [],
            steps_executed=body.get("steps_executed", 0),
            queued_at=body.get("queued_at"),
            started_at=body.get("started_at"),
            finished_at=body.get("finished_at"),
            duration_ms=body.get("duration_ms"),
            rerun_of=body.get("rerun_of"),
            parent_run_id=body.get("parent_run_id"),
            raw=body,
        )


@dataclass(frozen=True, slots=True)
class Call:
    """One request, and how to read its answer."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    def request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.json is not None:
            kwargs["json"] = self.json
        if self.params:
            kwargs["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.headers:
            kwargs["headers"] = self.headers
        return kwargs


def parse_error(response: httpx.Response) -> APIError:
    try:
        body = response.json()
        return APIError(
            response.status_code,
            str(body.get("code", "error")),
            str(body.get("error", response.text)),
        )
    except ValueError:
        return APIError(response.status_code, "http_error", response.text[:500])


def check(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise parse_error(response)
    return response.json() if response.content else None
