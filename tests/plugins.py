"""Functions for python steps in the tests (FLOWHOOK_PLUGINS=tests.plugins)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import flowhook

CALLS: dict[str, int] = {}


@flowhook.step("double")
def double(ctx: flowhook.StepContext) -> dict[str, Any]:
    return {"value": ctx.input["n"] * 2, "order": ctx.payload.get("order_id")}


@flowhook.step("answer")
def answer(ctx: flowhook.StepContext) -> int:
    """A bare number: SQLite keeps the JSON text 42 as the number 42 (numeric affinity)."""
    return 42


@flowhook.step("flaky")
async def flaky(ctx: flowhook.StepContext) -> dict[str, Any]:
    CALLS[ctx.run_id] = CALLS.get(ctx.run_id, 0) + 1
    if ctx.attempt < 3:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


@flowhook.step("nap")
async def nap(ctx: flowhook.StepContext) -> dict[str, Any]:
    await asyncio.sleep(float(ctx.input))
    return {"slept": ctx.input}


@flowhook.step("ballast")
def ballast(ctx: flowhook.StepContext) -> dict[str, Any]:
    """An output of ``input`` bytes: events too big for the sockets' buffers to hide."""
    return {"ballast": "x" * int(ctx.input)}


@flowhook.step("count")
def count(ctx: flowhook.StepContext) -> dict[str, Any]:
    """Appends a line per execution to $FLOWHOOK_TEST_COUNT_DIR/<run>-<step>, so a test can
    tell how often a step ran across process restarts."""
    folder = Path(os.environ["FLOWHOOK_TEST_COUNT_DIR"])
    with (folder / f"{ctx.run_id}-{ctx.step_id}").open("a") as f:
        f.write("ran\n")
    return {"ok": True}


@flowhook.step("not_json")
def not_json(ctx: flowhook.StepContext) -> Any:
    return {"value": object()}


@flowhook.step("stall_once")
async def stall_once(ctx: flowhook.StepContext) -> dict[str, Any]:
    """Hangs on its first call for a run (a test kills the attempt meanwhile), answers after."""
    CALLS[ctx.run_id] = CALLS.get(ctx.run_id, 0) + 1
    if CALLS[ctx.run_id] == 1:
        await asyncio.sleep(3600)
    return {"attempt": ctx.attempt}


@flowhook.step("whoami")
async def whoami(ctx: flowhook.StepContext) -> dict[str, Any]:
    """Which process ran the step (after a nap of ``input`` seconds)."""
    await asyncio.sleep(float(ctx.input or 0))
    return {"pid": os.getpid()}


@flowhook.step("span")
async def span(ctx: flowhook.StepContext) -> dict[str, Any]:
    """Wall-clock begin and end of a nap of ``input`` seconds (comparable across processes),
    with the run's payload key ``k`` and the process that ran it."""
    begun = time.time()
    await asyncio.sleep(float(ctx.input or 0))
    return {"begun": begun, "ended": time.time(), "k": ctx.payload.get("k"), "pid": os.getpid()}
