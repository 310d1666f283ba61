"""The Flowhook Python SDK. It imports nothing from the server, so receivers and clients can
use it alone.

    from flowhook.client import Client, verify_signature

    with Client("http://127.0.0.1:8080", "sk_test_…") as flowhook:
        accepted = flowhook.execute("wf_…", {"order_id": "ord_123"})
        run = flowhook.wait(accepted.run_id)          # SPEC §4.2 polling: 2 s, 30 attempts
        for event in flowhook.stream(accepted.run_id):  # or live, until the run ends
            print(event.id, event.event, event.payload)
"""

from flowhook.client._client import AsyncClient, Client
from flowhook.client._core import TERMINAL, Run, RunAccepted, RunError, Step
from flowhook.client._errors import (
    APIError,
    FlowhookClientError,
    SignatureError,
    StreamError,
    WaitTimeout,
)
from flowhook.client._stream import TERMINAL_EVENTS, StreamEvent
from flowhook.client._worker import NonRetryableError, TaskContext, Worker
from flowhook.client.signatures import verify_signature, verify_webhook

__all__ = [
    "Client",
    "AsyncClient",
    "Run",
    "RunAccepted",
    "RunError",
    "Step",
    "TERMINAL",
    "StreamEvent",
    "TERMINAL_EVENTS",
    "APIError",
    "FlowhookClientError",
    "SignatureError",
    "WaitTimeout",
    "StreamError",
    "verify_signature",
    "verify_webhook",
    "Worker",
    "TaskContext",
    "NonRetryableError",
]
