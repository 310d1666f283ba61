"""The worker protocol (DESIGN.md, "Workers in your own code"; docs/workers.md): workers in
the team's own code claim the tasks of ``task`` steps, heartbeat them, complete or fail
them; ``GET /workers`` says who works and what waits."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, Strict
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.errors import status_of
from flowhook.api.models import JSON_INTEGER, error_responses
from flowhook.api.responses import ORJSONResponse
from flowhook.clock import isoformat
from flowhook.service.tasks import MAX_CLAIM, MAX_WAIT, End, Ended, Refused
from flowhook.store.tasks import Task

router = APIRouter(tags=["tasks"])

_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)
_TASK_NAME = "^[A-Za-z0-9_.:-]{1,200}$"
_TASK_ID = "^tsk_[0-9a-hjkmnp-tv-z]{26}$"


class _WorkerNamed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str = Field(
        min_length=1,
        max_length=200,
        description="The worker's own id (printable, no spaces): shown in GET /workers and on "
        "the run's step.",
        json_schema_extra={"pattern": "^[\\x21-\\x7e]+$"},
        examples=["billing-7f9c"],
    )
    tasks: list[str] = Field(
        min_length=1,
        max_length=100,
        description="The task names this worker runs.",
        json_schema_extra={"items": {"type": "string", "pattern": _TASK_NAME}},
        examples=[["payments.charge"]],
    )


class ClaimRequest(_WorkerNamed):
    max: int = Field(default=1, ge=1, le=MAX_CLAIM, description="At most this many tasks.")
    wait_seconds: float = Field(
        default=20,
        strict=True,
        ge=0,
        le=MAX_WAIT,
        description="How long to wait for a task when none is ready (a long poll).",
        examples=[5],
    )


class ClaimedTask(BaseModel):
    task_id: str = Field(description="tsk_…: the same on every attempt (deduplicate on it).")
    attempt: int = Field(description="This attempt's number, from 1; heartbeat and finish with it.")
    task: str
    input: Any = None
    run_id: str = Field(
        description="The run whose step this is (a branch's or item's top-level run)."
    )
    flow_id: str
    step_id: str
    lease_expires_at: str = Field(description="When the task is taken back unless heartbeated.")
    heartbeat_seconds: float = Field(description="How long each heartbeat extends the lease.")
    traceparent: str | None = Field(default=None, description="W3C trace context of the step.")


class Claimed(BaseModel):
    tasks: list[ClaimedTask]


class AttemptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(ge=1, description="The attempt the claim gave.")


class CompleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(ge=1)
    output: Any = Field(default=None, description="The step's output: any JSON.")


class TaskError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, max_length=4000)
    type: str | None = Field(default=None, min_length=1, max_length=200)


class FailRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(ge=1)
    error: TaskError
    retryable: bool = Field(
        default=True,
        strict=True,
        description="false: the step fails now, whatever its retry says.",
    )


class TaskEnd(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(description="tsk_…: the task this attempt held.", max_length=64)
    attempt: Annotated[int, Strict(), Field(ge=1), JSON_INTEGER] = Field(
        description="The attempt the claim gave."
    )
    output: Any = Field(default=None, description="Completes the attempt with this output.")
    error: TaskError | None = Field(
        default=None, description="Fails the attempt instead (as `fail` does)."
    )
    retryable: bool = Field(
        default=True, strict=True, description="With `error`: false fails the step now."
    )


class BatchRequest(_WorkerNamed):
    ends: list[TaskEnd] = Field(
        default_factory=list,
        max_length=MAX_CLAIM,
        description="Attempts this worker finished: each completes (`output`) or fails "
        "(`error`) as the single calls do, each answered on its own.",
    )
    max: Annotated[int, Strict(), Field(ge=0, le=MAX_CLAIM), JSON_INTEGER] = Field(
        default=0, description="Then claim at most this many tasks (0: none)."
    )
    wait_seconds: float = Field(
        default=0,
        strict=True,
        ge=0,
        le=MAX_WAIT,
        description="How long to wait for a task to claim when none is ready (a long poll, "
        "after the ends are recorded).",
    )


class EndRefused(BaseModel):
    code: int = Field(description="The status the single call would have answered.")
    type: str
    message: str


class EndAnswer(BaseModel):
    task_id: str
    attempt: int
    status: str = Field(description="completed, failed, or refused (nothing was recorded).")
    error: EndRefused | None = Field(default=None, description="Why it was refused.")


class BatchAnswer(BaseModel):
    ends: list[EndAnswer] = Field(description="One answer per end, in the order sent.")
    tasks: list[ClaimedTask]


class Heartbeat(BaseModel):
    lease_expires_at: str
    cancel_requested: bool = Field(description="The run was cancelled: stop, nothing is kept.")


class TaskEnded(BaseModel):
    task_id: str
    status: str = Field(description="completed or failed")
    attempt: int


class Worker(BaseModel):
    worker_id: str
    tasks: list[str]
    last_seen_at: str
    in_flight: int = Field(description="Tasks it holds now.")


class Queue(BaseModel):
    task: str
    waiting: int = Field(description="Tasks ready or waiting for a retry, no worker yet.")
    running: int
    oldest_waiting_at: str | None


class Workers(BaseModel):
    workers: list[Worker] = Field(description="Workers seen in the last 60 s.")
    queues: list[Queue] = Field(description="Each task name with tasks waiting or running.")


def _claimed(task: Task) -> dict[str, Any]:
    assert task.lease_expires_at is not None
    return {
        "task_id": task.task_id,
        "attempt": task.attempt,
        "task": task.task,
        "input": task.input,
        "run_id": task.root_run_id,
        "flow_id": task.flow_id,
        "step_id": task.step_id,
        "lease_expires_at": isoformat(task.lease_expires_at),
        "heartbeat_seconds": task.heartbeat_seconds,
        "traceparent": task.traceparent,
    }


def _ended(ended: Ended) -> Response:
    return ORJSONResponse(ended.body())


@router.post(
    "/tasks/claim",
    summary="Claim tasks (a long poll)",
    description="Up to `max` tasks of the names given, as soon as one is ready (made ready by "
    'any process), else `{"tasks": []}` after `wait_seconds`. Each is held until its lease '
    "ends: heartbeat it, then complete or fail it with the attempt given here.",
    responses={200: {"model": Claimed}, **_ERRORS},
)
async def claim(
    body: ClaimRequest, request: Request, services: ServicesDep, who: CallerDep
) -> Response:
    found = await services.tasks.claim(
        who, body.worker_id, body.tasks, body.max, body.wait_seconds, gone=request.is_disconnected
    )
    return ORJSONResponse({"tasks": [_claimed(t) for t in found]})


@router.post(
    "/tasks/batch",
    summary="Finish attempts and claim tasks, in one request",
    description="What a busy worker sends instead of one `complete` or `fail` per task and "
    "a `claim`: the attempts in `ends` are recorded in one write, each answered as its "
    "single call would be (a refused one records nothing and refuses nothing else), then up "
    "to `max` tasks are claimed as `claim` does, waiting up to `wait_seconds` for one.",
    responses={200: {"model": BatchAnswer}, **_ERRORS},
)
async def batch(
    body: BatchRequest, request: Request, services: ServicesDep, who: CallerDep
) -> Response:
    ends = [
        End(e.task_id, e.attempt, e.output,
            None if e.error is None else e.error.model_dump(exclude_none=True), e.retryable)
        for e in body.ends
    ]  # fmt: skip
    answers, found = await services.tasks.batch(
        who, body.worker_id, body.tasks, ends, body.max, body.wait_seconds,
        gone=request.is_disconnected,
    )  # fmt: skip
    return ORJSONResponse(
        {"ends": [_end_answer(a) for a in answers], "tasks": [_claimed(t) for t in found]}
    )


def _end_answer(answer: Ended | Refused) -> dict[str, Any]:
    if isinstance(answer, Ended):
        return answer.body()
    exc = answer.error
    return {
        "task_id": answer.task_id,
        "attempt": answer.attempt,
        "status": "refused",
        "error": {"code": status_of(exc), "type": exc.code, "message": exc.message},
    }


@router.post(
    "/tasks/{task_id}/heartbeat",
    summary="Keep holding a task",
    description="Extends the attempt's lease by the step's `heartbeat_seconds`. 409 when the "
    "attempt no longer holds the task (its lease ran out and it was taken again, or it "
    "ended).",
    responses={200: {"model": Heartbeat}, **_ERRORS},
)
async def heartbeat(
    task_id: str, body: AttemptRequest, services: ServicesDep, who: CallerDep
) -> Response:
    lease, cancelled = await services.tasks.heartbeat(who, task_id, body.attempt)
    return ORJSONResponse({"lease_expires_at": isoformat(lease), "cancel_requested": cancelled})


@router.post(
    "/tasks/{task_id}/complete",
    summary="Complete a task",
    description="The output becomes the step's and its run goes on. The same call again "
    "answers the same; another result for an attempt that ended, or an attempt that no "
    "longer holds the task, answers 409. An output that cannot be stored fails the attempt "
    "(400 says why).",
    responses={200: {"model": TaskEnded}, **_ERRORS},
)
async def complete(
    task_id: str, body: CompleteRequest, services: ServicesDep, who: CallerDep
) -> Response:
    return _ended(await services.tasks.complete(who, task_id, body.attempt, body.output))


@router.post(
    "/tasks/{task_id}/fail",
    summary="Fail a task's attempt",
    description="The step's `retry` decides whether another attempt follows (after its "
    "backoff), unless `retryable` is false or the attempts are used up: then the step fails "
    "with error type `task` and this message.",
    responses={200: {"model": TaskEnded}, **_ERRORS},
)
async def fail(task_id: str, body: FailRequest, services: ServicesDep, who: CallerDep) -> Response:
    error = body.error.model_dump(exclude_none=True)
    return _ended(await services.tasks.fail(who, task_id, body.attempt, error, body.retryable))


@router.get(
    "/workers",
    summary="Workers and task queues",
    description="The workers seen in the last 60 s (what they run, what they hold now), and "
    "each task name's tasks waiting and running.",
    responses={200: {"model": Workers}, **error_responses(401, 503)},
)
async def list_workers(services: ServicesDep, who: CallerDep) -> Response:
    workers = await services.tasks.workers(who)
    queues = await services.tasks.queues(who)
    return ORJSONResponse(
        {
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "tasks": w.tasks,
                    "last_seen_at": isoformat(w.last_seen_at),
                    "in_flight": w.in_flight,
                }
                for w in workers
            ],
            "queues": [
                {
                    "task": q.task,
                    "waiting": q.waiting,
                    "running": q.running,
                    "oldest_waiting_at": isoformat(q.oldest_at) if q.oldest_at else None,
                }
                for q in queues
            ],
        }
    )
