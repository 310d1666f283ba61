"""The SDK's wait(): one long poll where the server holds the answer until the run ends (it
was 30 polls of 2 s), and polling every ``interval`` s on a server that answers at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from flowhook.client import AsyncClient, Client, WaitTimeout

RUN = "run_1"


def body(status: str) -> dict[str, object]:
    return {"run_id": RUN, "flow_id": "wf_1", "status": status, "steps": []}


class LongPolling:
    """A server whose ``?wait=`` answers once the run has ended (here: at once, ended)."""

    def __init__(self, holds: bool = True, ends_after: int = 1) -> None:
        self.holds = holds
        self.ends_after = ends_after
        self.asked: list[dict[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(dict(request.url.params))
        ended = len(self.asked) > self.ends_after
        if self.holds and "wait" in request.url.params:
            ended = True
        return httpx.Response(200, json=body("completed" if ended else "running"))


def test_one_long_poll_instead_of_polls() -> None:
    server = LongPolling()
    with Client("http://f.test", "k", transport=httpx.MockTransport(server)) as c:
        assert c.wait(RUN).status == "completed"
    assert len(server.asked) == 2
    assert server.asked[0] == {} and 0 < float(server.asked[1]["wait"]) <= 28.0  # read timeout 30


def test_a_server_without_long_polls_is_asked_every_interval() -> None:
    server = LongPolling(holds=False, ends_after=3)
    with Client("http://f.test", "k", transport=httpx.MockTransport(server)) as c:
        assert c.wait(RUN, interval=0.01, max_attempts=1000).status == "completed"
    assert len(server.asked) == 4
    stuck = LongPolling(holds=False, ends_after=10**9)
    with (
        Client("http://f.test", "k", transport=httpx.MockTransport(stuck)) as c,
        pytest.raises(WaitTimeout),
    ):
        c.wait(RUN, interval=0.01, max_attempts=5)


def test_the_async_client_long_polls_too() -> None:
    server = LongPolling()

    async def go() -> str:
        transport = httpx.MockTransport(server)
        async with AsyncClient("http://f.test", "k", transport=transport) as c:
            return (await c.wait(RUN)).status

    assert asyncio.run(go()) == "completed"
    assert len(server.asked) == 2 and "wait" in server.asked[1]


def test_a_run_s_steps_and_error_are_typed_and_still_read_as_dicts() -> None:
    """``Run.steps`` are :class:`Step` and ``Run.error`` a :class:`RunError` (TypedDicts:
    the names are typed for a type checker), and they read as the dicts they always were."""
    from flowhook.client import Run, RunError, Step

    step: Step = {
        "id": "charge", "type": "http", "status": "failed", "attempts": 3,
        "interrupted_attempts": [], "started_at": "t", "finished_at": "t", "duration_ms": 12,
        "output": None, "error": {"type": "http_status", "message": "502", "status": 502},
        "reused": False,
    }  # fmt: skip
    error: RunError = {"type": "http_status", "message": "502", "step": "charge"}
    run = Run.from_json(
        {"run_id": "run_1", "flow_id": "wf_1", "status": "failed", "steps": [step], "error": error}
    )
    assert run.steps[0]["id"] == "charge" and isinstance(run.steps[0], dict)
    assert run.error is not None and run.error["step"] == "charge"
