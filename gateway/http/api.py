"""The OpenAI-compatible generation endpoints, /health, /ready and /metrics (the engines'
other endpoints and /v1/models: `gateway.http.passthrough`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import xxhash
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.control.pinning.session import PIN_HEADER, PIN_TOKEN_HEADER, session_pin_hook
from gateway.control.registry import PodState
from gateway.errors import (
    BadRequest,
    ClientClosed,
    GatewayError,
    PayloadTooLarge,
    RequestTimeout,
    refusal,
)
from gateway.http.protocol import BODY_RECEIVED
from gateway.routing.router import Kind, Routed
from gateway.state import GatewayState, state_of
from gateway.upstream.proxy import ClientWatch, ProxyRequest
from gateway.upstream.tokenizer import is_token_ids
from gateway.upstream.usage import UsageMeter
from subscriber import Phase

POLICY_HEADERS = ("x-kvgate-policy", "routing-strategy")
SLO_TTFT_HEADER = "x-slo-ttft-ms"
SLO_TPOT_HEADER = "x-slo-tpot-ms"
_POLICY_HEADERS = tuple(name.encode("latin-1") for name in POLICY_HEADERS)
_PIN_HEADER = PIN_HEADER.encode("latin-1")
_PIN_TOKEN_HEADER = PIN_TOKEN_HEADER.encode("latin-1")
_SLO_HEADERS = {name: name.encode("latin-1") for name in (SLO_TTFT_HEADER, SLO_TPOT_HEADER)}


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
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # json's C decoder recurses per nesting level
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if _ESCAPED_SURROGATE.search(raw):
        _check_unicode(body)
    return raw, body


# JSON may escape a UTF-16 surrogate (\ud800-\udfff); paired ones decode to one code point,
# a lone one stays a surrogate that no UTF-8 encoder (the tokenizer's, the engine's) accepts.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")


def _check_unicode(body: dict[str, Any]) -> None:
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(
            "request body contains a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode"
        ) from None


def validate(kind: Kind, body: dict[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required and must be a non-empty string", param="model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("`stream` must be a boolean", param="stream")
    if kind == "chat":
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(message, dict) for message in messages)
        ):
            raise BadRequest("`messages` must be a non-empty list of objects", param="messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise BadRequest(
                "`prompt` must be a string, a list of strings or a list of token ids",
                param="prompt",
            )
        if isinstance(prompt, list):
            _check_prompt_list(prompt)


def _check_prompt_list(prompt: list[Any]) -> None:
    """A list prompt is strings, token ids, or lists of token ids."""
    if all(isinstance(item, str) for item in prompt) or is_token_ids(prompt):
        return
    if all(isinstance(item, list) and item and is_token_ids(item) for item in prompt):
        return
    raise BadRequest(
        "`prompt` must be a string, a list of strings, or token ids (integers in [0, 2**32), "
        "not booleans), or a list of lists of them",
        param="prompt",
    )


def first_values(request: Request) -> dict[bytes, bytes]:
    """Each request header's first value by its (lower-case) name, what starlette's
    `Headers.get` finds: one pass instead of a scan (and a KeyError) per lookup."""
    return dict(reversed(request.scope["headers"]))


def _header(headers: Mapping[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def client_key(request: Request, headers: Mapping[bytes, bytes]) -> str:
    """Who sent a request, for what is learned per client: its credentials (hashed, never
    kept) where it sends any, else its address."""
    credentials = headers.get(b"authorization")
    if credentials:
        return "key:" + xxhash.xxh64_hexdigest(credentials)
    peer = request.client
    return "addr:" + (peer.host if peer is not None else "")


def requested_policy(request: Request, headers: Mapping[bytes, bytes] | None = None) -> str | None:
    headers = first_values(request) if headers is None else headers
    for header in _POLICY_HEADERS:
        value = headers.get(header)
        if value:
            return value.decode("latin-1")
    return None


async def _generate(request: Request, kind: Kind, path: str) -> Response:
    gateway = state_of(request)
    settings = gateway.settings
    raw, body = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
    arrived = time.perf_counter()
    validate(kind, body)
    headers = first_values(request)
    profile = gateway.router.policy(requested_policy(request, headers))
    session = _header(headers, settings.session_header.encode("latin-1"))
    routed = await gateway.router.route(
        kind, body, profile, session=session, slo_ttft_s=slo_ttft(request, headers),
        slo_tpot_s=slo_tpot(request, headers), body_bytes=len(raw),
        client=client_key(request, headers),
    )  # fmt: skip
    pin_turn = session_pin_hook(gateway, _header(headers, _PIN_HEADER),
                                _header(headers, _PIN_TOKEN_HEADER), kind, body, routed,
                                session)  # fmt: skip
    proxy_request = ProxyRequest(  # the client's own bytes go upstream, unchanged
        path=path,
        body=raw,
        headers=request.headers.raw,
        model=body["model"],
        policy=profile.name,
        extra_response_headers=lambda state: _decision_headers(routed, state),
    )
    router = gateway.router
    first = routed.decision.ranking[0]

    def on_attempt(state: PodState) -> None:
        if state is not first:  # a retry: the blocks and the prefill go to this pod instead
            router.dispatch(routed, state)

    model_metrics = gateway.metrics.http
    model = body["model"]
    meter = UsageMeter()
    served_status = 0

    def on_first_byte(state: PodState) -> None:
        router.first_byte(routed, state)
        model_metrics.model_ttft.labels(model).observe(time.perf_counter() - arrived)

    def on_done() -> None:
        model_metrics.model_duration.labels(model).observe(time.perf_counter() - arrived)
        if not 200 <= served_status < 300:
            router.finish(routed)
            return
        known = routed.request.prompt_tokens if routed.request.prompt_tokenized else None
        usage = meter.usage(known)
        engine_prompt = usage.prompt_tokens if usage.source == "engine" else None
        router.finish(routed, usage.completion_tokens, engine_prompt)
        if usage.prompt_tokens is not None:
            model_metrics.prompt_tokens.labels(model, usage.source).inc(usage.prompt_tokens)
        model_metrics.completion_tokens.labels(model, usage.source).inc(usage.completion_tokens)

    def on_served(state: PodState, status: int) -> None:
        nonlocal served_status
        served_status = status
        router.record_served(routed, state)
        if pin_turn is not None and 200 <= status < 300:  # x-kvgate-pin: pin it there
            pin_turn(state)

    try:
        return await gateway.upstream.forward(  # type: ignore[return-value]  # ASGI response
            proxy_request,
            routed.decision.ranking,
            ClientWatch.of(request.scope, request.receive),
            on_attempt=on_attempt,
            on_served=on_served,
            on_first_byte=on_first_byte,
            on_done=on_done,
            meter=meter,
        )
    except BaseException:
        on_done()
        raise


def slo_ttft(request: Request, headers: Mapping[bytes, bytes] | None = None) -> float | None:
    """The client's TTFT objective in seconds (`x-slo-ttft-ms`), or None."""
    return _objective(request, headers, SLO_TTFT_HEADER)


def slo_tpot(request: Request, headers: Mapping[bytes, bytes] | None = None) -> float | None:
    """The client's time-per-output-token objective in seconds (`x-slo-tpot-ms`), or None."""
    return _objective(request, headers, SLO_TPOT_HEADER)


def _objective(request: Request, headers: Mapping[bytes, bytes] | None, name: str) -> float | None:
    raw = _header(first_values(request) if headers is None else headers, _SLO_HEADERS[name])
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise BadRequest(f"{name} must be a positive number of milliseconds", param=name)
    return value / 1e3


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
