"""Typed rows: what the store hands to the layers above it, and the states they move through.

Run states and what moves a run between them (:data:`TRANSITIONS`):

    queued ──claim──> running ──last step──> completed
      │                  ├──step or run error, timeout, lost worker──> failed
      │                  ├──progress recorded, released to sleep──> running
      └──cancel──────────┴──cancel──> cancelled

``queued`` and ``running`` are active (:attr:`RunStatus.active`: some move leaves them); the
other three are terminal (:attr:`RunStatus.terminal`). Within a status a run has sub-states
that are columns, not statuses:

- ``held`` (:class:`Held`), queued only: flow control holds the run back. ``concurrency``:
  every slot of its key is taken; it is due never, unleased, until a run of its key ends and
  gives it the slot. ``throttle``: its flow's throttle reserved it a later start
  (``throttle_at``), when it falls due. ``debounce``: executes of its key still join it until
  it falls due (``due_at``). Admission clears it; so does a cancel.
- ``cancel_requested_at``: someone asked to cancel a run a worker holds; the worker ends it
  ``cancelled`` at its next write, and no guarded move that honours a cancel
  (:func:`flowhook.store.guards.run_move`) may take it elsewhere. A run no worker holds is
  cancelled at once, with the flag set in the same write.
- Its steps' records (:class:`StepStatus`): ``running`` while an attempt that talks to the
  outside world is under way, ``waiting`` while a step waits (a delay, a signal, a person, a
  child run, its branches or items), ``retrying`` while the run sleeps through a backoff;
  then ``completed``, ``failed`` or ``skipped`` (a ``goto`` past it). A record left
  ``running``, ``waiting`` or ``retrying`` when its run ended stays so: the run page shows it
  stopped.

Delivery states (:data:`DELIVERY_TRANSITIONS`): ``pending`` ──attempt──> ``succeeded`` |
``failed`` | ``pending`` (an attempt failed and another is scheduled). A pending delivery to
a FIFO endpoint behind another pending one is held: due never (``due_at`` far in the future,
see :mod:`flowhook.store.webhooks`) until the one before it ends and releases it.

Every state change is an ``UPDATE … WHERE status IN (<sources>) AND lease_owner = :me``
whose sources come from these tables (:func:`sources`), so the database refuses an illegal
move or a write by a process that lost its lease, and the writer sees that as an error
(``LeaseLost``), never as a corrupted run. Each table type maps its rows in one place:
``from_row`` reads a row, ``to_row`` gives the columns an insert writes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from flowhook.clock import isoformat
from flowhook.store.rows import from_row, from_values, to_row

__all__ = [
    "Mode",
    "RunStatus",
    "Held",
    "StepStatus",
    "TRANSITIONS",
    "DELIVERY_TRANSITIONS",
    "sources",
    "active",
    "Workspace",
    "ApiKey",
    "Flow",
    "MAX_FLOW_VERSION",
    "Run",
    "RunStep",
    "elapsed_ms",
    "run_duration_ms",
    "Event",
    "envelope",
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
        """No move leaves this status: completed, failed, cancelled."""
        return not TRANSITIONS[self]

    @property
    def active(self) -> bool:
        """Some move leaves this status: queued, running (the run is not over)."""
        return bool(TRANSITIONS[self])


TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # running → running: a step's result recorded, or the run released to sleep (a delay or
    # a retry backoff) with its lease given up
    RunStatus.RUNNING: frozenset(
        {RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}
"""The one table of legal run moves: status → the statuses it may move to."""


class Held(enum.StrEnum):
    """Why flow control holds a queued run back (``runs.held``; ``NULL``: nothing does). The
    values are stored; what each means is in this module's docstring."""

    CONCURRENCY = "concurrency"
    THROTTLE = "throttle"
    DEBOUNCE = "debounce"
    PAUSED = "paused"
    """Its flow is paused: it waits for the flow's resume (``flows.paused_at``)."""


def sources(table: Mapping[Any, AbstractSet[Any]], *path: Any) -> tuple[Any, ...]:
    """The statuses from which every move of ``path`` in turn is legal (in ``table``'s
    order): ``sources(TRANSITIONS, RUNNING, COMPLETED)`` is (queued, running), a run that
    starts and ends in one write."""
    found = []
    for start in table:
        at = start
        for target in path:
            if target not in table[at]:
                break
            at = target
        else:
            found.append(start)
    return tuple(found)


def active(table: Mapping[Any, AbstractSet[Any]]) -> tuple[Any, ...]:
    """The statuses some move leaves: for runs (queued, running), for deliveries (pending)."""
    return tuple(s for s, targets in table.items() if targets)


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
    label: str | None = None
    last_used_at: datetime | None = None


MAX_FLOW_VERSION = 2_000_000_000
"""The largest flow version a request may name (``?version=``): fits every backend's integer."""


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
    paused_at: datetime | None = None
    """Set while the flow is paused: its queued runs wait (held ``paused``) for its resume."""


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
    reused: bool = False
    """A rerun's step copied from the run it reruns: it did not run again."""
    parent: str | None = None
    """A nested step's enclosing ``parallel`` or ``map`` step (read, not stored: its part
    says), with its ``branch`` or item ``index``."""
    branch: str | None = None
    index: int | None = None
    depth: int = 0
    """How deep it is nested (0: a step of the run itself)."""
    parts: tuple[tuple[str | int | None, RunStatus], ...] = ()
    """A ``parallel`` or ``map`` step's branches or items (by name or index) and how their
    parts stand, those that ran no step yet too (read, not stored: the run page shows them)."""

    @classmethod
    def from_row(cls, row: Any) -> RunStep:
        return from_row(cls, row, _STEP_CONVERT)

    def to_row(self, run_id: str) -> dict[str, Any]:
        return to_row(
            self, _STEP_COLUMNS, run_id=run_id, interrupted=list(self.interrupted) or None
        )


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
    rerun_of: str | None = None
    """The run this one reruns, when it is a rerun."""
    parent_run_id: str | None = None
    """The run whose ``flow`` step started this one (it waits for it, at ``parent_idx``)."""
    parent_idx: int | None = None
    root_run_id: str | None = None
    scope: dict[str, Any] | None = None
    tree_run_id: str | None = None
    """A nested run's (a child's, a part's): the top-level run its tree grew from. Written,
    not read back (its ``scope`` names it too, as ``tree``)."""
    # Flow control (see flowhook/store/control.py)
    priority: int = 0
    concurrency_key: str | None = None
    """The flow's concurrency key read when the run was accepted ("" for a flow-wide cap)."""
    concurrency_slot: str | None = None
    """The key of the concurrency slot the run holds, from admission to its end."""
    held: str | None = None
    """Why flow control holds the run back now, if it does: a :class:`Held` (read back as
    its stored text, which equals it)."""
    throttle_key: str | None = None
    throttle_at: datetime | None = None
    """The start its flow's throttle reserved for it."""
    debounce_key: str | None = None
    due_at: datetime | None = None
    """When the run last fell due (a debounced run: when it may start)."""
    traceparent: str | None = None
    """The W3C trace context its span lives under (``None``: a trace derived from its id,
    see :mod:`flowhook.tracing`)."""
    steps: list[RunStep] = field(default_factory=list)
    waiting: dict[str, Any] | None = None
    """Why a running run sleeps, when a read looked (a ``task`` step's task: its worker, or
    that none is there); not a column."""

    @classmethod
    def from_row(cls, row: Any) -> Run:
        """The run from a ``runs`` row (its steps are read apart)."""
        return from_row(cls, row, _RUN_CONVERT)

    @classmethod
    def from_values(cls, names: tuple[str, ...], values: Sequence[Any]) -> Run:
        """The run from a ``runs`` row read as a plain tuple of the columns ``names``."""
        return from_values(cls, names, values, _RUN_CONVERT)

    def to_row(self, payload: Any = None) -> dict[str, Any]:
        """The columns of a newly queued run, due at :attr:`due_at` (default: at once);
        ``payload``: the payload already encoded (default: :attr:`payload`, encoded by the
        store). A run under flow control, or a nested one, has columns of its own, so a
        batch of rows is written in one statement per column set. The trace context is
        always a column (``NULL``, its default, when there is none): the API's runs, with
        or without one, are then one column set, one statement."""
        names = _RUN_INSERT if self.parent_run_id is None else _RUN_INSERT_NESTED
        if self.controlled:
            names = (*names, *_RUN_CONTROL)
        due = self.queued_at if self.due_at is None else self.due_at
        return to_row(
            self,
            names,
            payload=self.payload if payload is None else payload,
            available_at=due,
            due_at=due,
        )

    @property
    def tree(self) -> str:
        """The top-level run of this run's tree (itself, for a top-level run)."""
        return self.tree_run_id or (self.scope or {}).get("tree") or self.run_id

    @property
    def controlled(self) -> bool:
        """Whether flow control wrote anything of this run."""
        return bool(
            self.priority or self.held
            or self.concurrency_key is not None or self.throttle_key is not None
            or self.debounce_key is not None
        )  # fmt: skip

    @property
    def waiting_for(self) -> dict[str, Any] | None:
        """Why a queued run has not started yet, when flow control holds it back; why it
        waits, whatever the reason, when a read looked (:attr:`waiting`,
        :mod:`flowhook.service.waiting`)."""
        if self.waiting is not None and self.status.active:
            return dict(self.waiting)
        if self.held is None or self.status is not RunStatus.QUEUED:
            return None
        held = Held(self.held)
        if held is Held.PAUSED:
            return {"reason": self.held, "since": self.queued_at, "until": None}
        key = {
            Held.CONCURRENCY: self.concurrency_key,
            Held.THROTTLE: self.throttle_key,
            Held.DEBOUNCE: self.debounce_key,
        }[held]
        until = self.throttle_at if held is Held.THROTTLE else None
        return {"reason": self.held, "key": key or None, "until": until}


def elapsed_ms(start: datetime, end: datetime) -> int:
    """Whole milliseconds from ``start`` to ``end``, never negative."""
    return max(0, round((end - start).total_seconds() * 1000))


def run_duration_ms(run: Run, now: datetime) -> int | None:
    """How long ``run`` has lasted at ``now``: from its start, ``None`` when it never
    started."""
    return elapsed_ms(run.started_at, now) if run.started_at is not None else None


def envelope(
    type_: str, flow_id: str | None, run_id: str | None, created_at: datetime, payload: bytes
) -> bytes:
    """The body every webhook of an event carries (SPEC §2), from the event's columns and its
    payload's JSON: compact UTF-8 JSON, the same bytes however often it is rebuilt, so what is
    signed and sent again on a replay is what was sent first. Only the payload is stored
    (``events.payload``); the envelope around it repeats the row's own columns."""
    return orjson.dumps(
        {
            "event": type_,
            "flow_id": flow_id,
            "run_id": run_id,
            "timestamp": isoformat(created_at),
            "payload": orjson.Fragment(payload),
        }
    )


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    workspace_id: str
    mode: Mode
    type: str
    flow_id: str | None
    run_id: str | None
    created_at: datetime
    payload: bytes
    """The payload's JSON, as the body holds it."""
    stored_body: bytes | None = None
    """The exact body when it is not the envelope rebuilt (an event written before migration
    0019 whose stored bytes differ from the rebuilt ones keeps those); ``None`` otherwise."""

    @property
    def body(self) -> bytes:
        """The exact bytes that are signed and sent: :func:`envelope` of the columns and the
        payload (built when read: the engine writes events it never reads)."""
        if self.stored_body is not None:
            return self.stored_body
        return envelope(self.type, self.flow_id, self.run_id, self.created_at, self.payload)

    @classmethod
    def from_row(cls, row: Any) -> Event:
        """From a row of ``events`` (its ``body`` column is NULL unless the stored bytes are
        not the envelope rebuilt)."""
        body = row._mapping["body"]
        return from_row(cls, row, _EVENT_CONVERT, stored_body=None if body is None else bytes(body))

    def to_row(self) -> dict[str, Any]:
        return to_row(self, _EVENT_COLUMNS, body=self.stored_body)


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


DELIVERY_TRANSITIONS: dict[DeliveryStatus, frozenset[DeliveryStatus]] = {
    # pending → pending: an attempt failed and the next one is scheduled
    DeliveryStatus.PENDING: frozenset(
        {DeliveryStatus.PENDING, DeliveryStatus.SUCCEEDED, DeliveryStatus.FAILED}
    ),
    DeliveryStatus.SUCCEEDED: frozenset(),
    DeliveryStatus.FAILED: frozenset(),
}
"""The one table of legal delivery moves (a replay is a new delivery, never a move)."""


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
    rate_limit: float | None = None
    """At most this many deliveries a second, across every process."""
    ordering: str | None = None
    """``fifo``: one delivery in flight, in event order."""
    filter_flow_ids: list[str] | None = None
    """Only events of these flows."""
    paused_at: datetime | None = None
    """When it was paused (its deliveries wait); ``None``: it is not."""


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

    @classmethod
    def from_row(cls, row: Any) -> Attempt:
        return from_row(cls, row)

    def outcome(self) -> dict[str, Any]:
        """The columns an attempt's outcome writes into its log line."""
        return to_row(self, _ATTEMPT_OUTCOME)


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
    due_at: datetime | None = None
    """When it fell due (``HELD``: a FIFO endpoint holds it behind the one going)."""
    waiting_for: dict[str, Any] | None = None
    """Why a pending delivery is held, when it is (read apart: see
    :func:`flowhook.store.delivery_reads.explain_held`)."""

    @classmethod
    def from_row(cls, row: Any) -> Delivery:
        """The delivery from a ``deliveries`` row (its attempt log is read apart)."""
        return from_row(cls, row, _DELIVERY_CONVERT)

    @classmethod
    def queued(cls, delivery_id: str, event: Event, endpoint_id: str) -> Delivery:
        """A new pending delivery of ``event`` to an endpoint, due at once."""
        return cls(
            id=delivery_id,
            event_id=event.id,
            endpoint_id=endpoint_id,
            workspace_id=event.workspace_id,
            mode=event.mode,
            event_type=event.type,
            run_id=event.run_id,
            status=DeliveryStatus.PENDING,
            attempts=0,
            next_attempt_at=event.created_at,
            created_at=event.created_at,
        )

    def replayed(self, delivery_id: str, now: datetime) -> Delivery:
        """A new pending delivery of the same event to the same endpoint, due ``now``."""
        return dataclasses.replace(
            self, id=delivery_id, status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=now,
            created_at=now, last_status_code=None, last_error=None, replay_of=self.id,
            finished_at=None, attempt_log=[], due_at=None, waiting_for=None,
        )  # fmt: skip

    def to_row(self) -> dict[str, Any]:
        """The columns of a newly queued delivery."""
        return to_row(self, _DELIVERY_INSERT, due_at=self.next_attempt_at)


# What differs between a row and its model, table by table (everything else maps by name).
_RUN_CONVERT = {"mode": Mode, "status": RunStatus}
_RUN_INSERT = (
    *("run_id", "workspace_id", "mode", "flow_id", "flow_version", "trigger", "status"),
    *("queued_at", "next_step", "rerun_of", "traceparent"),
)
_RUN_INSERT_NESTED = (
    *_RUN_INSERT,
    *("parent_run_id", "parent_idx", "root_run_id", "scope", "tree_run_id"),
)
_RUN_CONTROL = ("priority", "concurrency_key", "throttle_key", "debounce_key", "held")
_STEP_CONVERT = {"status": StepStatus, "interrupted": lambda v: tuple(v or ())}
_STEP_COLUMNS = (
    *("idx", "step_id", "type", "status", "attempts", "started_at", "finished_at"),
    *("duration_ms", "output", "error", "reused"),
)
_EVENT_CONVERT = {"mode": Mode, "payload": bytes}
_EVENT_COLUMNS = (
    *("id", "workspace_id", "mode", "type", "flow_id", "run_id", "created_at", "payload"),
)
_ATTEMPT_OUTCOME = (
    *("started_at", "finished_at", "duration_ms", "address", "status_code"),
    *("response_excerpt", "error_class", "error_detail", "next_attempt_at"),
)
_DELIVERY_CONVERT = {"mode": Mode, "status": DeliveryStatus}
_DELIVERY_INSERT = (
    *("id", "event_id", "endpoint_id", "workspace_id", "mode", "event_type", "run_id"),
    *("status", "attempts", "next_attempt_at", "created_at", "replay_of"),
)
