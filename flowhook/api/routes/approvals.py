"""Deciding an ``approval`` step with a key (the links in ``flow.approval_requested`` are
the pages in :mod:`flowhook.web.approvals`)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import error_responses, ts
from flowhook.api.responses import ORJSONResponse
from flowhook.service.approvals import MAX_COMMENT
from flowhook.store.approvals import Approval

router = APIRouter(tags=["runs"])

_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)


class DecisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str | None = Field(default=None, max_length=MAX_COMMENT)


class Decision(BaseModel):
    run_id: str
    step_id: str
    approved: bool
    decided_by: str
    comment: str | None
    decided_at: str


def decision_record(approval: Approval) -> dict[str, object]:
    return {
        "run_id": approval.run_id,
        "step_id": approval.step_id,
        "approved": approval.decision == "approved",
        "decided_by": approval.decided_by,
        "comment": approval.comment,
        "decided_at": ts(approval.decided_at),
    }


async def _decide(
    services: ServicesDep,
    who: CallerDep,
    run_id: str,
    step_id: str,
    body: DecisionRequest | None,
    approve: bool,
) -> Response:
    decided = await services.approvals.decide(
        who,
        run_id,
        step_id,
        approve=approve,
        comment=body.comment if body else None,
        by=await services.keys.describe(who.key_id),
    )
    return ORJSONResponse(decision_record(decided))


_DESCRIPTION = (
    "Decides the run's `approval` step `step_id` (the run goes on at once). A second "
    "decision, by any means, answers 409 (`already_decided`); so does an expired request "
    "(`expired`) or a run that has ended (`run_finished`)."
)


@router.post(
    "/flows/runs/{run_id}/steps/{step_id}/approve",
    summary="Approve a step waiting for a person",
    description=_DESCRIPTION,
    responses={200: {"model": Decision}, **_ERRORS},
)
async def approve(
    run_id: str,
    step_id: str,
    services: ServicesDep,
    who: CallerDep,
    body: DecisionRequest | None = None,
) -> Response:
    return await _decide(services, who, run_id, step_id, body, approve=True)


@router.post(
    "/flows/runs/{run_id}/steps/{step_id}/reject",
    summary="Reject a step waiting for a person",
    description=_DESCRIPTION,
    responses={200: {"model": Decision}, **_ERRORS},
)
async def reject(
    run_id: str,
    step_id: str,
    services: ServicesDep,
    who: CallerDep,
    body: DecisionRequest | None = None,
) -> Response:
    return await _decide(services, who, run_id, step_id, body, approve=False)
