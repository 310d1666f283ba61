"""The SDK's Server-Sent Events decoder, against the WHATWG parsing rules."""

from __future__ import annotations

import json

import pytest

from flowhook.client._sse import ServerSentEvent, SSEDecoder


def decode(*chunks: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    return [m for chunk in chunks for m in decoder.feed(chunk)]


def one_byte_at_a_time(stream: bytes) -> list[ServerSentEvent]:
    return decode(*(stream[i : i + 1] for i in range(len(stream))))


ENVELOPE = json.dumps(
    {"event": "flow.started", "run_id": "run_1", "payload": {"note": "a\u2028b\u0085c\x0cd é"}},
    ensure_ascii=False,
)
STREAM = (
    ": hello\n\n"
    f"id: evt_1\nevent: flow.started\ndata: {ENVELOPE}\n\n"
    ": heartbeat\r\n"
    'id: evt_2\r\nevent: flow.step_completed\r\ndata: {"a":\r\ndata:  1}\r\n\r\n'
    "id: evt_3\revent: flow.completed\rdata: {}\r\r"
).encode()


def test_messages_with_ids_names_and_data() -> None:
    got = decode(STREAM)
    assert [(m.id, m.event) for m in got] == [
        ("evt_1", "flow.started"),
        ("evt_2", "flow.step_completed"),
        ("evt_3", "flow.completed"),
    ]
    # U+2028, U+0085 and form feeds inside the JSON are data, not line ends
    assert got[0].data == ENVELOPE and json.loads(got[0].data)["payload"]["note"] == (
        "a\u2028b\u0085c\x0cd é"
    )
    assert got[1].data == '{"a":\n 1}'  # data lines join with LF; one leading space goes


@pytest.mark.parametrize("split", range(1, len(STREAM)))
def test_any_split_of_the_bytes_gives_the_same_messages(split: int) -> None:
    assert decode(STREAM[:split], STREAM[split:]) == decode(STREAM)


def test_one_byte_at_a_time() -> None:
    # every CRLF and every UTF-8 sequence of the stream is split somewhere here
    assert one_byte_at_a_time(STREAM) == decode(STREAM)


def test_comments_are_ignored_even_inside_a_message() -> None:
    got = decode(b"id: 1\n: keep-alive\ndata: x\n:\ndata: y\n\n")
    assert [(m.id, m.data) for m in got] == [("1", "x\ny")]


def test_field_forms() -> None:
    got = decode(b"data\ndata:\ndata:no space\ndata:  two\nevent:e\nbogus: ignored\n\n")
    assert got == [ServerSentEvent("e", "\n\nno space\n two", None, None)]


def test_without_an_event_name_it_is_a_message() -> None:
    assert decode(b"data: x\n\n")[0].event == "message"


def test_the_event_name_does_not_carry_over_but_the_id_does() -> None:
    got = decode(b"id: 7\nevent: a\ndata: 1\n\ndata: 2\n\n")
    assert [(m.event, m.id) for m in got] == [("a", "7"), ("message", "7")]


def test_retry_is_kept_when_it_is_a_number() -> None:
    got = decode(b"retry: 2500\ndata: a\n\nretry: soon\ndata: b\n\n")
    assert [m.retry for m in got] == [2500, 2500]


def test_retry_counts_without_a_message() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"retry: 10\n\n") == [] and decoder.retry == 10


def test_an_id_with_a_nul_is_ignored() -> None:
    decoder = SSEDecoder()
    assert [m.id for m in decoder.feed(b"id: a\ndata: 1\n\nid: b\x00c\ndata: 2\n\n")] == ["a", "a"]
    assert decoder.last_event_id == "a"


def test_no_data_no_message_but_the_id_counts() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 5\nevent: nothing\n\n") == []
    assert decoder.last_event_id == "5"
    assert decoder.feed(b"data: now\n\n") == [ServerSentEvent("message", "now", "5", None)]


def test_a_message_cut_off_by_the_end_is_not_dispatched() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 1\ndata: whole\n\nid: 2\ndata: half") == [
        ServerSentEvent("message", "whole", "1", None)
    ]
    assert decoder.feed(b"") == []


def test_a_leading_byte_order_mark_is_skipped() -> None:
    assert decode(b"\xef\xbb\xbf", b"data: x\n\n")[0].data == "x"
    assert decode(b"data: \xef\xbb\xbfx\n\n")[0].data == "\ufeffx"  # only at the start


def test_a_cr_at_the_end_of_a_chunk_then_an_lf() -> None:
    assert decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [
        ServerSentEvent("message", "a\nb", None, None)
    ]
    assert decode(b"data: a\r", b"\r") == [ServerSentEvent("message", "a", None, None)]
