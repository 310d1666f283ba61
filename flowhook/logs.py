"""Logging: one JSON object a line (``FLOWHOOK_LOG_FORMAT=json``, the default) or plain text,
each line carrying the request id, run id and flow id of the work that wrote it."""

from __future__ import annotations

import contextvars
import logging
from datetime import UTC, datetime

import orjson

__all__ = ["request_id", "run_id", "flow_id", "configure"]

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


def configure(level: str, fmt: str = "json") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(_Context())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
