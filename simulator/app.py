"""Starlette app factory for one simulated engine; the lifespan starts and stops the engine.

Routes: `/health`, `/v1/models` (the base model and its LoRA adapters, as vLLM lists
them), `/tokenize`, `/detokenize`, `/v1/completions`, `/v1/chat/completions`,
`/v1/responses`, `/v1/embeddings`, `/pooling`, `/score` and `/v1/score`, `/rerank`,
`/v1/rerank` and `/v2/rerank`, `/metrics`, `/load`; flavor vllm adds `/reset_prefix_cache`, flavor
sglang adds `/hicache/pin_blocks`, `/hicache/unpin_blocks` and `/flush_cache` (a vLLM engine
answers 404 there, like a real one); `/sim/cache`, `/sim/stats` and `/sim/faults` inspect
and break things; `probes.py` adds what external routers probe (`/server_info`,
`/model_info`, `/get_load`, `/v1/completions/render`, …).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from simulator.engine import EngineBusyError, SimEngine
from simulator.faults import FaultSpecError
from simulator.openai_api import (
    Handler,
    MidstreamCloseError,
    RequestError,
    check_model,
    error_response,
    guarded,
    handle_generation,
    prompt_tokens,
    read_json,
)
from simulator.pooling_api import embeddings, pooling, rerank, score
from simulator.probes import probe_routes
from simulator.responses_api import responses


class _CutConnections:
    """ASGI middleware: a `MidstreamCloseError` ends the response unfinished, so uvicorn
    drops the connection (one log line) instead of reporting an application error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with contextlib.suppress(MidstreamCloseError):
            await self.app(scope, receive, send)


def _hash_list(body: dict[str, Any]) -> list[Any]:
    hashes = body.get("block_hashes")
    if not isinstance(hashes, list):
        raise RequestError("block_hashes must be a list", param="block_hashes")
    return hashes


def create_app(engine: SimEngine) -> Starlette:
    """The engine's HTTP app; the lifespan owns the engine's start and stop."""

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(_: Request) -> Response:
        card = {
            "id": engine.config.model,
            "object": "model",
            "created": engine.created,
            "owned_by": engine.config.flavor,
            "root": engine.config.model,
            "parent": None,
            "max_model_len": engine.config.max_model_len,
        }
        adapters = [  # vLLM: an adapter's root is its path, its parent the base model
            {"id": name, "object": "model", "created": engine.created,
             "owned_by": engine.config.flavor, "root": f"/adapters/{name}",
             "parent": engine.config.model, "max_model_len": None}
            for name in engine.config.loras
        ]  # fmt: skip
        return JSONResponse({"object": "list", "data": [card, *adapters]})

    async def tokenize(request: Request) -> Response:
        body = await read_json(request)
        check_model(engine, body)
        if engine.config.flavor == "sglang" and "prompt" not in body:
            # SGLang's TokenizeRequest has a `prompt` only: no `messages`, no chat template.
            raise RequestError("prompt: Field required", param="prompt")
        if engine.config.flavor == "sglang":
            body = {key: value for key, value in body.items() if key != "messages"}
        tokens = prompt_tokens(engine, body, chat=False)
        strs = None
        if body.get("return_token_strs"):
            strs = [engine.tokenizer.token_str(t) for t in tokens]
        return JSONResponse(
            {
                "count": len(tokens),
                "max_model_len": engine.config.max_model_len,
                "tokens": tokens,
                "token_strs": strs,
            }
        )

    async def detokenize(request: Request) -> Response:
        body = await read_json(request)
        check_model(engine, body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise RequestError("tokens must be a list of ints", param="tokens")
        return JSONResponse({"prompt": engine.tokenizer.decode(tokens)})

    async def completions(request: Request) -> Response:
        return await handle_generation(engine, request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle_generation(engine, request, chat=True)

    async def metrics(_: Request) -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def load(_: Request) -> Response:
        return JSONResponse(
            {"server_load": len(engine.scheduler.running) + len(engine.scheduler.waiting)}
        )

    async def pin_blocks(request: Request) -> Response:
        count = engine.pin(_hash_list(await read_json(request)))
        return JSONResponse({"pinned_count": count})

    async def unpin_blocks(request: Request) -> Response:
        count = engine.unpin(_hash_list(await read_json(request)))
        engine.scheduler.poke()
        return JSONResponse({"unpinned_count": count})

    async def flush_cache(_: Request) -> Response:
        try:
            engine.flush_cache()
        except EngineBusyError:
            return PlainTextResponse(
                "Cache not flushed: there are running or waiting requests.\n", status_code=400
            )
        return PlainTextResponse("Cache flushed.\n")

    async def reset_prefix_cache(_: Request) -> Response:
        try:
            engine.reset_prefix_cache()
        except EngineBusyError as exc:
            return error_response(f"Failed to reset prefix cache: {exc}", 400)
        return Response(status_code=200)

    async def sim_cache(_: Request) -> Response:
        return JSONResponse(engine.cache_snapshot())

    async def sim_stats(_: Request) -> Response:
        return JSONResponse(engine.stats())

    async def sim_faults(request: Request) -> Response:
        body = await read_json(request)
        try:
            armed = await engine.arm_faults(body)
        except FaultSpecError as exc:
            raise RequestError(str(exc)) from exc
        return JSONResponse({"armed": armed})

    def bound(handler: Callable[[SimEngine, Request], Awaitable[Response]]) -> Handler:
        async def endpoint(request: Request) -> Response:
            return await handler(engine, request)

        return guarded(endpoint)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/tokenize", guarded(tokenize), methods=["POST"]),
        Route("/detokenize", guarded(detokenize), methods=["POST"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route("/v1/responses", bound(responses), methods=["POST"]),
        Route("/v1/embeddings", bound(embeddings), methods=["POST"]),
        Route("/pooling", bound(pooling), methods=["POST"]),
        *(Route(path, bound(score), methods=["POST"]) for path in ("/score", "/v1/score")),
        *(
            Route(path, bound(rerank), methods=["POST"])
            for path in ("/rerank", "/v1/rerank", "/v2/rerank")
        ),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/sim/cache", sim_cache, methods=["GET"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
        Route("/sim/faults", guarded(sim_faults), methods=["POST"]),
        *probe_routes(engine),
    ]
    if engine.config.flavor == "sglang":
        routes += [
            Route("/hicache/pin_blocks", guarded(pin_blocks), methods=["POST"]),
            Route("/hicache/unpin_blocks", guarded(unpin_blocks), methods=["POST"]),
            Route("/flush_cache", flush_cache, methods=["POST", "GET"]),
        ]
    else:
        routes.append(Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    async def not_found(_: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        detail = exc.detail if isinstance(exc, HTTPException) else "Not Found"
        return JSONResponse({"detail": detail}, status_code=status)

    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(_CutConnections)],
        exception_handlers={404: not_found, 405: not_found},
    )
