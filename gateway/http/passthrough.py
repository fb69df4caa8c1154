"""The engines' other endpoints, relayed as they are: embeddings, responses, tokenize,
detokenize, rerank, score and pooling; `/v1/models` and `/v1/models/{id}` from the engines'
own model cards (`gateway.upstream.model_catalog`).

Each POST is read under the chat endpoints' limits (body size and time, the concurrency
middleware), routed among the pods serving the body's `model` by the request's policy
(`x-kvgate-policy`) with no prompt known, and forwarded through the same upstream path
(retry before the first byte, cut after it, the same counters, errors and
`x-kvgate-pod`). The engine's answer, streamed or not, goes back byte for byte. A
`/v1/responses` request whose input is text or messages is routed like the chat request it
is (prefix affinity, cost model); any other input routes on load. `model` may be left out
(as vLLM allows) when the gateway serves exactly one model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.control.registry import PodState
from gateway.errors import BadRequest, ModelNotFound, NoRoutablePod, clip
from gateway.http.api import read_json, requested_policy, slo_tpot, slo_ttft
from gateway.routing import RoutingProfile, RoutingRequest
from gateway.routing.routed import Routed
from gateway.state import GatewayState, state_of
from gateway.upstream.proxy import ClientWatch, ProxyRequest

PATHS = (
    "/v1/embeddings",
    "/v1/responses",
    "/tokenize",
    "/detokenize",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/v1/score",
    "/score",
    "/pooling",
)
_BODY_BYTES_PER_TOKEN = 4


def model_of(gateway: GatewayState, body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        served = gateway.registry.models()
        if len(served) == 1:
            return served[0]
        raise BadRequest("`model` is required: this gateway serves several", param="model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` must be a non-empty string", param="model")
    return model


def chat_body(model: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A `/v1/responses` body as the chat request the engine renders it into, or None when
    its input is not plain text or messages."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list) and value:
        for item in value:
            if not isinstance(item, Mapping) or item.get("type", "message") != "message":
                return None
            content = item.get("content")
            if isinstance(content, list):
                parts = [p.get("text") for p in content if isinstance(p, Mapping)]
                texts = [text for text in parts if isinstance(text, str)]
                if len(texts) != len(content):
                    return None
                content = "".join(texts)
            if not isinstance(content, str) or not isinstance(item.get("role"), str):
                return None
            messages.append({"role": item["role"], "content": content})
    else:
        return None
    return {"model": model, "messages": messages, "stream": bool(body.get("stream"))}


async def relay(request: Request) -> Response:
    gateway = state_of(request)
    settings = gateway.settings
    raw, body = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
    model = model_of(gateway, body)
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("`stream` must be a boolean", param="stream")
    profile = gateway.router.policy(requested_policy(request))
    session = request.headers.get(settings.session_header)
    path = request.url.path
    chat = chat_body(model, body) if path == "/v1/responses" else None
    if chat is not None:
        router = gateway.router
        routed = await router.route("chat", chat, profile, session=session,
                                    slo_ttft_s=slo_ttft(request), slo_tpot_s=slo_tpot(request),
                                    body_bytes=len(raw))  # fmt: skip
        return await _forward(request, gateway, raw, model, profile, routed)
    ranking = _rank(gateway, model, profile, session, len(raw), bool(body.get("stream")))
    return await _forward(request, gateway, raw, model, profile, ranking)


def _rank(
    gateway: GatewayState,
    model: str,
    profile: RoutingProfile,
    session: str | None,
    body_bytes: int,
    streamed: bool,
) -> list[PodState]:
    """The pods serving `model`, ranked by `profile` with no prompt known (load alone)."""
    serving = gateway.registry.serving(model)
    if not serving:
        raise ModelNotFound(f"The model `{clip(model)}` does not exist.", param="model")
    routable, routable_names = gateway.registry.routable_serving(model)
    request = RoutingRequest(model, gateway.registry.context(model), 0, None, session,
                             prompt_tokens=body_bytes // _BODY_BYTES_PER_TOKEN,
                             streamed=streamed, candidates=serving, routable=routable,
                             routable_names=routable_names)  # fmt: skip
    decision = profile.decide(request, serving)
    if not decision.ranking:
        raise NoRoutablePod(f"no routable pod for model `{clip(model)}` right now")
    return decision.ranking


async def _forward(
    request: Request,
    gateway: GatewayState,
    raw: bytes,
    model: str,
    profile: RoutingProfile,
    target: Routed | list[PodState],
) -> Response:
    """Forward through the upstream path; a `Routed` request also keeps the router's
    books (expected blocks, cost model, served counters) as a chat request does."""
    path = request.url.path
    if request.url.query:
        path += "?" + request.url.query
    routed = target if isinstance(target, Routed) else None

    def headers(state: PodState) -> Mapping[str, str]:
        if routed is None:
            return {"x-kvgate-policy": profile.name}
        return {"x-kvgate-policy": profile.name,
                "x-kvgate-prompt-blocks": str(routed.request.prompt_blocks),
                "x-kvgate-cached-blocks": str(routed.matched_blocks(state.name))}  # fmt: skip

    proxy_request = ProxyRequest(path=path, body=raw, headers=request.headers.raw, model=model,
                                 policy=profile.name, extra_response_headers=headers)  # fmt: skip
    if routed is None:
        assert isinstance(target, list)
        response = await gateway.upstream.forward(
            proxy_request, target, ClientWatch.of(request.scope, request.receive)
        )
        return response  # type: ignore[return-value]  # an ASGI response
    router = gateway.router
    first = routed.decision.ranking[0]

    def on_attempt(state: PodState) -> None:
        if state is not first:
            router.dispatch(routed, state)

    try:
        response = await gateway.upstream.forward(
            proxy_request,
            routed.decision.ranking,
            ClientWatch.of(request.scope, request.receive),
            on_attempt=on_attempt,
            on_served=lambda state, _status: router.record_served(routed, state),
            on_first_byte=lambda state: router.first_byte(routed, state),
            on_done=lambda: router.finish(routed),
        )
    except BaseException:
        router.finish(routed)
        raise
    return response  # type: ignore[return-value]  # an ASGI response


async def models(request: Request) -> Response:
    gateway = state_of(request)
    data = await gateway.models.cards()
    return JSONResponse({"object": "list", "data": data})


async def model(request: Request) -> Response:
    gateway = state_of(request)
    name = request.path_params["model"]
    cards = await gateway.models.cards()
    for card in cards:
        if card["id"] == name:
            return JSONResponse(card)
    raise ModelNotFound(f"The model `{clip(name)}` does not exist.", param="model")


routes = [
    *(Route(path, relay, methods=["POST"]) for path in PATHS),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
]
