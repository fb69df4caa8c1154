"""A bound on the requests the gateway handles at once (`KVGATE_MAX_CONCURRENT_REQUESTS`).

Beyond it a request is refused at once with 429 + Retry-After (OpenAI's error body), before
its body is read: an overloaded gateway must shed load cheaply rather than queue it, and a
client that holds many slow requests open cannot take more than the limit. A request holds
its slot until its response has been sent in full (a stream included). The probes and
the metrics page are never limited: an overloaded gateway must still say so.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import TooManyRequests

UNLIMITED_PATHS = frozenset(("/health", "/ready", "/metrics"))


class ConcurrencyLimit:
    """ASGI middleware: at most `limit` requests in progress; `on_reject` hears of each 429."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        retry_after_s: int = 1,
        on_reject: Callable[[], None] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.on_reject = on_reject
        self.in_progress = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.limit:
            if self.on_reject is not None:
                self.on_reject()
            error = TooManyRequests(
                f"the gateway is handling {self.limit} requests, its limit; retry later",
                retry_after_s=self.retry_after_s,
            )
            await error.response()(scope, receive, send)
            return
        # Single-threaded event loop: the check above and this increment cannot interleave.
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1
