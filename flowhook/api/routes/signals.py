"""Signals (DESIGN.md, "Steps that wait, branch and call"): to every waiting run, or to one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from flowhook.api.deps import CallerDep, ServicesDep
from flowhook.api.models import PRINTABLE, error_responses
from flowhook.api.responses import ORJSONResponse
from flowhook.clock import isoformat
from flowhook.service.signals import MAX_ID, MAX_NAME, Sent

router = APIRouter(tags=["signals"])

_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 503)


class SignalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME,
        description="The signal's name: printable characters.",
        examples=["order.paid"],
        json_schema_extra={"pattern": PRINTABLE},
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description="What the resumed `wait` steps output as `data`; a broadcast resumes the "
        "steps whose `match` fields it holds with equal values.",
    )
    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID,
        description="Your id for this signal: the same id again is the same signal (it "
        "resumes nothing more).",
    )


class RunSignalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME,
        examples=["order.paid"],
        json_schema_extra={"pattern": PRINTABLE},
    )
    data: dict[str, Any] = Field(default_factory=dict)
    id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID,
        description="Your id for this signal: the same id again is the same signal.",
    )


class SignalAccepted(BaseModel):
    id: str = Field(description="sig_…")
    name: str
    matched: int = Field(description="The `wait` steps this signal resumed now.")
    run_id: str | None = Field(default=None, description="The run it was sent to, if one.")
    created_at: str


def _accepted(sent: Sent) -> Response:
    signal = sent.signal
    body = {
        "id": signal.id,
        "name": signal.name,
        "matched": sent.matched,
        "run_id": signal.run_id,
        "created_at": isoformat(signal.created_at),
    }
    return ORJSONResponse(body, status_code=202)


@router.post(
    "/signals",
    status_code=202,
    summary="Send a signal to every run waiting for it",
    description="Resumes each `wait` step for this name whose `match` fields the data holds "
    "with equal values (one step per run), and is kept so a run that reaches such a step "
    "later, having been queued before the signal, is resumed by it too.",
    responses={202: {"model": SignalAccepted}, **_ERRORS},
)
async def send_signal(body: SignalRequest, services: ServicesDep, who: CallerDep) -> Response:
    return _accepted(await services.signals.send(who, body.name, body.data, dedup_key=body.id))


@router.post(
    "/flows/runs/{run_id}/signal",
    status_code=202,
    summary="Send a signal to one run",
    description="Resumes the run's `wait` step for this name (its `match` does not apply), "
    "now or when the run reaches it. A run that has ended answers 409.",
    responses={202: {"model": SignalAccepted}, **_ERRORS},
)
async def signal_run(
    run_id: str, body: RunSignalRequest, services: ServicesDep, who: CallerDep
) -> Response:
    return _accepted(
        await services.signals.send(who, body.name, body.data, dedup_key=body.id, run_id=run_id)
    )
