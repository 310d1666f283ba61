"""Flowhook: start workflow runs over HTTP, follow them, receive signed webhooks."""

from flowhook.plugins import StepContext, step

__all__ = ["StepContext", "step", "__version__"]
__version__ = "0.1.0"
