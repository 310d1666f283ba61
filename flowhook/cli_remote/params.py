"""The arguments and options several remote commands take, written once (typer needs a
function per command; these keep their parameter lists short and their help the same)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = [
    "JsonOpt",
    "FlowArg",
    "FlowToRunArg",
    "RunArg",
    "ApprovalStepArg",
    "CommentOpt",
    "TimeoutOpt",
    "IdempotencyKeyOpt",
    "LimitOpt",
    "EndpointArg",
    "HookArg",
    "ScheduleArg",
]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
FlowArg = Annotated[str, typer.Argument(help="The flow: its id (wf_…) or its name.")]
FlowToRunArg = Annotated[str, typer.Argument(help="The flow to run: its id (wf_…) or its name.")]
RunArg = Annotated[str, typer.Argument(help="The run (run_…).")]
ApprovalStepArg = Annotated[str, typer.Argument(help="Its approval step's id.")]
CommentOpt = Annotated[str | None, typer.Option("--comment", help="Why, kept with the decision.")]
TimeoutOpt = Annotated[float, typer.Option(help="How long --wait follows, seconds.")]
IdempotencyKeyOpt = Annotated[str | None, typer.Option("--idempotency-key")]
LimitOpt = Annotated[int, typer.Option("--limit", help="At most this many, newest first.")]
EndpointArg = Annotated[str, typer.Argument(help="The endpoint (ep_…).")]
HookArg = Annotated[str, typer.Argument(help="The hook (hk_…).")]
ScheduleArg = Annotated[str, typer.Argument(help="The schedule (sch_…).")]
