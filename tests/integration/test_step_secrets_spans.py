"""A step secret in an http step's URL never reaches an OTLP span: the real OTLP/HTTP
receiver of tests/otlp.py gets the step's span with ``[secret:NAME]`` in its URL, on both
backends."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import Api

pytest.importorskip("opentelemetry.sdk")
from tests.integration.test_otel_spans import PARENT, SAMPLED, execute, otlp, spans_of  # noqa: F401
from tests.otlp import Recorder

VALUE = "tok-span-4411-secret"


async def test_the_step_span_shows_the_secret_s_name(
    otlp: tuple[Recorder, Recorder],  # noqa: F811 - the fixture, before api's app
    api: Api,
) -> None:
    receiver, target = otlp
    r = await api.post("/api/v1/secrets", {"name": "TOKEN", "value": VALUE})
    assert r.status_code == 201, r.text
    flow_id = await api.create_flow({"name": "t", "steps": [{
        "id": "call", "type": "http", "request": {
            "url": target.url + "/v1/{{ secrets.TOKEN }}",
            "headers": {"Authorization": "Bearer {{ secrets.TOKEN }}"},
        },
    }]})  # fmt: skip
    run_id = await execute(api, flow_id, f"00-{SAMPLED}-{PARENT}-01")
    assert (await api.wait(run_id))["status"] == "completed"
    assert target.requests[0]["path"].endswith(f"/v1/{VALUE}")
    spans = spans_of(receiver, run_id)
    [step] = [s for s in spans if s["name"].startswith("step")]
    assert "[secret:TOKEN]" in step["attributes"]["url.full"], step["attributes"]
    assert VALUE not in orjson.dumps(receiver.spans, default=str).decode()
