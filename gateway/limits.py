"""Bounds on the requests the gateway handles at once.

- `KVGATE_MAX_CONCURRENT_REQUESTS`: requests in progress. A request takes its slot once its
  body is complete (a GET at once): a client trickling bodies holds no slot, so it cannot
  starve the requests that are ready. Beyond the limit a request is refused at once with
  429 + Retry-After (OpenAI's error body): an overloaded gateway must shed load cheaply
  rather than queue it. A request holds its slot until its response has been sent in full
  (a stream included).
- `KVGATE_MAX_BODIES_PER_CLIENT`: request bodies still being received, per client address;
  beyond it 429 at once. Slow bodies are bounded in time by `KVGATE_BODY_TIMEOUT` (408) and
  in number by this.
The probes and the metrics page are never limited: an overloaded gateway must still say so.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import TooManyRequests

UNLIMITED_PATHS = frozenset(("/health", "/ready", "/metrics"))
_BODYLESS = frozenset(("GET", "HEAD", "OPTIONS"))


class ConcurrencyLimit:
    """ASGI middleware: at most `limit` requests in progress, at most `bodies_per_client`
    bodies being received per client address; `on_reject` hears of each 429."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        bodies_per_client: int,
        retry_after_s: int = 1,
        on_reject: Callable[[], None] | None = None,
    ) -> None:
        if limit < 1 or bodies_per_client < 1:
            raise ValueError(f"limits must be >= 1, got {limit} and {bodies_per_client}")
        self.app = app
        self.limit = limit
        self.bodies_per_client = bodies_per_client
        self.retry_after_s = retry_after_s
        self.on_reject = on_reject
        self.in_progress = 0
        self.receiving: dict[str, int] = {}
        """Bodies being received, per client address (absent at zero: bounded by clients)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["method"] in _BODYLESS:
            if not self._take_slot():
                await self._refusal(answered_here=True).response()(scope, receive, send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_progress -= 1
            return
        client = (scope.get("client") or ("",))[0] or ""
        if self.receiving.get(client, 0) >= self.bodies_per_client:
            if self.on_reject is not None:
                self.on_reject()
            error = TooManyRequests(
                f"{self.bodies_per_client} request bodies from this client are still being "
                "received (KVGATE_MAX_BODIES_PER_CLIENT); retry later",
                retry_after_s=self.retry_after_s,
            )
            await error.response()(scope, receive, send)
            return
        self.receiving[client] = self.receiving.get(client, 0) + 1
        state = {"receiving": True, "holding": False}

        async def receive_counted() -> Message:
            message = await receive()
            if state["receiving"] and not (
                message["type"] == "http.request" and message.get("more_body", False)
            ):
                state["receiving"] = False
                self._body_done(client)
                if message["type"] == "http.request":  # the body is complete: take a slot
                    if not self._take_slot():  # answered (and counted) by the error handler
                        raise self._refusal(answered_here=False)
                    state["holding"] = True
            return message

        try:
            await self.app(scope, receive_counted, send)
        finally:
            if state["receiving"]:
                self._body_done(client)
            if state["holding"]:
                self.in_progress -= 1

    def _take_slot(self) -> bool:
        # Single-threaded event loop: the check and the increment cannot interleave.
        if self.in_progress >= self.limit:
            return False
        self.in_progress += 1
        return True

    def _refusal(self, *, answered_here: bool) -> TooManyRequests:
        if answered_here and self.on_reject is not None:
            self.on_reject()
        return TooManyRequests(
            f"the gateway is handling {self.limit} requests, its limit; retry later",
            retry_after_s=self.retry_after_s,
        )

    def _body_done(self, client: str) -> None:
        left = self.receiving.get(client, 0) - 1
        if left > 0:
            self.receiving[client] = left
        else:
            self.receiving.pop(client, None)
