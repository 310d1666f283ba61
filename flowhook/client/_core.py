"""What the sync and async clients share: building requests and reading answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import httpx

from flowhook.client._errors import APIError

__all__ = [
    "Call", "Run", "RunAccepted", "RunError", "Step", "TERMINAL", "api_base", "parse_error",
]  # fmt: skip

TERMINAL = frozenset({"completed", "failed", "cancelled"})


def api_base(base_url: str) -> str:
    """``http://host:8080`` or ``http://host:8080/api/v1`` → ``http://host:8080/api/v1``."""
    base = base_url.rstrip("/")
    return base if base.endswith("/api/v1") else base + "/api/v1"


class RunError(TypedDict):
    """Why a run or a step failed (``Run.error``, a step's ``error``): ``type`` is the kind
    (``http_status``, ``timeout``, ``expression``, ``cancelled``, ``fail``…), ``message``
    says it in words, ``step`` names the step a run failed at; some kinds say more (an
    ``http_status`` error's ``status`` and ``body``)."""

    type: str
    message: str
    step: NotRequired[str]
    status: NotRequired[int]
    body: NotRequired[Any]


class Step(TypedDict):
    """One step of a run, as ``GET /api/v1/flows/runs/{id}`` gives it (a dict: ``step["id"]``
    reads as it always did; the names are typed)."""

    id: str
    type: str
    status: str
    """running, waiting, retrying, completed, failed or skipped."""
    attempts: int
    interrupted_attempts: list[int]
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    output: Any
    error: RunError | None
    reused: bool
    parent: NotRequired[str]
    """On a step of a ``parallel`` branch or a ``map`` item: that step's id."""
    branch: NotRequired[str]
    index: NotRequired[int]


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
    error: RunError | None = None
    steps: list[Step] = field(default_factory=list)
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
