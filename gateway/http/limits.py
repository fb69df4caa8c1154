"""Bounds on the requests the gateway handles at once.

- `KVGATE_MAX_CONCURRENT_REQUESTS`: requests in progress. A request takes its slot once its
  body is complete (a GET at once): a client trickling bodies holds no slot, so it cannot
  starve the requests that are ready. Beyond the limit a request is refused at once with
  429 + Retry-After (OpenAI's error body): an overloaded gateway must shed load cheaply
  rather than queue it. A request holds its slot until its response has been sent in full
  (a stream included).
- `KVGATE_MAX_BODIES_PER_CLIENT`: slow request bodies per client address: bodies still
  arriving `BODY_GRACE_S` after their request's headers. A body that is complete within the
  grace never counts, however many a client sends at once (behind an ingress every client
  shares one address); a body still arriving after it counts until it is complete, or is
  refused with 429 (and its connection closed) if its client already has that many. Slow
  bodies are bounded in time by `KVGATE_BODY_TIMEOUT` (408) and in number by this.
The client address is the TCP peer's, or the one a trusted proxy forwarded
(`gateway/http/client_address.py`). The probes and the metrics page are never limited: an
overloaded gateway must still say so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import TooManyRequests
from gateway.http.protocol import BODY_RECEIVED

UNLIMITED_PATHS = frozenset(("/health", "/ready", "/metrics"))
_BODYLESS = frozenset(("GET", "HEAD", "OPTIONS"))
BODY_GRACE_S = 1.0
"""How long a request's body may take to arrive, from the end of its headers, without
counting against its client's slow bodies: a whole 16 MiB body at 130 Mbit/s, far more than
a fast client needs on a busy gateway; a slow-loris trickle takes much longer."""


class ConcurrencyLimit:
    """ASGI middleware: at most `limit` requests in progress, at most `bodies_per_client`
    bodies per client address still arriving after `grace_s`; `on_reject` hears of each
    429 answered here (the others are counted by the app's error handler)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int,
        bodies_per_client: int,
        retry_after_s: int = 1,
        grace_s: float = BODY_GRACE_S,
        on_reject: Callable[[], None] | None = None,
    ) -> None:
        if limit < 1 or bodies_per_client < 1:
            raise ValueError(f"limits must be >= 1, got {limit} and {bodies_per_client}")
        self.app = app
        self.limit = limit
        self.bodies_per_client = bodies_per_client
        self.retry_after_s = retry_after_s
        self.grace_s = grace_s
        self.on_reject = on_reject
        self.in_progress = 0
        self.slow: dict[str, int] = {}
        """Bodies still arriving after the grace, per client address (absent at zero:
        bounded by the open connections)."""

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
        extensions = scope.setdefault("extensions", {})
        body = _Body(self, (scope.get("client") or ("",))[0] or "", receive, extensions)
        if not extensions.get(BODY_RECEIVED, False):
            body.time_it()  # the body is still coming: it has its grace
        try:
            await self.app(scope, body.receive, send)
        finally:
            body.done()
            if body.holding:
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

    def _too_many_slow(self) -> TooManyRequests:
        return TooManyRequests(
            f"{self.bodies_per_client} request bodies from this client are still arriving "
            f"after {self.grace_s:g} s (KVGATE_MAX_BODIES_PER_CLIENT); retry later",
            retry_after_s=self.retry_after_s,
            close_connection=True,  # the rest of this body is nobody's
        )


class _Body:
    """One request's body on its way in: its grace timer, whether it counts as slow, and
    the slot its request takes once it is complete."""

    __slots__ = ("_cancelling", "_extensions", "_receive", "_timer", "_waiting", "client",
                 "counted", "holding", "limiter", "receiving", "refused")  # fmt: skip

    def __init__(
        self,
        limiter: ConcurrencyLimit,
        client: str,
        receive: Receive,
        extensions: dict[str, Any],
    ) -> None:
        self.limiter = limiter
        self._extensions = extensions
        self.client = client
        self._receive = receive
        self.receiving = True
        self.counted = False
        self.refused = False
        self.holding = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: asyncio.Task[object] | None = None
        """The task waiting in `receive` for the body, if one is."""
        self._cancelling = 0

    def time_it(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.limiter.grace_s, self._grace_over)

    def _grace_over(self) -> None:
        """The grace is over and the body is still arriving: it counts as slow, or is
        refused if its client has as many slow bodies as allowed."""
        self._timer = None
        if not self.receiving or self._extensions.get(BODY_RECEIVED, False):
            # Complete or already whole in the server, only not read yet (a busy gateway
            # reads late): the client was not slow.
            return
        slow = self.limiter.slow
        if slow.get(self.client, 0) < self.limiter.bodies_per_client:
            slow[self.client] = slow.get(self.client, 0) + 1
            self.counted = True
            return
        self.refused = True
        if self._waiting is not None:
            # The request waits in `receive` for bytes that may come in a long while:
            # interrupt that wait (as asyncio.timeout does) and refuse it there.
            self._cancelling = self._waiting.cancelling()
            self._waiting.cancel()

    async def receive(self) -> Message:
        if self.refused and self.receiving:
            self.done()
            raise self.limiter._too_many_slow()
        task = self._waiting = asyncio.current_task() if self.receiving else None
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            if self.refused and task is not None and task.uncancel() <= self._cancelling:
                self.done()
                raise self.limiter._too_many_slow() from None
            raise
        finally:
            self._waiting = None
        if self.receiving and not (
            message["type"] == "http.request" and message.get("more_body", False)
        ):
            self.done()
            if message["type"] == "http.request":  # the body is complete: take a slot
                if not self.limiter._take_slot():  # answered (and counted) by the error handler
                    raise self.limiter._refusal(answered_here=False)
                self.holding = True
        return message

    def done(self) -> None:
        """The body is complete, or will not be (refused, or the client left): it no
        longer counts."""
        if not self.receiving:
            return
        self.receiving = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.counted:
            self.counted = False
            slow = self.limiter.slow
            left = slow.get(self.client, 0) - 1
            if left > 0:
                slow[self.client] = left
            else:
                slow.pop(self.client, None)
