"""Request and response bodies as the OpenAPI document shows them, and the functions that
turn domain objects into those bodies."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, TypedDict, TypeVar

from fastapi import Depends, Query
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StrictBool
from pydantic_core import PydanticCustomError

from flowhook import tracing
from flowhook.api.responses import ORJSONResponse
from flowhook.clock import isoformat
from flowhook.service.pagination import Page
from flowhook.store.models import Flow, Run, RunStep

__all__ = [
    "ExecuteRequest",
    "IDEMPOTENCY_KEY_DOC",
    "JSON_INTEGER",
    "JSON_NUMBER",
    "FLOW_ID_DOC",
    "ID_SUFFIX",
    "PRINTABLE",
    "RunAccepted",
    "RerunAccepted",
    "RerunRequest",
    "RunRecord",
    "RunList",
    "FlowRecord",
    "FlowList",
    "ErrorBody",
    "run_accepted",
    "run_record",
    "flow_record",
    "ts",
    "Limit",
    "PageArgs",
    "PagingDep",
    "error_responses",
    "page_response",
]

T = TypeVar("T")

ID_SUFFIX = "[0-7][0-9a-hjkmnp-tv-z]{25}([0-9a-hjkmnp-tv-z]{10})?"
"""What follows ``<prefix>_`` in an id the service made (``flowhook.ids.is_id``)."""


def _json_integer(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSON_INTEGER = BeforeValidator(_json_integer)
"""With ``Strict()``, last in an ``Annotated[int, Strict(), Field(<limits>), JSON_INTEGER]``
(after the limits, so the document keeps them): an integer as JSON Schema's ``integer``
means it, a number with no fraction (30.0 is 30), never a string (``"30"``) or a boolean,
which Pydantic's lax mode would take."""


def _json_number(value: Any) -> Any:
    if isinstance(value, bool | str):
        raise PydanticCustomError("float_type", "Input should be a number")
    return value


JSON_NUMBER = BeforeValidator(_json_number)
"""Last in an ``Annotated[float, Field(<limits>), JSON_NUMBER]``: a number as JSON Schema's
``number`` means it, not a boolean or a string, which Pydantic's lax mode would take (``true``
as 1.0)."""

FLOW_ID_DOC: dict[str, Any] = {"pattern": f"^wf_{ID_SUFFIX}$", "maxLength": 40}
"""A flow id as the service makes them (any other answers 400 or 404)."""

IDEMPOTENCY_KEY_DOC: dict[str, Any] = {"minLength": 1, "maxLength": 255}
"""The Idempotency-Key's length, as the service checks it (``MAX_IDEMPOTENCY_KEY``)."""

PRINTABLE = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
"""No control characters: what ``str.isprintable`` asks of a signal name, as far as a pattern
says it (the service also refuses the Unicode separators other than the space)."""

Limit = Annotated[int, Query(ge=1, le=100)]
"""A list's ``limit`` query parameter: ``limit: Limit = 20``."""


class PageArgs(TypedDict):
    limit: int
    cursor: str | None


def _paging(limit: Limit = 20, cursor: str | None = None) -> PageArgs:
    return {"limit": limit, "cursor": cursor}


PagingDep = Annotated[PageArgs, Depends(_paging)]
"""A list's ``limit`` and ``cursor`` query parameters (the last ones the operation shows), for
``services.x.list(who, **paging)``."""


def ts(value: datetime | None) -> str | None:
    return isoformat(value) if value is not None else None


class Problem(BaseModel):
    field: str | None = Field(
        description="Where it lies, as `definition.steps[1].output` or `payload.lines[2]`."
    )
    message: str = Field(description="What is wrong there, in words a person can act on.")


class ErrorBody(BaseModel):
    error: str = Field(description="What went wrong, in words a person can act on.")
    code: str = Field(description="A stable machine-readable code.")
    errors: list[Problem] | None = Field(
        default=None,
        description="`invalid_definition`: every problem of the definition, each told where "
        "it lies (one for each step or field at fault); `error` is the first's. A payload "
        "that fails its flow's `input_schema` (`invalid_request`) lists each field at fault "
        "the same way (`payload.amount`).",
    )


def error_responses(*codes: int) -> dict[int | str, dict[str, object]]:
    """The ``responses`` of a route for the error statuses it may answer: each an ErrorBody."""
    return {code: {"model": ErrorBody} for code in codes}


def page_response(page: Page[T], record: Callable[[T], dict[str, Any]]) -> ORJSONResponse:
    """A list's answer: ``{"data": [record(item), ...], "next_cursor": ...}``."""
    return ORJSONResponse({"data": [record(x) for x in page.data], "next_cursor": page.next_cursor})


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    flow_id: str = Field(
        description="The flow to run, shape wf_<suffix>.",
        examples=["wf_01jd7w2k3m4n5p6q7r8s9t0v1w"],
        json_schema_extra=FLOW_ID_DOC,
    )
    trigger: str = Field(
        default="api",
        description="Trigger kind; `api` over this interface.",
        json_schema_extra={"enum": ["api"]},
    )
    payload: dict[str, Any] = Field(
        default_factory=dict, description="Data handed to the workflow."
    )
    priority: Annotated[int, Strict(), Field(ge=-100, le=100), JSON_INTEGER] | None = Field(
        default=None,
        description="Overrides the flow's `priority`: among due runs the higher is claimed "
        "first (default: the flow's, else 0).",
    )


class RunAccepted(BaseModel):
    run_id: str
    flow_id: str
    status: str = "queued"
    queued_at: str = Field(description="ISO 8601 UTC timestamp.")


class RerunAccepted(RunAccepted):
    rerun_of: str = Field(description="The run this one reruns.")


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tree: StrictBool = Field(
        default=False,
        description="Also cancel every unfinished run of the run's tree (the runs its `flow` "
        "steps started, theirs, and so on), even when the run itself has ended. Only a "
        "top-level run has a tree to cancel.",
    )


class TreeCancelled(BaseModel):
    cancelled: int = Field(description="Runs of the tree cancelled at once (no worker held them).")
    cancelling: int = Field(
        description="Runs of the tree a worker holds: each is flagged and ends `cancelled` "
        "within about a second."
    )


class RerunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_step: str | None = Field(
        default=None,
        description="The top-level step to run first; the steps before it are reused. Default: "
        "the first step with no result in the run (the first step when it completed).",
    )
    flow_version: Annotated[int, Field(strict=True, ge=1)] | Literal["latest"] | None = Field(
        default=None,
        description='The flow version to run: a number or "latest". Default: the run\'s own.',
    )
    payload: dict[str, Any] | None = Field(
        default=None, description="The new run's payload. Default: the run's own."
    )


class StepRecord(BaseModel):
    id: str
    type: str
    status: str = Field(
        description="running (an attempt under way), waiting, retrying, completed, failed "
        "or skipped."
    )
    attempts: int = Field(description="Attempts started, interrupted ones included.")
    interrupted_attempts: list[int] = Field(
        default_factory=list,
        description="The numbers of the attempts that started and never recorded an outcome "
        "(the process stopped, or the run was cancelled, during them): they may have had "
        "their effect.",
    )
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    parent: str | None = Field(
        default=None,
        description="Set on a step of a `parallel` branch or a `map` item: the id of that "
        "`parallel` or `map` step (with `branch` or `index`).",
    )
    branch: str | None = Field(default=None, description="The `parallel` branch it ran in.")
    index: int | None = Field(default=None, description="The `map` item it ran for.")
    output: Any = None
    error: dict[str, Any] | None = None
    reused: bool = Field(
        default=False,
        description="A rerun's step copied from the run it reruns (with that run's status and "
        "output): it did not run again and raised no events.",
    )


class WaitingFor(BaseModel):
    reason: str = Field(
        description="Why the run is not executing a step now. A queued run: `worker` (no "
        "engine worker has taken it yet, `since`), or flow control holds it back: "
        "`concurrency` (`key`, `held_by`: the runs holding the slots), `throttle` (`key`, "
        "`until`), `debounce` (`key`). A running run asleep in a step of its own (`step_id`): "
        "`delay` (`until`), `retry` (`attempt`: the next one, `until`), `signal` (`name`, "
        "`match`, `until`), `approval` (`until`), `task` (`task`, `attempt` and `worker_id`, "
        "or `no_worker`), `child` (`run_id`), `parts` (`parts`: its branches or items by "
        "status)."
    )
    step_id: str | None = Field(default=None, description="The step it sleeps in.")
    key: str | None = Field(
        default=None, description="The key value it waits on (null: the whole flow)."
    )
    since: str | None = Field(default=None, description="`worker`: queued since.")
    until: str | None = Field(
        default=None,
        description="When the wait ends by itself (a delay, a backoff, a throttle's reserved "
        "start, a timeout; a task: when it may be claimed); null: no time set.",
    )
    held_by: list[str] | None = Field(
        default=None, description="`concurrency`: the runs holding the slots (at most 20)."
    )
    name: str | None = Field(default=None, description="`signal`: the signal's name.")
    match: dict[str, Any] | None = Field(
        default=None, description="`signal`: the values the signal must carry."
    )
    run_id: str | None = Field(default=None, description="`child`: the child run.")
    parts: dict[str, int] | None = Field(
        default=None, description="`parts`: how many branches or items are in each status."
    )
    task: str | None = Field(default=None, description="A task: its name.")
    task_id: str | None = None
    worker_id: str | None = Field(default=None, description="A task: the worker holding it.")
    attempt: int | None = Field(
        default=None, description="A task held: the attempt; `retry`: the next attempt."
    )
    no_worker: bool | None = Field(
        default=None,
        description="A task waiting for a worker: true when no worker running its name was "
        "seen in the last 60 s (start one: `flowhook tasks serve`).",
    )


class RunRecord(BaseModel):
    run_id: str
    flow_id: str
    flow_version: int
    trigger: str
    status: str
    payload: dict[str, Any]
    output: Any = None
    error: dict[str, Any] | None = None
    steps: list[StepRecord] | None = None
    steps_executed: int
    queued_at: str
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    cancel_requested_at: str | None = None
    rerun_of: str | None = Field(
        default=None, description="The run this one reruns, when it is a rerun."
    )
    parent_run_id: str | None = Field(
        default=None,
        description="The run whose `flow` step started this one (trigger `flow`), if any.",
    )
    priority: int = Field(default=0, description="Its place among due runs: -100 to 100.")
    waiting_for: WaitingFor | None = Field(
        default=None,
        description="Why the run is not executing a step right now (null when it is, or has "
        "ended). A run read alone says every reason; a list says flow control's only.",
    )
    trace_id: str | None = Field(
        default=None,
        description="The W3C trace id the run belongs to (32 hex digits): the one of the "
        "`traceparent` it was started with, or a new one. Its http steps and webhooks carry it.",
    )


class RunList(BaseModel):
    data: list[RunRecord]
    next_cursor: str | None


class FlowRecord(BaseModel):
    flow_id: str
    version: int
    name: str
    definition: dict[str, Any]
    created_at: str
    updated_at: str
    paused: bool = Field(default=False, description="Paused: its queued runs wait for its resume.")
    paused_at: str | None = None


class FlowList(BaseModel):
    data: list[FlowRecord]
    next_cursor: str | None


def run_accepted(run: Run) -> dict[str, Any]:
    body = {
        "run_id": run.run_id,
        "flow_id": run.flow_id,
        "status": "queued",
        "queued_at": isoformat(run.queued_at),
    }
    if run.rerun_of is not None:
        body["rerun_of"] = run.rerun_of
    return body


def _step(step: RunStep) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": step.step_id,
        "type": step.type,
        "status": str(step.status),
        "attempts": step.attempts,
        "interrupted_attempts": list(step.interrupted),
        "started_at": ts(step.started_at),
        "finished_at": ts(step.finished_at),
        "duration_ms": step.duration_ms,
        "output": step.output,
        "error": step.error,
        "reused": step.reused,
    }
    if step.parent is not None:  # a step of a parallel's branch or a map's item
        body["parent"] = step.parent
        body["branch" if step.branch is not None else "index"] = (
            step.branch if step.branch is not None else step.index
        )
    return body


def _waiting_for(run: Run) -> dict[str, Any] | None:
    why = run.waiting_for
    if why is not None:
        for name in ("until", "since"):
            if isinstance(why.get(name), datetime):
                why[name] = ts(why[name])
        if "until" not in why:
            why["until"] = None
    return why


def run_record(run: Run, *, with_steps: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "run_id": run.run_id,
        "flow_id": run.flow_id,
        "flow_version": run.flow_version,
        "trigger": run.trigger,
        "status": str(run.status),
        "payload": run.payload,
        "output": run.output,
        "error": run.error,
        "steps_executed": run.steps_executed,
        "queued_at": isoformat(run.queued_at),
        "started_at": ts(run.started_at),
        "finished_at": ts(run.finished_at),
        "duration_ms": run.duration_ms,
        "cancel_requested_at": ts(run.cancel_requested_at),
        "rerun_of": run.rerun_of,
        # a child started inside a branch or item names the run, not the part
        "parent_run_id": (run.scope or {}).get("caller", run.parent_run_id),
        "priority": run.priority,
        "waiting_for": _waiting_for(run),
        "trace_id": tracing.run_trace(run.run_id, run.traceparent).trace_id,
    }
    if with_steps:
        body["steps"] = [_step(s) for s in run.steps]
    return body


def flow_record(flow: Flow) -> dict[str, Any]:
    return {
        "flow_id": flow.flow_id,
        "version": flow.version,
        "name": flow.name,
        "definition": flow.definition,
        "created_at": isoformat(flow.created_at),
        "updated_at": isoformat(flow.updated_at),
        "paused": flow.paused_at is not None,
        "paused_at": ts(flow.paused_at),
    }
