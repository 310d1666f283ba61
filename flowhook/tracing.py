"""W3C Trace Context for runs, and OpenTelemetry spans when the ``otel`` extra is on.

Every run belongs to one trace. The ``runs.traceparent`` column holds the context its run
span lives under (``00-<trace id>-<parent span id>-<flags>``): the caller's, when a valid
``traceparent`` came with the execute request (or the accept span's, with OpenTelemetry on);
a child run's or a part's names the step that started it; a rerun's the run it reruns.
A run started with none of these leaves the column NULL and its trace id is derived from its
run id (:func:`run_trace`): a new trace per run, made without any work at accept time.

Span ids are derived too, so every process finds the same ones without storing them: a run's
span from its run id, a step attempt's from (run row, step index, attempt number), a
delivery attempt's from (delivery id, attempt number). Each ``http`` step request and each
webhook delivery carries ``traceparent: 00-<the run's trace id>-<its own span id>-<flags>``,
so a downstream service links under the step or attempt span.

OpenTelemetry is optional: :func:`start` turns it on only when the extra is installed and
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is set. Everything else checks
the module flag :data:`ENABLED` first; when it is off nothing here imports the SDK, builds
an attribute or exports anything.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from flowhook.store.models import Run

__all__ = [
    "ENABLED",
    "TraceParent",
    "parse",
    "run_trace",
    "run_span_id",
    "step_span_id",
    "delivery_span_id",
    "new_span_id",
    "new_trace_id",
    "header",
    "Accepted",
    "accept",
    "accepted_span",
    "child_traceparent",
    "start",
    "flush",
    "stop",
    "http_attributes",
    "redacted_url",
    "emit",
    "run_attributes",
    "run_span",
]

log = logging.getLogger("flowhook.tracing")

ENABLED = False
"""Whether spans are exported: set by :func:`start`, the only check on a hot path."""

_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A W3C ``traceparent``: 32 hex digits of trace id, 16 of parent span id, the flags."""

    trace_id: str
    parent_id: str
    flags: str = "01"

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"

    @property
    def sampled(self) -> bool:
        return self.flags == "01"


def parse(value: str | None) -> TraceParent | None:
    """The ``traceparent`` header ``value`` as W3C Trace Context (Level 1, section 3.2)
    reads it, or ``None`` when it is absent or invalid: lower-case hex only, version ``ff``
    is invalid, version ``00`` is exactly 55 characters, a later version may append fields
    after a ``-`` (read as version 00), and an all-zero trace id or parent id is invalid.
    Of the flags only ``sampled`` is kept (the others mean nothing to version 00)."""
    if not value:
        return None
    value = value.strip(" \t")
    m = _TRACEPARENT.match(value)
    if m is None:
        return None
    version, trace_id, parent_id, flags = m.groups()
    if version == "ff" or (version == "00" and len(value) != 55):
        return None
    if len(value) > 55 and value[55] != "-":
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, parent_id, "01" if int(flags, 16) & 1 else "00")


def _digest(text: str, size: int) -> str:
    value = hashlib.blake2b(text.encode(), digest_size=size, person=b"flowhook-trace").hexdigest()
    return value if value.strip("0") else "0" * (2 * size - 1) + "1"  # never all zeros


@functools.lru_cache(maxsize=4096)
def _derived(run_id: str) -> tuple[str, str]:
    """(trace id, run span id) derived from a run id, in one hash: a run's events are
    delivered several times over, each delivery asking for both."""
    value = _digest(run_id, 24)
    trace_id, span_id = value[:32], value[32:]
    if not trace_id.strip("0"):
        trace_id = trace_id[:-1] + "1"
    return trace_id, span_id if span_id.strip("0") else span_id[:-1] + "1"


def run_trace(run_id: str, stored: str | None) -> TraceParent:
    """The context a run's span lives under: its stored ``traceparent``, or for a run that
    has none a trace of its own (trace id derived from ``run_id``, no parent: the run span
    is the root)."""
    if stored is not None:
        found = parse(stored)
        if found is not None:
            return found
    return TraceParent(_derived(run_id)[0], _ZERO_SPAN, "01")


def run_span_id(run_id: str) -> str:
    return _derived(run_id)[1]


def step_span_id(row_id: str, idx: int, attempt: int) -> str:
    """The span of attempt ``attempt`` of step ``idx`` of the run row ``row_id`` (a run or a
    part): the same in every process, so a step's children and its span agree."""
    return _digest(f"{row_id}/{idx}/{attempt}", 8)


def delivery_span_id(delivery_id: str, attempt: int) -> str:
    return _digest(f"{delivery_id}/{attempt}", 8)


def new_span_id() -> str:
    return os.urandom(8).hex()


def new_trace_id() -> str:
    return os.urandom(16).hex()


def header(trace: TraceParent, span_id: str) -> str:
    """The ``traceparent`` an outbound request of span ``span_id`` carries."""
    return f"00-{trace.trace_id}-{span_id}-{trace.flags}"


@dataclass(frozen=True, slots=True)
class Accepted:
    """The trace of a run being accepted: what its row stores, and (OpenTelemetry on) the
    accept span and the caller's context it hangs under."""

    stored: str | None
    caller: TraceParent | None
    span: TraceParent | None = None
    """The accept span: its trace, with the caller's span as parent (``span_id`` apart)."""
    span_id: str = _ZERO_SPAN


def accept(value: str | None) -> Accepted:
    """The trace context of a run accepted with the ``traceparent`` header ``value``.

    An invalid header is ignored and the run gets a trace of its own, never a 400: W3C Trace
    Context says a receiver that cannot parse ``traceparent`` must ignore it and start a new
    trace, and the header is usually added by a proxy or an instrumentation library, not by
    the caller's code, so refusing the run would fail real work over a tracing detail.

    Without OpenTelemetry the row stores the caller's context (or nothing). With it, the
    accept span is a child of the caller's span and the row stores the accept span as the
    run span's parent."""
    caller = parse(value)
    if not ENABLED:
        return Accepted(None if caller is None else str(caller), caller)
    trace_id = caller.trace_id if caller is not None else new_trace_id()
    flags = caller.flags if caller is not None else "01"
    span_id = new_span_id()
    parent = caller.parent_id if caller is not None else _ZERO_SPAN
    return Accepted(
        f"00-{trace_id}-{span_id}-{flags}", caller, TraceParent(trace_id, parent, flags), span_id
    )


def child_traceparent(run_id: str, stored: str | None, span_id: str) -> str:
    """What a run started by a step (a child run, a part, a rerun) stores: the trace of the
    run ``run_id`` it belongs to, under the span ``span_id`` that started it."""
    return header(run_trace(run_id, stored), span_id)


# -- OpenTelemetry (the ``otel`` extra) ---------------------------------------------------

_provider: Any = None
_tracer: Any = None
_chosen: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "flowhook_span_ids", default=None
)


def start(endpoint: str | None) -> bool:
    """Turn on the export of spans over OTLP/HTTP when ``endpoint`` (the setting read from
    ``OTEL_EXPORTER_OTLP_ENDPOINT``) is set and the ``otel`` extra is installed; the
    exporter reads its own ``OTEL_EXPORTER_OTLP_*`` settings (headers, timeout). Whether it
    is on. Called by every server command; a second call does nothing."""
    global ENABLED, _provider, _tracer
    if ENABLED or not endpoint:
        return ENABLED
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "no spans are exported (pip install 'flowhook[otel]')"
        )
        return False

    class ChosenIds(RandomIdGenerator):
        """Gives the span (and, for a root span, trace) ids :func:`emit` chose."""

        def generate_span_id(self) -> int:
            chosen = _chosen.get()
            return chosen[1] if chosen else super().generate_span_id()

        def generate_trace_id(self) -> int:
            chosen = _chosen.get()
            return chosen[0] if chosen else super().generate_trace_id()

    resource = Resource.create()  # reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "flowhook"}))
    _provider = TracerProvider(resource=resource, id_generator=ChosenIds())
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _tracer = _provider.get_tracer("flowhook")
    ENABLED = True
    log.info("exporting OpenTelemetry spans over OTLP/HTTP to %s", endpoint)
    return True


def flush() -> None:
    """Export the spans buffered now (the batch exporter otherwise sends them within
    ``OTEL_BSP_SCHEDULE_DELAY``)."""
    if _provider is not None:
        _provider.force_flush()


def stop() -> None:
    """Export what is left and turn the export off."""
    global ENABLED, _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    ENABLED, _provider, _tracer = False, None, None


REDACTED = "REDACTED"


def redacted_url(url: str, *, path: bool = False) -> str:
    """``url`` as a span may carry it: user and password become ``REDACTED:REDACTED`` and every
    query value ``REDACTED`` (OpenTelemetry's HTTP conventions; tokens ride in queries), the
    fragment goes; ``path=True`` also hides the path, where webhook URLs of the Slack kind keep
    their secret. A URL that does not parse is replaced whole."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return REDACTED
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{REDACTED}:{REDACTED}@" if "@" in parts.netloc else "") + host
    if port is not None:
        netloc += f":{port}"
    text = f"{parts.scheme}://{netloc}" if parts.scheme else netloc
    if path:
        text += f"/{REDACTED}" if parts.path.strip("/") else parts.path
    else:
        text += parts.path
    if parts.query:
        names = (pair.split("=", 1)[0] for pair in parts.query.split("&"))
        text += "?" + "&".join(f"{name}={REDACTED}" for name in names)
    return text


def http_attributes(
    method: str, url: str, status: int | None, *, secret_path: bool = False
) -> dict[str, Any]:
    """OpenTelemetry's HTTP client attributes of a request, its URL redacted
    (:func:`redacted_url`; ``secret_path`` for a webhook endpoint's URL)."""
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "url.full": redacted_url(url, path=secret_path),
    }
    try:
        parts = urlsplit(url)
        if parts.hostname:
            attributes["server.address"] = parts.hostname
        if parts.port:
            attributes["server.port"] = parts.port
    except ValueError:
        pass
    if status is not None:
        attributes["http.response.status_code"] = status
    return attributes


def _ns(at: datetime | float) -> int:
    return int((at.timestamp() if isinstance(at, datetime) else at) * 1e9)


def emit(
    name: str,
    *,
    trace: TraceParent,
    span_id: str,
    start_at: datetime | float,
    end_at: datetime | float | None = None,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    error: str | None = None,
    remote_parent: bool = False,
) -> None:
    """Export one finished span ``span_id`` under ``trace`` (its parent: ``trace.parent_id``,
    none when that is all zeros), from ``start_at`` to ``end_at`` (default: now). ``error``:
    the span failed, with this ``error.type``. Call only when :data:`ENABLED`."""
    from opentelemetry import trace as api
    from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

    if _tracer is None:
        return
    context = None
    if trace.parent_id != _ZERO_SPAN:
        parent = SpanContext(
            int(trace.trace_id, 16), int(trace.parent_id, 16), is_remote=remote_parent,
            trace_flags=TraceFlags(int(trace.flags, 16)),
        )  # fmt: skip
        context = api.set_span_in_context(NonRecordingSpan(parent))
    elif not trace.sampled:
        return
    attrs = dict(attributes or {})
    if error is not None:
        attrs["error.type"] = error
    token = _chosen.set((int(trace.trace_id, 16), int(span_id, 16)))
    try:
        span = _tracer.start_span(
            name, context=context, kind=getattr(api.SpanKind, kind.upper()),
            attributes=attrs, start_time=_ns(start_at),
        )  # fmt: skip
    finally:
        _chosen.reset(token)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=_ns(end_at if end_at is not None else time.time()))


def accepted_span(
    accepted: Accepted, started_at: float, run_id: str, flow_id: str, status: int
) -> None:
    """Export the accept span of an execute request (OpenTelemetry on)."""
    if accepted.span is None:
        return
    emit(
        "flowhook.accept", trace=accepted.span, span_id=accepted.span_id, start_at=started_at,
        kind="server", remote_parent=True,
        attributes={
            "http.request.method": "POST", "http.route": "/api/v1/flows/execute",
            "url.path": "/api/v1/flows/execute", "http.response.status_code": status,
            "flowhook.run_id": run_id, "flowhook.flow_id": flow_id,
        },
    )  # fmt: skip


def run_attributes(run: Run) -> dict[str, Any]:
    """``flowhook.run_id`` is the run people see (a part's root run); a part names itself
    in ``flowhook.part_id``."""
    attributes: dict[str, Any] = {
        "flowhook.run_id": run.root_run_id or run.run_id,
        "flowhook.flow_id": run.flow_id,
        "flowhook.flow_version": run.flow_version,
    }
    if run.root_run_id is not None:
        attributes["flowhook.part_id"] = run.run_id
    return attributes


def run_span(run: Run, status: str, error: dict[str, Any] | None, now: datetime) -> None:
    """Export the span of a run row that ended ``status`` (``error``: the run's, when it
    failed): from its queueing to its end, under the context it stored (the accept span,
    the step that started it, or none: a root span)."""
    attributes = {**run_attributes(run), "flowhook.run.status": str(status)}
    attributes["flowhook.trigger"] = run.trigger
    failure = None
    if status == "failed":
        failure = str((error or {}).get("type", "failed"))
    elif status == "cancelled":
        failure = "cancelled"
    name = "part" if run.root_run_id is not None else "run"
    emit(
        f"{name} {run.flow_id}", trace=run_trace(run.run_id, run.traceparent),
        span_id=run_span_id(run.run_id), start_at=run.queued_at, end_at=now,
        kind="consumer" if name == "run" else "internal", attributes=attributes, error=failure,
        remote_parent=True,
    )  # fmt: skip
