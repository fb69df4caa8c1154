"""The OpenAI-compatible generation endpoints, /health, /ready and /metrics (the engines'
other endpoints and /v1/models: `gateway.http.passthrough`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.control.registry import PodState
from gateway.errors import (
    ClientClosed,
    GatewayError,
    PayloadTooLarge,
    RequestTimeout,
    refusal,
)
from gateway.http import turn
from gateway.http.protocol import BODY_RECEIVED
from gateway.http.turn import (
    SLO_TPOT_HEADER,
    SLO_TTFT_HEADER,
    Turn,
    parse_json,
)
from gateway.routing.routed import Routed
from gateway.routing.router import Kind
from gateway.state import GatewayState, state_of
from gateway.upstream.proxy import ClientWatch, ProxyRequest
from subscriber import Phase


async def read_json(
    request: Request, limit: int, timeout_s: float | None = None
) -> tuple[bytes, dict[str, Any]]:
    """The request body, raw and as a JSON object, refusing more than `limit` bytes (413)
    and a body not received within `timeout_s` (408: a slow-loris client holds no slot).
    A body the server already holds whole (`BODY_RECEIVED`) is read without a deadline:
    the deadline costs more than the read (~10 µs)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    receive = request.receive  # as `request.stream()` reads it, without an async generator
    received = request.scope.get("extensions", {}).get(BODY_RECEIVED, False)
    try:
        async with contextlib.nullcontext() if received else asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                if message["type"] != "http.request":
                    continue
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {timeout_s} s") from None
    except ClientDisconnect:
        raise ClientClosed("the client closed the connection before sending its body") from None
    raw = b"".join(chunks)
    return raw, parse_json(raw)


def first_values(request: Request) -> dict[bytes, bytes]:
    """Each request header's first value by its (lower-case) name, what starlette's
    `Headers.get` finds: one pass instead of a scan (and a KeyError) per lookup."""
    return dict(reversed(request.scope["headers"]))


def peer_of(request: Request) -> str:
    """The client's address (as `ForwardedClients` set it where proxies are trusted)."""
    peer = request.client
    return peer.host if peer is not None else ""


def client_key(request: Request, headers: Mapping[bytes, bytes]) -> str:
    """Who sent a request (`gateway.http.turn.client_key`)."""
    return turn.client_key(headers, peer_of(request))


def requested_policy(request: Request, headers: Mapping[bytes, bytes] | None = None) -> str | None:
    return turn.policy_named(first_values(request) if headers is None else headers)


async def _generate(request: Request, kind: Kind, path: str) -> Response:
    gateway = state_of(request)
    settings = gateway.settings
    raw, body = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
    arrived = time.perf_counter()
    headers = first_values(request)
    decided = await Turn.decide(gateway, kind, raw, body, headers,
                                peer=peer_of(request), arrived=arrived)  # fmt: skip
    routed = decided.routed
    proxy_request = ProxyRequest(  # the client's own bytes go upstream, unchanged
        path=path,
        body=raw,
        headers=request.headers.raw,
        model=decided.model,
        policy=decided.profile.name,
        extra_response_headers=lambda state: _decision_headers(routed, state),
    )
    try:
        return await gateway.upstream.forward(  # type: ignore[return-value]  # ASGI response
            proxy_request,
            routed.decision.ranking,
            ClientWatch.of(request.scope, request.receive),
            on_attempt=decided.on_attempt,
            on_served=decided.on_served,
            on_first_byte=decided.on_first_byte,
            on_done=decided.on_done,
            meter=decided.meter,
        )
    except BaseException:
        decided.on_done()
        raise


def slo_ttft(request: Request, headers: Mapping[bytes, bytes] | None = None) -> float | None:
    """The client's TTFT objective in seconds (`x-slo-ttft-ms`), or None."""
    return turn.objective(first_values(request) if headers is None else headers, SLO_TTFT_HEADER)


def slo_tpot(request: Request, headers: Mapping[bytes, bytes] | None = None) -> float | None:
    """The client's time-per-output-token objective in seconds (`x-slo-tpot-ms`), or None."""
    return turn.objective(first_values(request) if headers is None else headers, SLO_TPOT_HEADER)


def _decision_headers(routed: Routed, state: PodState) -> dict[str, str]:
    headers = {
        "x-kvgate-policy": routed.decision.policy,
        "x-kvgate-prompt-blocks": str(routed.request.prompt_blocks),
        "x-kvgate-cached-blocks": str(routed.matched_blocks(state.name)),
    }
    ticket = routed.ticket
    if ticket is not None and ticket.pod == state.name:
        headers["x-kvgate-predicted-ttft-ms"] = f"{ticket.prediction.ttft_s * 1e3:.2f}"
        if ticket.tpot is not None:
            headers["x-kvgate-predicted-tpot-ms"] = f"{ticket.tpot.tpot_s * 1e3:.2f}"
    return headers


class Generation:
    """The ASGI endpoint of a generation route. It answers its own refusals (a
    `GatewayError` before the answer starts, counted as the app's handler counts them), so
    it needs no framework around it: `GenerationLane` calls it directly. An error once the
    relay has started propagates (the connection is cut)."""

    def __init__(self, kind: Kind, path: str) -> None:
        self.kind: Kind = kind
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await _generate(request, self.kind, self.path)
        except GatewayError as error:
            response = refusal(error, state_of(request).metrics.http)
        await response(scope, receive, send)


chat_completions = Generation("chat", "/v1/chat/completions")
completions = Generation("completion", "/v1/completions")


class GenerationLane:
    """A POST to a generation route goes straight to its endpoint; every other request to
    the starlette app. The generation routes are the gateway's traffic, and starlette's
    per-request layers (two error middlewares, route matching) cost CPU on every one of
    them for nothing these endpoints use (`kvgate bench overhead`).

    What they would have given is kept: `scope["app"]` (the gateway's state is found
    through it), refusals answered in OpenAI's shape and counted (`Generation`), and an
    unexpected error answered 500 by the server, as starlette's outermost middleware does.
    A generation path asked with another method still gets starlette's 405."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self._endpoints = {each.path: each for each in (chat_completions, completions)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoints.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        await endpoint(scope, receive, send)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def readiness(gateway: GatewayState) -> tuple[bool, str]:
    if not gateway.discovery_ready.is_set():
        return False, "discovery has not reported the pods yet"
    down = gateway.background.down
    if "discovery" in down:
        return False, "discovery failed and is restarting: the pod list may be stale"
    routable = gateway.registry.routable()
    for state in routable:  # a starting engine must not hold us back
        status = gateway.registry.subscriber_status(state.name)
        if status is not None and status.phase is Phase.STARTING:
            return False, f"subscriber of {state.name} is starting"
    if not routable:
        # Still ready: out of its Service, the gateway would leave clients with connection
        # errors; in it, each request gets 503 + Retry-After until an engine is back.
        return True, "ready; no routable engine (requests get 503 + Retry-After)"
    return True, "ready"


async def ready(request: Request) -> Response:
    ok, reason = readiness(state_of(request))
    return JSONResponse({"ready": ok, "reason": reason}, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    registry = state_of(request).metrics.prometheus
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
