"""The endpoints external routers (sglang-router, vllm-router) probe on a worker."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from simulator import LatencyModel
from tests.conftest import StartEngine
from tests.helpers import eventually


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_discovery_endpoints_describe_the_engine(
    start_engine: StartEngine, flavor: str
) -> None:
    engine = await start_engine(flavor=flavor, gpu_blocks=300, max_batch=7)
    async with httpx.AsyncClient(base_url=engine.url, timeout=5) as client:
        for path in ("/server_info", "/get_server_info"):
            info = (await client.get(path)).json()
            assert info["served_model_name"] == info["model_path"] == "sim-model"
            assert info["max_running_requests"] == 7
            assert info["max_total_num_tokens"] == 300 * 16 and info["page_size"] == 16
        for path in ("/model_info", "/get_model_info"):
            info = (await client.get(path)).json()
            assert info["model_path"] == "sim-model" and info["is_generation"] is True
            assert info["tokenizer_path"] is None
        assert (await client.get("/health_generate")).status_code == 200


async def test_get_load_counts_running_requests(start_engine: StartEngine) -> None:
    engine = await start_engine(latency=LatencyModel(time_scale=5.0))
    async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
        idle = (await client.get("/get_load")).json()
        assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
        body = {"model": "sim-model", "prompt": "the cache " * 40, "max_tokens": 60}
        busy: list[dict[str, int]] = []

        async def running() -> bool:
            busy[:] = (await client.get("/get_load")).json()
            return busy[0]["num_reqs"] == 1

        generation = asyncio.create_task(client.post("/v1/completions", json=body))
        await eventually(running, what="the request counted in /get_load")
        assert busy[0]["num_tokens"] > 0
        assert (await generation).status_code == 200


async def test_render_returns_the_token_ids_generation_uses(start_engine: StartEngine) -> None:
    engine = await start_engine()
    async with httpx.AsyncClient(base_url=engine.url, timeout=5) as client:
        prompt = "the model and the cache"
        tokens = (await client.post("/tokenize", json={"prompt": prompt})).json()["tokens"]
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 3}
        rendered = (await client.post("/v1/completions/render", json=body)).json()
        assert [r["token_ids"] for r in rendered] == [tokens]
        assert rendered[0]["sampling_params"]["max_tokens"] == 3
        batch = {"model": "sim-model", "prompt": [prompt, "other words"]}
        assert len((await client.post("/v1/completions/render", json=batch)).json()) == 2
        messages = [{"role": "user", "content": "hello"}]
        chat_tokens = (await client.post("/tokenize", json={"messages": messages})).json()
        chat = await client.post(
            "/v1/chat/completions/render", json={"model": "sim-model", "messages": messages}
        )
        assert chat.json()["token_ids"] == chat_tokens["tokens"]
        wrong = await client.post("/v1/completions/render", json={"model": "x", "prompt": "a"})
        assert wrong.status_code == 404
