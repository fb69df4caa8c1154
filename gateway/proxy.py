"""Forwarding a request to the chosen pod and streaming its answer back, byte for byte.

- One shared httpx.AsyncClient (keep-alive pools); bytes are passed on as they arrive.
- Connect failure or a 5xx status before any byte went to the client: retry once on the
  next-best pod. A timeout is not retried (the engine may be working on it): 504.
- After the first byte, an upstream failure cuts the client's connection, as the engine's
  own failure would have.
- A client that disconnects cancels the upstream request (starlette cancels the body
  stream; closing the upstream response closes its connection, and the engine aborts).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import anyio
import httpx
from starlette.responses import StreamingResponse

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.metrics import GatewayMetrics
from gateway.registry import PodState

_REQUEST_HEADERS = ("content-type", "accept", "authorization", "user-agent", "x-request-id")
_HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "date", "server")
)


class UpstreamCut(Exception):
    """The engine failed after the client got bytes: the client's connection is cut."""


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    path: str
    body: bytes
    headers: Mapping[str, str]
    model: str
    policy: str
    extra_response_headers: Callable[[PodState], Mapping[str, str]]
    """Headers naming the decision, for the pod that finally answers."""


class Upstream:
    def __init__(
        self,
        client: httpx.AsyncClient,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._client = client
        self._metrics = metrics
        self._clock = clock

    async def forward(
        self,
        request: ProxyRequest,
        ranking: list[PodState],
        *,
        on_attempt: Callable[[PodState], None] | None = None,
        on_served: Callable[[PodState], None] | None = None,
    ) -> StreamingResponse:
        """Send to ranking[0], or ranking[1] if ranking[0] fails before answering.

        `on_attempt` hears of each pod tried, before the request is sent; `on_served` of the
        pod whose answer goes back to the client."""
        headers = {k: v for k, v in request.headers.items() if k in _REQUEST_HEADERS}
        attempts = ranking[:2]
        for attempt, state in enumerate(attempts):
            last = attempt == len(attempts) - 1
            started = self._clock()
            if on_attempt is not None:
                on_attempt(state)
            self._acquire(state)
            upstream_request = self._client.build_request(
                "POST", f"{state.pod.url}{request.path}", content=request.body, headers=headers
            )
            try:
                response = await self._client.send(upstream_request, stream=True)
            except httpx.TimeoutException:
                self._release(state, request, "504")
                self._metrics.upstream_errors.labels(state.name, "timeout").inc()
                raise UpstreamTimeout(f"pod {state.name} did not answer in time") from None
            except httpx.HTTPError as exc:
                self._release(state, request, "502")
                self._metrics.upstream_errors.labels(state.name, "connect").inc()
                if last:
                    raise UpstreamError(f"pod {state.name} could not be reached: {exc!r}") from None
                self._metrics.retries.labels(state.name).inc()
                continue
            if response.status_code >= 500 and not last:
                await response.aclose()
                self._release(state, request, str(response.status_code))
                self._metrics.upstream_errors.labels(state.name, "status_5xx").inc()
                self._metrics.retries.labels(state.name).inc()
                continue
            if on_served is not None:
                on_served(state)
            return StreamingResponse(
                self._relay(response, state, request, started),
                status_code=response.status_code,
                headers=_response_headers(response, state, request),
            )
        raise UpstreamError("no pod could take the request")  # pragma: no cover - ranking empty

    async def _relay(
        self,
        response: httpx.Response,
        state: PodState,
        request: ProxyRequest,
        started: float,
    ) -> AsyncIterator[bytes]:
        first = True
        outcome = str(response.status_code)
        try:
            async for chunk in response.aiter_raw():
                if first:
                    self._metrics.ttft.labels(state.name).observe(self._clock() - started)
                    first = False
                yield chunk
        except httpx.HTTPError as exc:
            outcome = "cut"
            self._metrics.upstream_errors.labels(state.name, "midstream").inc()
            raise UpstreamCut(f"pod {state.name} failed mid-response: {exc!r}") from exc
        except BaseException:
            outcome = "client_disconnect"
            raise
        finally:
            self._release(state, request, outcome)
            with anyio.CancelScope(shield=True):  # cleanup even when the client went away
                await response.aclose()

    def _acquire(self, state: PodState) -> None:
        state.inflight += 1
        self._metrics.inflight.labels(state.name).inc()

    def _release(self, state: PodState, request: ProxyRequest, status: str) -> None:
        state.inflight -= 1
        self._metrics.inflight.labels(state.name).dec()
        self._metrics.requests.labels(request.model, state.name, request.policy, status).inc()


def _response_headers(
    response: httpx.Response, state: PodState, request: ProxyRequest
) -> dict[str, str]:
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_BY_HOP}
    headers.update(request.extra_response_headers(state))
    headers["x-kvgate-pod"] = state.name
    return headers
