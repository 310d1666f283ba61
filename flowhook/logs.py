"""Logging: one JSON object a line (``FLOWHOOK_LOG_FORMAT=json``) or a line a person reads
(``text``), each carrying the request id, run id and flow id of the work that wrote it. The
default, ``auto``, writes text to a terminal and JSON lines anywhere else (a file, a pipe, a
log collector)."""

from __future__ import annotations

import contextvars
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

import orjson

__all__ = ["request_id", "run_id", "flow_id", "configure", "FORMATS"]

FORMATS = ("auto", "json", "text")

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_id", default=None)
flow_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("flow_id", default=None)


class _Context(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.run_id = run_id.get()
        record.flow_id = flow_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "run_id", "flow_id"):
            value = getattr(record, key, None)
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


_SHORT = {"uvicorn.error": "uvicorn", "uvicorn.access": "access"}
"""Loggers named as a reader knows them (uvicorn's own lines are not errors)."""


class TextFormatter(logging.Formatter):
    """``12:03:04.517 warning engine  message  run=run_… flow=wf_…``: the local time, the
    level, the logger without its ``flowhook.`` prefix, the message, then the ids."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).astimezone().strftime("%H:%M:%S.%f")[:-3]
        name = _SHORT.get(record.name) or record.name.removeprefix("flowhook.")
        line = f"{when} {record.levelname.lower():<7} {name:<10} {record.getMessage()}"
        ids = [
            f"{label}={value}"
            for label, key in (("run", "run_id"), ("flow", "flow_id"), ("request", "request_id"))
            if (value := getattr(record, key, None))
        ]
        if ids:
            line += "  " + " ".join(ids)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str, fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Log at ``level`` to ``stream`` (standard error) in ``fmt``: ``json``, ``text``, or
    ``auto`` (text on a terminal, JSON lines elsewhere)."""
    out = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if out.isatty() else "json"
    handler = logging.StreamHandler(out)
    handler.addFilter(_Context())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic tells each revision it applies and each plugin it loads: debug detail (the
    # store logs one line for a migration).
    quiet = logging.WARNING if root.level > logging.DEBUG else logging.DEBUG
    logging.getLogger("alembic").setLevel(quiet)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
