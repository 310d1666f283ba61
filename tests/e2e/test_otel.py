"""OpenTelemetry export against a real OTLP/HTTP receiver: ``flowhook serve`` as a process
with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a server this test starts on 127.0.0.1, which
decodes each ``POST /v1/traces`` with opentelemetry-proto. The spans of one run (accept, run,
each step, each delivery attempt) share the caller's trace id and form one tree, with
OpenTelemetry's attribute names; the step's target and the webhook receiver see the span ids
of their step and attempt. Without the variable nothing is exported."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import serve

pytest.importorskip("opentelemetry.sdk")
from tests.otlp import Recorder, recording

pytestmark = pytest.mark.e2e


@pytest.fixture
def recorders() -> Iterator[tuple[Recorder, Recorder]]:
    with recording() as both:
        yield both


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
STEP, HOOK = "/step?token=s3cret&v=2", "/hook/T0/s3cret"
"""A token in the step's query and a secret in the webhook's path (as Slack's URLs carry)."""
PARENT = "00f067aa0ba902b7"


def _run_a_traced_flow(server: Any, target: Recorder, hooks: int) -> str:
    """Run a flow of a transform and an http step with a ``traceparent``; its id, once
    ``hooks`` webhook requests arrived."""
    key = server.value("sandbox key")
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.base, timeout=10, headers=auth) as client:
        flow = {
            "name": "traced",
            "steps": [
                {"id": "prep", "type": "transform", "output": {"n": 1}},
                {
                    "id": "call",
                    "type": "http",
                    "request": {"url": target.url + "/step?token=s3cret&v=2"},
                },
            ],
        }
        r = client.post("/api/v1/flows", json=flow)
        assert r.status_code == 201, r.text
        flow_id = r.json()["flow_id"]
        r = client.post(
            "/api/v1/webhooks/endpoints",
            json={"url": target.url + "/hook/T0/s3cret", "events": ["flow.completed"]},
        )
        assert r.status_code == 201, r.text
        r = client.post(
            "/api/v1/flows/execute",
            json={"flow_id": flow_id, "payload": {}},
            headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
        )
        assert r.status_code == 202, r.text
        run_id = str(r.json()["run_id"])
        r = client.get(f"/api/v1/flows/runs/{run_id}", params={"wait": 20})
        assert r.json()["status"] == "completed", r.text
    for _ in range(400):
        if len([r for r in target.requests if r["path"] == HOOK]) >= hooks:
            break
        time.sleep(0.05)
    return run_id


def test_the_spans_of_a_run_form_one_tree_in_the_caller_s_trace(
    tmp_path: Path, database_url: str, recorders: tuple[Recorder, Recorder]
) -> None:
    otlp, target = recorders
    target.script = [200, 500]  # the step's request, then the first webhook attempt
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true",
        "FLOWHOOK_WEBHOOK_RETRY_SCHEDULE": "0.1,0.2,0.3",
    }
    with serve(tmp_path, database_url, **env) as server:
        run_id = _run_a_traced_flow(server, target, hooks=2)  # a 500, then a retry
    # stopping the server exported what it still held
    spans = {s["span_id"]: s for s in otlp.spans}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans.values():
        by_name.setdefault(s["name"], []).append(s)
    ours = [s for s in spans.values() if s["attributes"].get("flowhook.run_id") == run_id]
    assert {s["trace_id"] for s in ours} == {TRACE}
    [accept] = by_name["flowhook.accept"]
    [run] = [s for s in ours if s["name"].startswith("run ")]
    prep, call = by_name["step prep"], by_name["step call"]
    deliveries = sorted(by_name["webhook delivery"], key=lambda s: s["start"])
    assert len(prep) == 1 and len(call) == 1 and len(deliveries) == 2
    # one tree: the accept span under the caller's span, everything else under the run
    assert accept["parent_id"] == PARENT and accept["kind"] == 2  # SERVER
    assert run["parent_id"] == accept["span_id"]
    for s in [*prep, *call, *deliveries]:
        assert s["parent_id"] == run["span_id"], s
    assert set(spans) == {accept["span_id"], run["span_id"]} | {
        s["span_id"] for s in [*prep, *call, *deliveries]
    }
    assert {s["service"] for s in spans.values()} == {"flowhook"}
    assert "s3cret" not in json.dumps(otlp.spans)  # no span carries either secret
    # attributes by OpenTelemetry's semantic conventions, and ours
    a = accept["attributes"]
    assert (a["http.request.method"], a["http.response.status_code"]) == ("POST", 202)
    flow_id = a["flowhook.flow_id"]
    assert run["attributes"]["flowhook.flow_id"] == flow_id
    assert run["attributes"]["flowhook.run.status"] == "completed"
    c = call[0]["attributes"]
    assert (
        c["http.request.method"] == "GET"
        and c["url.full"] == target.url + "/step?token=REDACTED&v=REDACTED"
    )
    assert c["server.address"] == "127.0.0.1" and c["http.response.status_code"] == 200
    assert (c["flowhook.run_id"], c["flowhook.flow_id"], c["flowhook.step_id"]) == (
        run_id, flow_id, "call",
    )  # fmt: skip
    assert call[0]["kind"] == 3  # CLIENT
    assert prep[0]["attributes"]["flowhook.step_id"] == "prep"
    failed, delivered = deliveries
    assert failed["error"] and failed["attributes"]["error.type"] == "http_5xx"
    assert failed["attributes"]["http.response.status_code"] == 500
    assert not delivered["error"] and delivered["attributes"]["http.response.status_code"] == 200
    for d in deliveries:
        assert d["attributes"]["url.full"] == target.url + "/REDACTED"
        assert d["attributes"]["flowhook.flow_id"] == flow_id
    # downstream services link under the step's and the attempts' spans
    sent = {r["path"]: [] for r in target.requests}
    for r in target.requests:
        sent[r["path"]].append(r["headers"]["traceparent"])
    assert sent[STEP] == [f"00-{TRACE}-{call[0]['span_id']}-01"]
    assert sent[HOOK] == [f"00-{TRACE}-{d['span_id']}-01" for d in deliveries]


def test_without_the_endpoint_nothing_is_exported(
    tmp_path: Path, database_url: str, recorders: tuple[Recorder, Recorder]
) -> None:
    otlp, target = recorders
    env = {"FLOWHOOK_ALLOW_PRIVATE_TARGETS": "true", "FLOWHOOK_WEBHOOK_RETRY_SCHEDULE": "0.1"}
    with serve(tmp_path, database_url, **env) as server:
        _run_a_traced_flow(server, target, hooks=1)
    assert otlp.spans == []
    assert len(target.requests) == 2
    assert all(r["headers"]["traceparent"].startswith(f"00-{TRACE}-") for r in target.requests)


def test_the_sdk_is_not_imported_when_spans_are_not_exported() -> None:
    code = (
        "import sys; from flowhook import tracing;"
        "import flowhook.app, flowhook.engine.executor, flowhook.webhooks.dispatcher;"
        "assert tracing.start(None) is False and not tracing.ENABLED;"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')"
        " or m.startswith('opentelemetry.exporter'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
