"""OpenTelemetry in process, on both backends, against the real OTLP/HTTP receiver of
tests/otlp.py: a caller's "not sampled" flag exports nothing of its run (and is passed on),
and a run cancelled while no worker holds it still ends its span."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from flowhook import tracing
from tests.conftest import Api

pytest.importorskip("opentelemetry.sdk")
from tests.otlp import Recorder, recording

SAMPLED = "4bf92f3577b34da6a3ce929d0e0e4736"
UNSAMPLED = "5bf92f3577b34da6a3ce929d0e0e4737"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Recorder, Recorder]]:
    """Spans exported to a receiver for the app the ``api`` fixture makes after this one."""
    with recording() as both:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", both[0].url)
        yield both
    tracing.stop()


async def execute(api: Api, flow_id: str, traceparent: str) -> str:
    r = await api.post(
        "/api/v1/flows/execute",
        {"flow_id": flow_id, "payload": {}},
        headers={"traceparent": traceparent},
    )
    assert r.status_code == 202, r.text
    return str(r.json()["run_id"])


def spans_of(otlp: Recorder, run_id: str) -> list[dict[str, Any]]:
    tracing.flush()
    return [s for s in otlp.spans if s["attributes"].get("flowhook.run_id") == run_id]


async def test_a_run_the_caller_does_not_sample_exports_nothing(
    otlp: tuple[Recorder, Recorder], api: Api
) -> None:
    receiver, target = otlp
    assert tracing.ENABLED
    flow = {"name": "t", "steps": [{"id": "call", "type": "http", "request": {"url": target.url}}]}
    flow_id = await api.create_flow(flow)
    sampled = await execute(api, flow_id, f"00-{SAMPLED}-{PARENT}-01")
    unsampled = await execute(api, flow_id, f"00-{UNSAMPLED}-{PARENT}-00")
    for run_id in (sampled, unsampled):
        assert (await api.wait(run_id))["status"] == "completed"
    names = sorted(s["name"].split()[0] for s in spans_of(receiver, sampled))
    assert names == ["flowhook.accept", "run", "step"]
    assert spans_of(receiver, unsampled) == []
    assert {s["trace_id"] for s in receiver.spans} == {SAMPLED}
    flags = sorted(r["headers"]["traceparent"][-2:] for r in target.requests)
    assert flags == ["00", "01"]


async def test_a_run_cancelled_while_asleep_ends_its_span(
    otlp: tuple[Recorder, Recorder], api: Api
) -> None:
    receiver, _ = otlp
    flow_id = await api.create_flow(
        {"name": "t", "steps": [{"id": "nap", "type": "delay", "seconds": 60}]}
    )
    run_id = await execute(api, flow_id, f"00-{SAMPLED}-{PARENT}-01")
    async with asyncio.timeout(10):
        while (await api.get(f"/api/v1/flows/runs/{run_id}")).json()["steps"] == []:
            await asyncio.sleep(0.02)
    r = await api.post(f"/api/v1/flows/runs/{run_id}/cancel")
    assert r.status_code == 200, r.text
    [run] = [s for s in spans_of(receiver, run_id) if s["name"].startswith("run ")]
    assert run["error"] and run["attributes"]["flowhook.run.status"] == "cancelled"
    [accept] = [s for s in receiver.spans if s["name"] == "flowhook.accept"]
    assert run["parent_id"] == accept["span_id"] and accept["parent_id"] == PARENT
