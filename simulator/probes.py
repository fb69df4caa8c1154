"""What external routers probe on a worker before and while they route to it.

`sglang-router` (SGLang Model Gateway) discovers a worker with `/server_info` and
`/model_info` (falling back to `/get_server_info` and `/get_model_info`), health-checks
`/health` (or `/health_generate`) and reads `/get_load`; `vllm-router` does the same and
tokenizes through `/v1/completions/render` (and `/v1/chat/completions/render`) for its
token-aware policies. The simulated engine answers all of them, with the field names the
real engines use, so either router accepts it as a worker.
"""

from __future__ import annotations

import itertools
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from simulator.engine import SimEngine
from simulator.openai_api import check_model, guarded, prompt_tokens, read_json


def server_info(engine: SimEngine) -> dict[str, Any]:
    """SGLang's `/server_info` subset the routers read (model, parallelism, limits)."""
    config = engine.config
    return {
        "model_path": config.model,
        "served_model_name": config.model,
        "tokenizer_path": None,
        "model_type": "sim",
        "architectures": ["SimForCausalLM"],
        "tp_size": 1,
        "dp_size": 1,
        "load_balance_method": "round_robin",
        "disaggregation_mode": "null",
        "max_batch_size": config.max_batch,
        "max_running_requests": config.max_batch,
        "max_num_reqs": config.max_batch,
        "max_prefill_tokens": config.max_batched_tokens,
        "max_total_num_tokens": config.gpu_blocks * config.block_size,
        "max_model_len": config.max_model_len,
        "page_size": config.block_size,
        "kv_block_size": config.block_size,
        "version": "kvgate-sim",
    }


def model_info(engine: SimEngine) -> dict[str, Any]:
    """SGLang's `/model_info`. No `tokenizer_path`: a router would try to load it."""
    return {
        "model_path": engine.config.model,
        "served_model_name": engine.config.model,
        "tokenizer_path": None,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "sim",
        "architectures": ["SimForCausalLM"],
    }


def probe_routes(engine: SimEngine) -> list[Route]:
    ids = itertools.count()

    async def server(_: Request) -> Response:
        return JSONResponse(server_info(engine))

    async def model(_: Request) -> Response:
        return JSONResponse(model_info(engine))

    async def health_generate(_: Request) -> Response:
        return Response(status_code=200)

    async def get_load(_: Request) -> Response:
        scheduler = engine.scheduler
        running, waiting = len(scheduler.running), len(scheduler.waiting)
        tokens = engine.cache.gpu_used * engine.config.block_size
        load = {
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            "num_tokens": tokens,
        }
        return JSONResponse([load])

    def rendered(body: dict[str, Any], tokens: list[int]) -> dict[str, Any]:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        return {
            "request_id": f"render-{next(ids)}",
            "model": engine.config.model,
            "token_ids": tokens,
            "sampling_params": {"max_tokens": max_tokens},
        }

    async def render_completion(request: Request) -> Response:
        body = await read_json(request)
        check_model(engine, body)
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and _all_prompts(prompt) else [
            prompt
        ]  # fmt: skip
        return JSONResponse(
            [rendered(body, prompt_tokens(engine, {**body, "prompt": p}, chat=False))
             for p in prompts]
        )  # fmt: skip

    async def render_chat(request: Request) -> Response:
        body = await read_json(request)
        check_model(engine, body)
        return JSONResponse(rendered(body, prompt_tokens(engine, body, chat=True)))

    return [
        Route("/server_info", server, methods=["GET"]),
        Route("/get_server_info", server, methods=["GET"]),
        Route("/model_info", model, methods=["GET"]),
        Route("/get_model_info", model, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/get_load", get_load, methods=["GET"]),
        Route("/v1/completions/render", guarded(render_completion), methods=["POST"]),
        Route("/v1/chat/completions/render", guarded(render_chat), methods=["POST"]),
    ]


def _all_prompts(items: list[Any]) -> bool:
    """A batch of prompts (strings or token lists), not one prompt of token ids."""
    return all(isinstance(item, str | list) for item in items)
