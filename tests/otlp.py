"""A real OTLP/HTTP receiver for the tests: ``POST /v1/traces`` bodies decoded with
opentelemetry-proto; any other request is recorded (with its headers) and answered from a
script, so one server is also the target of ``http`` steps and webhooks."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["Recorder", "recording"]


class Recorder(ThreadingHTTPServer):
    """Records requests; the OTLP one decodes spans, the others answer from a script."""

    def __init__(self, script: list[int] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.spans: list[dict[str, Any]] = []
        self.script = list(script or [])
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/traces":
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            with self.server.lock:
                self.server.spans.extend(_spans(request))
            self._answer(
                200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf"
            )
            return
        with self.server.lock:
            self.server.requests.append({"path": self.path, "headers": dict(self.headers)})
            status = self.server.script.pop(0) if self.server.script else 200
        self._answer(status, b"{}", "application/json")

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _spans(request: ExportTraceServiceRequest) -> Iterator[dict[str, Any]]:
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield {
                    "name": span.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_id": span.parent_span_id.hex(),
                    "kind": span.kind,
                    "error": span.status.code == 2,
                    "attributes": {a.key: _value(a.value) for a in span.attributes},
                    "service": resource.get("service.name"),
                    "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano,
                }


@contextmanager
def recording() -> Iterator[tuple[Recorder, Recorder]]:
    """(OTLP receiver, target of ``http`` steps and webhooks), serving on 127.0.0.1."""
    otlp, target = Recorder(), Recorder()
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (otlp, target)]
    for t in threads:
        t.start()
    try:
        yield otlp, target
    finally:
        for s in (otlp, target):
            s.shutdown()
            s.server_close()
