"""Log lines: timestamped text (the default) or one JSON object per line.

Every line about a request carries its id and, once routed, its pod: both live in context
variables set per request (`gateway/http/request_id.py` and the proxy), which the formatters
read when the line is written. JSON lines hold `time`, `level`, `logger`, `message`,
`request_id`, `pod`, plus `exception` and an access line's fields when present.

A text record is one line: its message and every value in it (a request's path, a pod's
name) are written with control characters escaped (`\\n`, `\\r`, `\\x1b`, ...), so a client
cannot write a line of its own. A traceback follows on further lines, each indented, so
only a record's first line starts with a timestamp.
"""

from __future__ import annotations

import json
import logging
import re
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


# C0 controls but TAB, DEL, C1 controls, and the Unicode line and paragraph separators:
# everything a terminal or a line splitter (`str.splitlines`) takes as a break or a command.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with its control characters written as escapes: always one line."""
    return _CONTROL.sub(_escape_one, text) if _CONTROL.search(text) else text


def _indented(text: str) -> str:
    """A traceback's lines, each escaped and indented: none can pass for a record."""
    return "\n".join("    " + escape_controls(line) for line in text.split("\n"))


class _Utc:
    """A record's time as `2026-11-25T07:40:00.123Z`; the seconds part is formatted once
    per second (lines come many per second: one per request)."""

    __slots__ = ("_second", "_text")

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._text}.{int(record.msecs):03d}Z"


def _context(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """The request id and pod of a line: given with `extra=`, else the current request's."""
    request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
    pod = getattr(record, "pod", None) or POD.get()
    return request_id, pod


class TextFormatter(logging.Formatter):
    """`2026-11-25T07:40:00.123Z INFO gateway.upstream.proxy [request_id=… pod=…]: message`."""

    def __init__(self) -> None:
        super().__init__()
        self._utc = _Utc()

    def format(self, record: logging.LogRecord) -> str:
        request_id, pod = _context(record)
        tags = [f"request_id={request_id}"] if request_id else []
        if pod:
            tags.append(f"pod={pod}")
        where = f" [{' '.join(tags)}]" if tags else ""
        line = escape_controls(
            f"{self._utc(record)} {record.levelname} {record.name}{where}: {record.getMessage()}"
        )
        if record.exc_info:
            line += "\n" + _indented(self.formatException(record.exc_info))
        if record.stack_info:
            line += "\n" + _indented(self.formatStack(record.stack_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line (never a raw newline: messages are JSON-escaped)."""

    def __init__(self) -> None:
        super().__init__()
        self._utc = _Utc()
        # one encoder for every line (`json.dumps` with options builds one per call)
        self._encode = json.JSONEncoder(default=str, ensure_ascii=False).encode

    def format(self, record: logging.LogRecord) -> str:
        request_id, pod = _context(record)
        entry: dict[str, Any] = {
            "time": self._utc(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id,
            "pod": pod,
        }
        fields = getattr(record, ACCESS_FIELDS, None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return self._encode(entry)


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
    # Neither format shows a record's thread, process, task or calling frame: not
    # collecting them (logging's documented switches) takes a third off every line, and
    # the access log writes one per request.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if hasattr(logging, "logAsyncioTasks"):  # Python 3.12+
        logging.logAsyncioTasks = False
    logging._srcfile = None
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape otherwise
