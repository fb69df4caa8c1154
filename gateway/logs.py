"""Log lines: timestamped text (the default) or one JSON object per line.

Every line about a request carries its id and, once routed, its pod: both live in context
variables set per request (`gateway/request_id.py` and the proxy), which the formatters
read when the line is written. JSON lines hold `time`, `level`, `logger`, `message`,
`request_id`, `pod`, plus `exception` and an access line's fields when present.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, TextIO

REQUEST_ID: ContextVar[str | None] = ContextVar("kvgate_request_id", default=None)
"""The id of the request being handled (None outside a request)."""
POD: ContextVar[str | None] = ContextVar("kvgate_pod", default=None)
"""The pod the request being handled was sent to (None before routing)."""

ACCESS_FIELDS = "access"
"""The `extra` key under which an access line carries its fields (a dict)."""


def _utc(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _context(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """The request id and pod of a line: given with `extra=`, else the current request's."""
    request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
    pod = getattr(record, "pod", None) or POD.get()
    return request_id, pod


class TextFormatter(logging.Formatter):
    """`2026-11-25T07:40:00.123Z INFO gateway.proxy [request_id=… pod=…]: message`."""

    def format(self, record: logging.LogRecord) -> str:
        request_id, pod = _context(record)
        tags = [f"request_id={request_id}"] if request_id else []
        if pod:
            tags.append(f"pod={pod}")
        where = f" [{' '.join(tags)}]" if tags else ""
        line = f"{_utc(record)} {record.levelname} {record.name}{where}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line (never a raw newline: messages are JSON-escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        request_id, pod = _context(record)
        entry: dict[str, Any] = {
            "time": _utc(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id,
            "pod": pod,
        }
        fields = getattr(record, ACCESS_FIELDS, None)
        if isinstance(fields, dict):
            entry.update((key, value) for key, value in fields.items() if key not in entry)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of `KVGATE_LOG_FORMAT` (`text` or `json`)."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"unknown log format {log_format!r}: text or json")


def configure_logging(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """The root logger writes `log_format` lines at `level` to `stream` (stderr); any
    handler it had is replaced, so calling this again switches the format."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape otherwise
