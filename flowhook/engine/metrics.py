"""Prometheus metrics of the engine (served at ``/metrics`` by the process that runs it)."""

from __future__ import annotations

from functools import cache
from typing import Any

from prometheus_client import Counter, Histogram

__all__ = [
    "RUNS_FINISHED",
    "RUNS_HELD",
    "START_LATENCY",
    "STEP_SECONDS",
    "finished",
    "step_seconds",
]

RUNS_FINISHED = Counter(
    "flowhook_runs_finished_total", "Runs that reached a terminal status.", ["status"]
)
"""By status only: a series per flow would grow without bound and name every tenant's flows."""
RUNS_HELD = Counter(
    "flowhook_run_holds_total",
    "Times a worker held a run back at admission, by reason (concurrency or throttle).",
    ["reason"],
)
START_LATENCY = Histogram(
    "flowhook_run_start_latency_seconds",
    "From a run's 202 (queued_at) to a worker starting it.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
STEP_SECONDS = Histogram(
    "flowhook_step_duration_seconds",
    "Step durations by type and outcome.",
    ["type", "status"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)


# A labelled child is looked up under a lock with its labels checked each time (~1.5 µs, five
# times a run); the combinations are few and fixed, so each is looked up once.


@cache
def step_seconds(type_: str, status: str) -> Any:
    """``STEP_SECONDS`` of one step type and outcome."""
    return STEP_SECONDS.labels(type=type_, status=status)


@cache
def finished(status: str) -> Any:
    """``RUNS_FINISHED`` of one terminal status."""
    return RUNS_FINISHED.labels(status=status)
