"""The gateway's exceptions: each request error mapped once to an HTTP status and an
OpenAI-style body, and the one start-up error.

GatewayError
├── BadRequest (400)            malformed JSON, missing fields, unknown policy
│   └── ClientClosed (400)      the client left before sending its body
├── PayloadTooLarge (413)       Connection: close
├── RequestTimeout (408)        the client did not send its body in time; Connection: close
├── RetryLater                  carries Retry-After
│   ├── TooManyRequests (429)   over KVGATE_MAX_CONCURRENT_REQUESTS, or
│   │                           KVGATE_MAX_BODIES_PER_CLIENT (then Connection: close)
│   │   └── SloUnreachable (429)  no pod predicted to meet x-slo-ttft-ms / x-slo-tpot-ms
│   │                             (KVGATE_SLO_SHED)
│   └── NoRoutablePod (503)     every candidate filtered out
├── Unauthorized (401)          admin API without the right token
├── Forbidden (403)
├── NotFound (404)              admin resources
│   └── ModelNotFound (404)
├── PinRefused (409)            a pin the gateway will not make (budget, cap, no support)
├── PinFailed (502)             the engine failed a pin call
└── UpstreamError (502)         the engine could not be reached or failed
    └── UpstreamTimeout (504)

ConfigError                     an invalid setting, routing config or pods file: stops
                                start-up (`kvgate serve` exits 2), or refuses a reload

Lower layers raise their own errors, mapped to these where they meet a request:
`http1.Http1Error` (connect, timeout, broken answer) → UpstreamError / UpstreamTimeout;
`tokenizer.TokenizerError` → routing on load only (counted, never a client error);
`pinning.client.PinCallError` → PinFailed / PinRefused; the index's `UnknownPodError` and
`InvalidIndexConfig` never reach a client.
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

if TYPE_CHECKING:
    from gateway.http.metrics import HttpMetrics


ECHO_LIMIT = 256
"""Characters of a client's value (a model or policy name, a header, a path) an error
message or a log line repeats; a longer one is cut there and ends with an ellipsis."""
_MESSAGE_LIMIT = 4 * ECHO_LIMIT


def clip(value: str, limit: int = ECHO_LIMIT) -> str:
    """`value` as an error or log line repeats it: at most `limit` characters and "…"."""
    return value if len(value) <= limit else value[:limit] + "…"


class GatewayError(Exception):
    """A request's error. Its message is cut to a bounded length whatever it quotes (each
    quoted client value should be `clip`ped where it is quoted, to keep the sentence)."""

    status = 500
    error_type = "internal_error"
    code: str | None = None
    close_connection = False
    """Answered before the request's body was read whole: the answer says
    `Connection: close` and the server closes the connection after it, so the rest of the
    body (a slow client's trickle) cannot hold the connection."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        message = clip(message, _MESSAGE_LIMIT)
        super().__init__(message)
        self.message = message
        self.param = param

    def headers(self) -> dict[str, str]:
        return {"connection": "close"} if self.close_connection else {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code or self.status,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers())


def refusal(error: GatewayError, metrics: HttpMetrics | None) -> JSONResponse:
    """The client's answer to `error`, counted in `kvgate_requests_rejected_total` by its
    type (not counted before the gateway has started: there are no metrics yet)."""
    if metrics is not None:
        metrics.rejected.labels(type(error).__name__).inc()
    return error.response()


class BadRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    close_connection = True


class ClientClosed(BadRequest):
    """The client left before sending its whole body: nobody reads the answer, but the
    request is counted (`kvgate_requests_rejected_total{reason="ClientClosed"}`) instead of
    logging a traceback per disconnect."""


class RequestTimeout(GatewayError):
    status = 408
    error_type = "invalid_request_error"
    close_connection = True


class RetryLater(GatewayError):
    """An error the client may retry after `retry_after_s` (sent as Retry-After)."""

    def __init__(
        self, message: str, *, retry_after_s: int = 1, close_connection: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.close_connection = close_connection

    def headers(self) -> dict[str, str]:
        return {**super().headers(), "retry-after": str(self.retry_after_s)}


class TooManyRequests(RetryLater):
    status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class SloUnreachable(TooManyRequests):
    """No pod is predicted to meet the request's TTFT and TPOT objectives and shedding is
    on (`KVGATE_SLO_SHED`)."""

    code = "slo_unreachable"


class Unauthorized(GatewayError):
    status = 401
    error_type = "authentication_error"


class Forbidden(GatewayError):
    status = 403
    error_type = "permission_error"


class NotFound(GatewayError):
    status = 404
    error_type = "not_found_error"


class ModelNotFound(NotFound):
    error_type = "NotFoundError"
    code = "model_not_found"


class NoRoutablePod(RetryLater):
    status = 503
    error_type = "service_unavailable"


class UpstreamError(GatewayError):
    status = 502
    error_type = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    error_type = "upstream_timeout"


class PinRefused(GatewayError):
    """A pin the gateway will not make (budget, no pin support): 409 with a reason code."""

    status = 409
    error_type = "pin_refused"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.code = reason


class PinFailed(GatewayError):
    status = 502
    error_type = "upstream_error"


class ConfigError(ValueError):
    """An invalid setting: names the variable (or file and key), the value and what is
    allowed."""

    def __init__(self, variable: str, value: object, allowed: str) -> None:
        # One line of bounded length, whatever the value (a file nested 10 000 deep, a
        # parser's multi-line message).
        shown = _VALUE.repr(value).replace("\n", " ").replace("\r", " ")
        super().__init__(f"{_one_line(variable)}={shown} is invalid: expected {_one_line(allowed)}")
        self.variable = variable
        self.value = value
        self.allowed = allowed


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _value_repr() -> reprlib.Repr:
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 3, 400, 400
    shown.maxlist = shown.maxdict = shown.maxtuple = 8
    return shown


_VALUE = _value_repr()
