"""Flowhook: start workflow runs over HTTP, follow them, receive signed webhooks.

``from flowhook import Worker, TaskContext, NonRetryableError`` runs your own code as the
``task`` steps of your flows (the SDK's worker, :mod:`flowhook.client`, imported when asked
for: a plain ``import flowhook`` stays light)."""

from typing import Any

from flowhook.plugins import StepContext, step

__all__ = ["StepContext", "step", "Worker", "TaskContext", "NonRetryableError", "__version__"]
__version__ = "0.1.0"

_WORKER_NAMES = frozenset({"Worker", "TaskContext", "NonRetryableError"})


def __getattr__(name: str) -> Any:
    if name in _WORKER_NAMES:
        from flowhook.client import _worker

        return getattr(_worker, name)
    raise AttributeError(f"module 'flowhook' has no attribute {name!r}")
