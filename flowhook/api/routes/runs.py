"""SPEC §4.1 and §4.2 (execute, read a run), and the run list and cancel of DESIGN.md."""

from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Header, Query
from pydantic import Field
from starlette.responses import Response

from flowhook import tracing
from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.fast import accepted
from flowhook.api.models import (
    IDEMPOTENCY_KEY_DOC,
    CancelRequest,
    ExecuteRequest,
    PagingDep,
    RerunAccepted,
    RerunRequest,
    RunAccepted,
    RunList,
    RunRecord,
    TreeCancelled,
    error_responses,
    page_response,
    run_record,
)
from flowhook.api.responses import ORJSONResponse

router = APIRouter(tags=["runs"])

_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)


@router.post(
    "/flows/execute",
    status_code=202,
    summary="Start a run",
    responses={202: {"model": RunAccepted}, **_ERRORS},
)
async def execute(
    body: ExecuteRequest,
    services: ServicesDep,
    who: CallerDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="Same key and body within 24 h return the same run; another body, 409.",
            json_schema_extra=IDEMPOTENCY_KEY_DOC,
        ),
    ] = None,
    traceparent: Annotated[
        str | None,
        Header(
            description="W3C Trace Context: the run joins this trace (its http steps and "
            "webhooks carry it); an invalid value is ignored and the run gets a new trace."
        ),
    ] = None,
) -> Response:
    began = time.time()
    trace = tracing.accept(traceparent)
    started = await services.runs.start(
        who,
        flow_id=body.flow_id,
        payload=body.payload,
        trigger=body.trigger,
        idempotency_key=idempotency_key,
        priority=body.priority,
        traceparent=trace.stored,
    )
    tracing.accepted_span(trace, began, started.run.run_id, body.flow_id, 202)
    return accepted(started)


@router.get(
    "/flows/runs",
    summary="List runs, newest first",
    responses={200: {"model": RunList}, **_ERRORS},
)
async def list_runs(
    services: ServicesDep,
    who: CallerDep,
    paging: PagingDep,
    flow_id: str | None = None,
    status: str | None = Query(
        None, min_length=1, description="queued, running, completed, failed or cancelled"
    ),
) -> Response:
    page = await services.runs.list(who, **paging, flow_id=flow_id, status=status)
    await services.runs.explain(who, page.data)  # waiting_for, as each run's own read has it
    return page_response(page, lambda r: run_record(r, with_steps=False))


@router.get(
    "/flows/runs/{run_id}",
    summary="Read a run",
    responses={200: {"model": RunRecord}, **_ERRORS},
)
async def get_run(
    run_id: str,
    services: ServicesDep,
    who: CallerDep,
    wait: float | None = Query(
        None,
        ge=0,
        le=60,
        description="Long-poll: answer when the run is terminal, or after this many seconds.",
    ),
) -> Response:
    if wait:
        return ORJSONResponse(run_record(await services.runs.wait_for(who, run_id, wait)))
    return ORJSONResponse(run_record(await services.runs.get(who, run_id)))


class _TreeRecord(RunRecord):
    tree: TreeCancelled | None = Field(
        default=None, description='With `{"tree": true}`: what the cancel did to the tree.'
    )


@router.post(
    "/flows/runs/{run_id}/cancel",
    summary="Cancel a run (and, with tree, every run under it)",
    description="A queued run is cancelled at once (200); a running one is flagged and its "
    'worker ends it `cancelled` (202). With `{"tree": true}` every unfinished run of a '
    "top-level run's tree is cancelled too, even when the run itself has ended: the answer "
    "adds `tree` with how many were cancelled at once and how many are ending (202 while any "
    "is).",
    responses={200: {"model": _TreeRecord}, 202: {"model": _TreeRecord}, **_ERRORS},
)
async def cancel_run(
    run_id: str, services: ServicesDep, who: CallerDep, body: CancelRequest | None = None
) -> Response:
    if body is None or not body.tree:
        run = await services.runs.cancel(who, run_id)
        return ORJSONResponse(run_record(run), status_code=200 if run.status.terminal else 202)
    run, tree = await services.runs.cancel_tree(who, run_id)
    record = run_record(run)
    record["tree"] = {"cancelled": len(tree.ended), "cancelling": tree.flagged}
    done = run.status.terminal and not tree.flagged
    return ORJSONResponse(record, status_code=200 if done else 202)


@router.post(
    "/flows/runs/{run_id}/rerun",
    status_code=202,
    summary="Rerun a finished run from one of its steps",
    description="A new run of the same flow whose top-level steps before `from_step` are "
    "reused from this run (listed with `reused: true`, no events), not run again. Only a "
    "completed, failed or cancelled run (else 409). A `from_step` the version lacks, or a step "
    "before it with no result to reuse, answers 400 naming it.",
    responses={202: {"model": RerunAccepted}, **_ERRORS},
)
async def rerun(
    run_id: str,
    services: ServicesDep,
    who: CallerDep,
    body: RerunRequest | None = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="Same key and body within 24 h return the same run; another body, 409.",
            json_schema_extra=IDEMPOTENCY_KEY_DOC,
        ),
    ] = None,
) -> Response:
    body = body or RerunRequest()
    started = await services.runs.rerun(
        who,
        run_id,
        from_step=body.from_step,
        flow_version=body.flow_version,
        payload=body.payload,
        idempotency_key=idempotency_key,
    )
    return accepted(started)


@router.get(
    "/flows/runs/{run_id}/events",
    summary="The events a run raised, oldest first",
    description="A page of `limit` events (default 20, at most 100), oldest first; "
    "`next_cursor` asks for the next page (`null` after the last).",
    responses=_ERRORS,
)
async def run_events(
    run_id: str, services: ServicesDep, who: CallerDep, paging: PagingDep
) -> Response:
    page = await services.runs.events_page(who, run_id, **paging)
    data = [{"id": e.id, "event": e.type, "body": orjson.Fragment(e.body)} for e in page.data]
    return ORJSONResponse({"data": data, "next_cursor": page.next_cursor})
