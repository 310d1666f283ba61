"""Typed rows: what the store hands to the layers above it.

Run states and what moves a run between them:

    queued ──claim──> running ──last step──> completed
      │                  ├──step or run error, timeout, lost worker──> failed
      └──cancel──────────┴──cancel──> cancelled

Every state change is a guarded ``UPDATE … WHERE status IN (<sources>)`` built from
:data:`TRANSITIONS`, so a lost race shows up as zero rows updated, never a corrupted run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "Mode",
    "RunStatus",
    "StepStatus",
    "TRANSITIONS",
    "sources_of",
    "Workspace",
    "ApiKey",
    "Flow",
    "Run",
    "RunStep",
    "Event",
    "DeliveryStatus",
    "Endpoint",
    "Attempt",
    "Delivery",
]


class Mode(enum.StrEnum):
    TEST = "test"
    LIVE = "live"


class RunStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def sources_of(target: RunStatus) -> list[str]:
    """The statuses a run may move to ``target`` from."""
    return [str(s) for s, targets in TRANSITIONS.items() if target in targets]


class StepStatus(enum.StrEnum):
    RUNNING = "running"
    """An attempt that talks to the outside world (``http``, ``python``) is under way; its
    start is committed before it runs, so a crash leaves this behind, and the next attempt
    counts this one as interrupted."""
    WAITING = "waiting"
    """A delay step until its time comes (``output.until``)."""
    RETRYING = "retrying"
    """A failed attempt with attempts left; the run sleeps until the backoff ends."""
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Workspace:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    workspace_id: str
    workspace_name: str
    mode: Mode
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class Flow:
    flow_id: str
    workspace_id: str
    mode: Mode
    name: str
    version: int
    definition: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    archived_at: datetime | None


@dataclass(slots=True)
class RunStep:
    idx: int
    step_id: str
    type: str
    status: StepStatus
    attempts: int
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: int | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    interrupted: tuple[int, ...] = ()
    """The attempts that started and never recorded an outcome (by number)."""


@dataclass(slots=True)
class Run:
    run_id: str
    workspace_id: str
    mode: Mode
    flow_id: str
    flow_version: int
    trigger: str
    status: RunStatus
    payload: dict[str, Any]
    queued_at: datetime
    output: Any = None
    error: dict[str, Any] | None = None
    steps_executed: int = 0
    next_step: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: int | None = None
    claims: int = 0
    cancel_requested_at: datetime | None = None
    steps: list[RunStep] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    workspace_id: str
    mode: Mode
    type: str
    flow_id: str | None
    run_id: str | None
    created_at: datetime
    body: bytes


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(slots=True)
class Endpoint:
    id: str
    workspace_id: str
    mode: Mode
    url: str
    description: str
    enabled: bool
    events: list[str]
    secret: str
    created_at: datetime
    updated_at: datetime
    previous_secret: str | None = None
    previous_secret_expires_at: datetime | None = None
    disabled_reason: str | None = None
    failing_since: datetime | None = None


@dataclass(slots=True)
class Attempt:
    number: int
    started_at: datetime
    finished_at: datetime | None = None
    duration_ms: int | None = None
    address: str | None = None
    status_code: int | None = None
    response_excerpt: str | None = None
    error_class: str | None = None
    error_detail: str | None = None
    next_attempt_at: datetime | None = None


@dataclass(slots=True)
class Delivery:
    id: str
    event_id: str
    endpoint_id: str
    workspace_id: str
    mode: Mode
    event_type: str
    run_id: str | None
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    last_status_code: int | None = None
    last_error: str | None = None
    replay_of: str | None = None
    finished_at: datetime | None = None
    attempt_log: list[Attempt] = field(default_factory=list)
