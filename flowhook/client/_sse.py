"""A Server-Sent Events decoder, as the WHATWG HTML standard ("Parsing an event stream")
describes it: lines end with CRLF, LF or CR; a blank line dispatches the message; ``:``
starts a comment; ``data`` lines join with LF; ``id`` and ``retry`` carry over.

It splits lines itself instead of using ``str.splitlines`` (or httpx's ``iter_lines``, which
uses it): those also break at U+2028, U+0085 and form feeds, which JSON strings in ``data``
may hold raw."""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["SSEDecoder", "ServerSentEvent"]


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched message: ``event`` (``message`` when the stream named none), ``data``
    (its ``data`` lines joined with LF), ``id`` (the last event id at that point, ``None``
    before any) and ``retry`` (milliseconds, when the stream set one)."""

    event: str
    data: str
    id: str | None
    retry: int | None


class SSEDecoder:
    """Feed it bytes as they arrive (any split, even inside a UTF-8 sequence or a CRLF); it
    answers the messages those bytes completed. A message cut off by the end of the stream is
    never answered (the standard discards it)."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # the start of a line whose end has not arrived
        self._after_cr = False  # the last chunk ended with CR: an LF next belongs to it
        self._first = True  # a byte order mark is skipped at the very start only
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    @property
    def last_event_id(self) -> str | None:
        return self._id

    @property
    def retry(self) -> int | None:
        """The reconnection time the stream asked for (ms), even with no message since."""
        return self._retry

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        return self._lines(self._text.decode(chunk))

    def _lines(self, text: str) -> list[ServerSentEvent]:
        if self._first and text:
            self._first = False
            text = text.removeprefix("\ufeff")
        out: list[ServerSentEvent] = []
        start = 0
        for i, ch in enumerate(text):
            if ch != "\n" and ch != "\r":
                continue
            if ch == "\n" and self._after_cr and i == start:  # the LF of a CRLF: no new line
                self._after_cr = False
                start = i + 1
                continue
            line, self._pending = self._pending + text[start:i], ""
            start = i + 1
            self._after_cr = ch == "\r"
            message = self._line(line)
            if message is not None:
                out.append(message)
        if start < len(text):
            self._pending += text[start:]
            self._after_cr = False
        return out

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment: the server's heartbeat
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:  # no data line: nothing to dispatch (an id alone still counts)
            return None
        return ServerSentEvent(event or "message", "\n".join(data), self._id, self._retry)
