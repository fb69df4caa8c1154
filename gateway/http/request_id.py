"""Request ids and the access log, as the outermost ASGI layer of the gateway.

- The client's `x-request-id` is kept when it is 1-128 characters of `A-Z a-z 0-9 . _ ~
  : / + = @ -` (it ends up in log lines and engine logs); otherwise, or when absent, the
  gateway makes one (uuid4 hex). The request's headers are rewritten to carry exactly that
  id, so the proxy sends it to the engine as `x-request-id` (vLLM names its request
  after it).
- A client's W3C `traceparent` that is not valid (or is oversized, or sent twice) is
  replaced by a fresh trace and its `tracestate` dropped (`gateway/http/trace_context.py`), so
  the engine gets either the client's valid trace context or a new one. A replaced id or
  trace context is counted in `kvgate_invalid_headers_total{header}`.
- Every response carries it as `x-request-id` (an engine's own is replaced), errors
  included; `REQUEST_ID` holds it while the request is handled, for log lines.
- With the access log on, one `kvgate.access` line per request when its answer ends:
  status, pod, policy, cached blocks, TTFT (from the request's arrival to the first body
  byte sent, for an answer relayed from a pod) and duration. Probes and scrapes (`/health`,
  `/ready`, `/metrics`) are logged at DEBUG, everything else at INFO.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import clip
from gateway.http.trace_context import checked_trace_context
from gateway.observability.logs import ACCESS_FIELDS, POD, REQUEST_ID

REQUEST_ID_HEADER = b"x-request-id"
_VALID_ID = re.compile(rb"[A-Za-z0-9._~:/+=@-]{1,128}")
_PROBES = frozenset(("/health", "/ready", "/metrics"))

access_logger = logging.getLogger("kvgate.access")

# uuid4's bits: version 4 (bits 76-79) and the RFC 4122 variant (bits 62-63).
_UUID4_CLEAR = ~((0xF << 76) | (0xC << 60))
_UUID4_SET = (0x4 << 76) | (0x8 << 60)


def new_request_id() -> str:
    """`uuid.uuid4().hex`, without building a UUID object (a third of the time)."""
    return "%032x" % (int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR | _UUID4_SET)


def _given_id(headers: list[tuple[bytes, bytes]]) -> str | bool:
    """The client's id if acceptable; else whether it sent one (that is not)."""
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            return value.decode("ascii") if _VALID_ID.fullmatch(value) else True
    return False


class RequestIds:
    """Wraps the app: gives every HTTP request an id, checks its trace context and writes
    its access line. `on_invalid(header)` is told of each client header replaced."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access_log: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        on_invalid: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.access_log = access_log
        self._clock = clock
        self._on_invalid = on_invalid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope["headers"])
        given = _given_id(headers)
        if isinstance(given, str):
            request_id = given
        else:
            request_id = new_request_id()
            if given and self._on_invalid is not None:
                self._on_invalid("x-request-id")
        encoded = request_id.encode("ascii")
        headers = [(n, v) for n, v in headers if n != REQUEST_ID_HEADER]
        headers.append((REQUEST_ID_HEADER, encoded))
        traced = checked_trace_context(headers)
        if traced is not None:
            headers = traced
            if self._on_invalid is not None:
                self._on_invalid("traceparent")
        scope = {**scope, "headers": headers}
        id_token = REQUEST_ID.set(request_id)
        pod_token = POD.set(None)
        started = self._clock()
        answer = _Answer()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(n, v) for n, v in message.get("headers", ()) if n != REQUEST_ID_HEADER]
                kept.append((REQUEST_ID_HEADER, encoded))
                message = {**message, "headers": kept}
                answer.started(message["status"], kept)
                if answer.pod is not None:
                    POD.set(answer.pod)
            elif answer.first_byte is None and message.get("body"):  # a body's first bytes
                answer.first_byte = self._clock()
            await send(message)

        outcome: str | None = None
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            if self.access_log:
                self._log(scope, answer, started, outcome)
            POD.reset(pod_token)
            REQUEST_ID.reset(id_token)

    def _log(self, scope: Scope, answer: _Answer, started: float, outcome: str | None) -> None:
        path: str = scope.get("path", "")
        level = logging.DEBUG if path in _PROBES else logging.INFO
        path = clip(path)
        if not access_logger.isEnabledFor(level):
            return
        duration_ms = (self._clock() - started) * 1e3
        ttft_ms = None
        if answer.pod is not None and answer.first_byte is not None:
            ttft_ms = round((answer.first_byte - started) * 1e3, 3)
        fields: dict[str, Any] = {
            "method": scope.get("method"),
            "path": path,
            "status": answer.status,
            "pod": answer.pod,
            "policy": answer.policy,
            "cached_blocks": answer.cached_blocks,
            "ttft_ms": ttft_ms,
            "duration_ms": round(duration_ms, 3),
        }
        text = (
            f"status={_shown(answer.status)} pod={_shown(answer.pod)} "
            f"policy={_shown(answer.policy)} cached_blocks={_shown(answer.cached_blocks)} "
            f"ttft_ms={_shown(ttft_ms)} duration_ms={fields['duration_ms']}"
        )
        if outcome is not None:  # the answer did not end normally (cut, client gone)
            fields["outcome"] = outcome
            text += f" outcome={outcome}"
        access_logger.log(level, "%s %s %s", fields["method"], path, text,
                          extra={ACCESS_FIELDS: fields, "pod": answer.pod})  # fmt: skip


def _shown(value: object) -> object:
    return "-" if value is None else value


class _Answer:
    """What the response said about itself: status and the decision's headers."""

    __slots__ = ("cached_blocks", "first_byte", "pod", "policy", "status")

    def __init__(self) -> None:
        self.status: int | None = None
        self.pod: str | None = None
        self.policy: str | None = None
        self.cached_blocks: int | None = None
        self.first_byte: float | None = None

    def started(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        for name, value in headers:
            if name == b"x-kvgate-pod":
                self.pod = value.decode("latin-1")
            elif name == b"x-kvgate-policy":
                self.policy = value.decode("latin-1")
            elif name == b"x-kvgate-cached-blocks" and value.isdigit():
                self.cached_blocks = int(value)
