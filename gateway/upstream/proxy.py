"""Forwarding a request to the chosen pod and relaying its answer back, byte for byte.

- One shared keep-alive HTTP/1.1 pool (`gateway.upstream.http1`); body bytes are passed on as they
  arrive, through raw ASGI messages (no response object, no task group per response).
- Connect failure, an answer that breaks before its headers, or a 5xx status before any
  byte went to the client: retry once on the next-best pod. A timeout is not retried (the
  engine may be working on it): 504.
- After the first byte, an upstream failure cuts the client's connection, as the engine's
  own failure would have.
- A client that disconnects, while the engine thinks or while it streams, aborts the
  upstream exchange: its connection is closed, so the engine stops the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from starlette.types import Receive, Scope, Send

from gateway.control.registry import PodState
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.http.protocol import CLIENT_GONE, ConnectionWatch
from gateway.observability.logs import POD
from gateway.upstream.http1 import (
    Aborted,
    Exchange,
    Headers,
    Http1Error,
    Http1Pool,
    ResponseTimeout,
)
from gateway.upstream.metrics import UpstreamMetrics
from gateway.upstream.usage import UsageMeter

logger = logging.getLogger(__name__)

_REQUEST_HEADERS = frozenset(
    (b"content-type", b"accept", b"authorization", b"user-agent", b"x-request-id",
     b"traceparent", b"tracestate", b"baggage")  # W3C trace context goes on to the engine
)  # fmt: skip
# RFC 9110 §7.6.1: hop-by-hop fields, never relayed; plus any field a `Connection` header
# names. `date` and `server` are the gateway's own to send.
_HOP_BY_HOP = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
     b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"date",
     b"server")
)  # fmt: skip
_OURS = b"x-kvgate-"
"""Headers the gateway sets: an engine's own are dropped, never confused with the decision's."""


def _named_by_connection(headers: Sequence[tuple[bytes, bytes]]) -> frozenset[bytes]:
    names: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            names.update(token.strip().lower() for token in value.split(b","))
    return frozenset(names)


class UpstreamCut(Exception):
    """The engine failed after the client got bytes: the client's connection is cut."""


class ClientGone(Exception):
    """The client disconnected; there is nobody to answer."""


class Labelled(Protocol):
    """What a request's counters are labelled with."""

    @property
    def model(self) -> str: ...
    @property
    def policy(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    path: str
    body: bytes
    headers: Sequence[tuple[bytes, bytes]]
    """The client's raw headers; a few (content type, auth, request id, trace context...)
    go upstream."""
    model: str
    policy: str
    extra_response_headers: Callable[[PodState], Mapping[str, str]]
    """Headers naming the decision, for the pod that finally answers."""

    def head(self) -> bytes:
        lines = [b"POST ", self.path.encode("ascii"), b" HTTP/1.1\r\ncontent-length: ",
                 str(len(self.body)).encode("ascii"), b"\r\n"]  # fmt: skip
        dropped = _named_by_connection(self.headers)
        for name, value in self.headers:
            if name in _REQUEST_HEADERS and name not in dropped:
                lines += (name, b": ", value, b"\r\n")
        return b"".join(lines)


class ClientWatch:
    """Notices the client going away while its request is forwarded, and aborts the
    upstream exchange in progress. The request body must have been read already.

    From the server's `ConnectionWatch` when it offers one (`CLIENT_GONE`, kvgate's own
    protocol); otherwise a task waits in `receive()` for the disconnect."""

    def __init__(self, receive: Receive, connection: ConnectionWatch | None = None) -> None:
        self.gone = False
        self._exchange: Exchange | None = None
        self._connection = connection
        self._task: asyncio.Task[None] | None = None
        if connection is None:
            self._task = asyncio.ensure_future(self._watch(receive))
        elif connection.closed:
            self.gone = True
        else:
            connection.subscribe(self._on_gone)

    @classmethod
    def of(cls, scope: Scope, receive: Receive) -> ClientWatch:
        connection = scope.get("extensions", {}).get(CLIENT_GONE)
        return cls(receive, connection if isinstance(connection, ConnectionWatch) else None)

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._on_gone()

    def _on_gone(self) -> None:
        self.gone = True
        if self._exchange is not None:
            self._exchange.abort("the client disconnected")

    def attach(self, exchange: Exchange) -> None:
        self._exchange = exchange
        if self.gone:
            exchange.abort("the client disconnected")

    def stop(self) -> None:
        """Before the last byte goes out: after it, `receive` reports a disconnect anyway."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._connection is not None:
            self._connection.unsubscribe(self._on_gone)
            self._connection = None


class Upstream:
    def __init__(
        self,
        pool: Http1Pool,
        metrics: UpstreamMetrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
        pulse: Callable[[str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self._clock = clock
        self.pulse = pulse
        """Hears of every chunk relayed from a pod, by the pod's name: each left the engine
        at the end of one of its steps (the cost model times the steps by them)."""
        self._exchanges: dict[str, set[Exchange]] = {}
        """Per pod, its exchanges in progress: each is added when its request is sent and
        taken out when it ends (`Exchange.release`, reached by every exchange), so the book
        holds exactly what is in flight, never a finished exchange awaiting collection."""

    def pods_in_flight(self) -> list[str]:
        return list(self._exchanges)

    def in_flight(self, pod: str) -> int:
        """Exchanges in progress with `pod`."""
        return len(self._exchanges.get(pod, ()))

    def break_off(self, pod: str, reason: str) -> int:
        """End every exchange in progress with `pod` as broken: streams are cut, requests
        still waiting for their answer fail over. Returns how many were broken off (an
        exchange whose answer already ended whole is left to finish)."""
        return sum(exchange.break_off(reason) for exchange in list(self._exchanges.get(pod, ())))

    def _ended(self, pod: str) -> Callable[[Exchange], None]:
        def ended(exchange: Exchange) -> None:
            tracked = self._exchanges.get(pod)
            if tracked is not None:
                tracked.discard(exchange)
                if not tracked:
                    del self._exchanges[pod]

        return ended

    def _watcher(self, state: PodState, watch: ClientWatch) -> Callable[[Exchange], None]:
        """What hears of a new exchange with `state`: the client's watch, and this proxy's
        per-pod book of exchanges in progress."""

        def started(exchange: Exchange) -> None:
            watch.attach(exchange)
            self._exchanges.setdefault(state.name, set()).add(exchange)
            exchange.on_release = self._ended(state.name)

        return started

    async def forward(
        self,
        request: ProxyRequest,
        ranking: list[PodState],
        watch: ClientWatch,
        *,
        on_attempt: Callable[[PodState], None] | None = None,
        on_served: Callable[[PodState, int], None] | None = None,
        on_first_byte: Callable[[PodState], None] | None = None,
        on_done: Callable[[], None] | None = None,
        meter: UsageMeter | None = None,
    ) -> Relay:
        """Send to ranking[0], or ranking[1] if ranking[0] fails before answering.

        `on_attempt` hears of each pod tried, before the request is sent; `on_served` of the
        pod whose answer goes back to the client, and its status; `on_first_byte` when its
        first body byte arrives; `on_done` when the relayed answer ends, however (not called
        when this raises: the caller knows then); `meter` sees every relayed chunk."""
        head = request.head()
        attempts = ranking[:2]
        metrics = self._metrics
        try:
            for attempt, state in enumerate(attempts):
                last = attempt == len(attempts) - 1
                started = self._clock()
                POD.set(state.name)  # this request's log lines name the pod tried
                if on_attempt is not None:
                    on_attempt(state)
                self.acquire(state)
                try:
                    exchange = await self._pool.send(
                        state.pod.url, head, request.body, on_exchange=self._watcher(state, watch)
                    )
                except Aborted:
                    self.release(state, request, "client_disconnect", final=True)
                    raise ClientGone from None
                except ResponseTimeout:
                    self.release(state, request, "504", final=True)
                    metrics.upstream_errors.labels(state.name, "timeout").inc()
                    raise UpstreamTimeout(f"pod {state.name} did not answer in time") from None
                except Http1Error as exc:
                    self.release(state, request, "502", final=last)
                    metrics.upstream_errors.labels(state.name, "connect").inc()
                    if last:
                        message = f"pod {state.name} could not be reached: {exc}"
                        raise UpstreamError(message) from None
                    metrics.retries.labels(state.name).inc()
                    logger.info("retrying on another pod: %s could not be reached (%s)",
                                state.name, exc)  # fmt: skip
                    continue
                except BaseException:
                    self.release(state, request, "client_disconnect", final=True)
                    raise
                if exchange.status >= 500 and not last:
                    exchange.abort("retrying elsewhere")
                    self.release(state, request, str(exchange.status), final=False)
                    metrics.upstream_errors.labels(state.name, "status_5xx").inc()
                    metrics.retries.labels(state.name).inc()
                    logger.info("retrying on another pod: %s answered %d before any byte",
                                state.name, exchange.status)  # fmt: skip
                    continue
                if on_served is not None:
                    on_served(state, exchange.status)
                return Relay(
                    self, exchange, state, request, started, watch, on_first_byte, on_done, meter
                )
        except BaseException:
            watch.stop()
            raise
        raise UpstreamError("no pod could take the request")  # pragma: no cover - ranking empty

    def acquire(self, state: PodState) -> None:
        """A request goes to `state`: it is in flight there until its `release`."""
        state.inflight += 1
        self._metrics.inflight.labels(state.name).inc()

    def first_byte(self, state: PodState, started: float) -> None:
        self._metrics.ttft.labels(state.name).observe(self._clock() - started)

    def cut(self, state: PodState) -> None:
        self._metrics.upstream_errors.labels(state.name, "midstream").inc()

    def release(
        self, state: PodState, request: Labelled, outcome: str, *, final: bool = True
    ) -> None:
        """An attempt on `state` ended with `outcome`; `final`: it is also the request's
        end, which the client saw (`kvgate_requests_total` counts each request once, with
        that status; every attempt is in `kvgate_upstream_attempts_total`)."""
        state.inflight -= 1
        metrics = self._metrics
        metrics.inflight.labels(state.name).dec()
        metrics.attempts.labels(state.name, outcome).inc()
        if final:
            metrics.requests.labels(request.model, state.name, request.policy, outcome).inc()


class Relay:
    """The ASGI response: the engine's status and headers (plus the decision's), then its
    body as it comes."""

    def __init__(
        self,
        upstream: Upstream,
        exchange: Exchange,
        state: PodState,
        request: ProxyRequest,
        started: float,
        watch: ClientWatch,
        on_first_byte: Callable[[PodState], None] | None = None,
        on_done: Callable[[], None] | None = None,
        meter: UsageMeter | None = None,
    ) -> None:
        self._upstream = upstream
        self._meter = meter
        self._on_first_byte = on_first_byte
        self._on_done = on_done
        self._exchange = exchange
        self._state = state
        self._request = request
        self._started = started
        self._watch = watch
        self.status_code = exchange.status
        self.headers = _response_headers(exchange.headers, state, request)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange, state = self._exchange, self._state
        upstream = self._upstream
        outcome = str(exchange.status)
        start = {"type": "http.response.start", "status": exchange.status, "headers": self.headers}
        started = False
        try:
            if exchange.fixed_length and not exchange.complete:
                # A whole answer whose body is still coming (the engine wrote its head and
                # body apart): the head waits for it, so the two go out in one write.
                await exchange.body_started()
            started = True
            await send(start)
            meter = self._meter
            pulse = upstream.pulse
            name = state.name
            if exchange.complete:  # a small answer arrives whole with its headers
                if pulse is not None:
                    pulse(name)
                self._first_byte()
                self._watch.stop()
                body = exchange.take_body()
                if meter is not None:
                    meter.feed(body)
                await send({"type": "http.response.body", "body": body})
                return
            first = True
            ended = False
            async for chunk in exchange.chunks():
                if pulse is not None:
                    pulse(name)
                if first:
                    self._first_byte()
                    first = False
                if meter is not None:
                    meter.feed(chunk)
                # The engine's last chunk usually comes with its end: the two go out as one
                # write (chunk and terminator) instead of two.
                ended = exchange.drained
                if ended:
                    self._watch.stop()
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            if not ended:
                self._watch.stop()
                await send({"type": "http.response.body", "body": b""})
        except Aborted:
            outcome = "client_disconnect"
            raise ClientGone from None
        except Http1Error as exc:
            outcome = "cut"
            upstream.cut(state)
            if not started:  # the client sees what it would have: the head, then the cut
                await send(start)
            raise UpstreamCut(f"pod {state.name} failed mid-response: {exc}") from exc
        except BaseException:
            outcome = "client_disconnect"
            if not started:  # cancelled (a forced shutdown): the head, then the cut, as before
                await send(start)
            raise
        finally:
            self._watch.stop()
            exchange.release()
            upstream.release(state, self._request, outcome)
            if self._on_done is not None:
                self._on_done()

    def _first_byte(self) -> None:
        self._upstream.first_byte(self._state, self._started)
        if self._on_first_byte is not None:
            self._on_first_byte(self._state)


def _response_headers(upstream: Headers, state: PodState, request: ProxyRequest) -> Headers:
    dropped = _HOP_BY_HOP | _named_by_connection(upstream)
    headers = [
        (name, value)
        for name, value in upstream
        if name not in dropped and not name.startswith(_OURS)
    ]
    extra = dict(request.extra_response_headers(state))
    extra["x-kvgate-pod"] = state.name
    headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()]
    return headers
