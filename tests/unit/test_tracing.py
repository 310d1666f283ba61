"""flowhook.tracing without a database: W3C ``traceparent`` parsing, derived ids, what an
execute stores, and a missing OpenTelemetry SDK."""

from __future__ import annotations

import logging
import sys

import pytest

from flowhook import tracing

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"00-{TRACE}-{PARENT}-01", (TRACE, PARENT, "01")),
        (f"00-{TRACE}-{PARENT}-00", (TRACE, PARENT, "00")),
        (f"00-{TRACE}-{PARENT}-03", (TRACE, PARENT, "01")),  # only "sampled" is kept
        (f" 00-{TRACE}-{PARENT}-01\t", (TRACE, PARENT, "01")),  # optional whitespace
        (f"01-{TRACE}-{PARENT}-01-later-fields", (TRACE, PARENT, "01")),  # a later version
        (f"01-{TRACE}-{PARENT}-01", (TRACE, PARENT, "01")),
        (f"01-{TRACE}-{PARENT}-01x", None),
        (f"00-{TRACE}-{PARENT}-01-", None),
        (f"ff-{TRACE}-{PARENT}-01", None),
        (f"00-{'0' * 32}-{PARENT}-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE.upper()}-{PARENT}-01", None),
        (f"00-{TRACE}-{PARENT}-0g", None),
        (f"00-{TRACE}-{PARENT}", None),
        ("", None),
        (None, None),
    ],
)
def test_parse(value: str | None, expected: tuple[str, str, str] | None) -> None:
    found = tracing.parse(value)
    assert (found and (found.trace_id, found.parent_id, found.flags)) == expected


def test_derived_ids_are_stable_distinct_and_well_formed() -> None:
    trace = tracing.run_trace("run_a", None)
    assert trace == tracing.run_trace("run_a", None) != tracing.run_trace("run_b", None)
    assert len(trace.trace_id) == 32 and trace.parent_id == "0" * 16 and trace.sampled
    ids = {
        tracing.run_span_id("run_a"),
        tracing.step_span_id("run_a", 0, 1),
        tracing.step_span_id("run_a", 0, 2),
        tracing.step_span_id("run_a", 1, 1),
        tracing.delivery_span_id("dlv_a", 1),
    }
    assert len(ids) == 5 and all(len(i) == 16 and int(i, 16) for i in ids)
    stored = f"00-{TRACE}-{PARENT}-00"
    assert tracing.run_trace("run_a", stored) == tracing.TraceParent(TRACE, PARENT, "00")
    child = tracing.child_traceparent("run_a", stored, "1" * 16)
    assert child == f"00-{TRACE}-{'1' * 16}-00"


def test_accept_without_export_stores_the_caller_s_context_or_nothing() -> None:
    assert not tracing.ENABLED
    assert tracing.accept(f"00-{TRACE}-{PARENT}-01").stored == f"00-{TRACE}-{PARENT}-01"
    assert tracing.accept("nonsense").stored is None
    assert tracing.accept(None).stored is None


def test_start_without_the_sdk_warns_and_exports_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with caplog.at_level(logging.WARNING, "flowhook.tracing"):
        assert tracing.start("http://127.0.0.1:4318") is False
    assert not tracing.ENABLED
    assert "flowhook[otel]" in caplog.text
    assert tracing.start(None) is False


@pytest.mark.parametrize(
    ("url", "path", "expected"),
    [
        ("https://api.example.com/v1/x", False, "https://api.example.com/v1/x"),
        (
            "https://a.example/p?token=t0k&x=1",
            False,
            "https://a.example/p?token=REDACTED&x=REDACTED",
        ),
        ("https://u:pw@a.example:8443/p#frag", False, "https://REDACTED:REDACTED@a.example:8443/p"),
        ("https://hooks.slack.com/services/T0/B0/XyZ", True, "https://hooks.slack.com/REDACTED"),
        ("https://a.example/", True, "https://a.example/"),
        ("https://[::1]:9/p?k", False, "https://[::1]:9/p?k=REDACTED"),
        ("https://a.example:notaport/p", False, "REDACTED"),
    ],
)
def test_urls_in_spans_keep_no_secret(url: str, path: bool, expected: str) -> None:
    assert tracing.redacted_url(url, path=path) == expected
    attributes = tracing.http_attributes("GET", url, 200, secret_path=path)
    assert attributes["url.full"] == expected
