"""Tokenizing in-process with the model's own files (`KVGATE_TOKENIZER`, `KVGATE_TOKENIZERS`,
the Hugging Face cache): the engine's token ids without asking it, chat routing on
SGLang-only fleets, prompts bounded before anything is tokenized."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.routing.prompt_size import PRIOR_BYTES_PER_TOKEN
from gateway.upstream.local_tokenizer import LocalTokenizers
from gateway.upstream.tokenizer import TokenizeInput
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, SIM_TOKENIZER, StartGateway

SGLANG = {"flavor": "sglang"}
SYSTEM = "You answer questions about the prefix cache of the gateway. " * 12
CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is a radix tree?"},
    {"role": "assistant", "content": "A tree of shared prefixes."},
    {"role": "user", "content": "And a block?"},
]
TOKENIZATIONS = "kvgate_tokenizer_requests_total"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def metric(page: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in page.splitlines():
        if line.startswith(f"{name}{{{wanted}}}"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{wanted}}} not on the page")


async def engine_tokens(engine: EngineServer, body: dict[str, Any]) -> list[int]:
    async with httpx.AsyncClient(base_url=engine.url) as client:
        response = await client.post("/tokenize", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": SYSTEM + "What is a radix tree?"},
        {"prompt": "no special tokens", "add_special_tokens": False},
        {"messages": CHAT},
        {"messages": CHAT, "tools": TOOLS, "add_generation_prompt": False},
    ],
)
async def test_in_process_ids_are_the_engine_s(
    start_engine: StartEngine, body: dict[str, Any]
) -> None:
    engine = await start_engine(name="e0")
    tokenizers = LocalTokenizers(
        directories={MODEL: SIM_TOKENIZER}, hub_cache=None, executor=None, cache_size=4
    )
    loaded = await tokenizers.tokenizer(MODEL)
    assert loaded is not None
    request = {"model": MODEL, **body}
    what = TokenizeInput.for_chat(request) if "messages" in body else (
        TokenizeInput.for_completion(request)
    )  # fmt: skip
    assert isinstance(what, TokenizeInput)
    assert await tokenizers.tokenize(loaded, what) == await engine_tokens(engine, body)
    assert await tokenizers.tokenize(loaded, what) == await engine_tokens(engine, body)
    assert tokenizers.cache.hits == 1


async def test_an_sglang_only_fleet_routes_chat_by_prefix(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=2, engine_overrides=SGLANG)  # KVGATE_TOKENIZERS: the files
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 1}
    async with gw.client() as client:
        first = await client.post("/v1/chat/completions", json=body)
        again = await client.post("/v1/chat/completions", json=body)
        page = (await client.get("/metrics")).text
    assert first.status_code == again.status_code == 200
    assert int(first.headers["x-kvgate-prompt-blocks"]) > 0
    assert again.headers["x-kvgate-pod"] == first.headers["x-kvgate-pod"]
    assert int(again.headers["x-kvgate-cached-blocks"]) > 0
    assert metric(page, "kvgate_tokenizer_requests_total", result="miss", tokenizer="local") == 1
    assert metric(page, "kvgate_tokenizer_requests_total", result="hit", tokenizer="local") == 1
    for result in ("hit", "miss", "failure"):  # no engine was asked
        assert (
            metric(page, "kvgate_tokenizer_requests_total", result=result, tokenizer="remote") == 0
        )


async def test_a_prompt_that_cannot_fit_is_refused_before_any_engine_sees_it(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(
        engines=1, engine_overrides={"max_model_len": 4096}, tokenizers={MODEL: SIM_TOKENIZER}
    )
    huge = "x" * (5 * 1024 * 1024)
    async with gw.client() as client:
        await client.get("/v1/models")  # the gateway has read the engines' max_model_len
        for path, body in (
            ("/v1/completions", {"model": MODEL, "prompt": huge, "max_tokens": 1}),
            ("/v1/chat/completions",
             {"model": MODEL, "messages": [{"role": "user", "content": huge}]}),
        ):  # fmt: skip
            started = time.perf_counter()
            refused = await client.post(path, json=body)
            elapsed = time.perf_counter() - started
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert "maximum context length is 4096 tokens" in error["message"]
            assert error["param"] in ("prompt", "messages")
            assert elapsed < 5.0  # a bound, not the figure: `kvgate bench overhead` has that
        page = (await client.get("/metrics")).text
    async with httpx.AsyncClient(base_url=gw.engines[0].url) as engine:
        stats = (await engine.get("/sim/stats")).json()
    assert stats["scheduler"]["prompt_tokens"] == 0  # nothing reached the engine
    for result in ("hit", "miss", "failure"):
        for where in ("local", "remote"):
            assert (
                metric(page, "kvgate_tokenizer_requests_total", result=result, tokenizer=where) == 0
            )


async def test_local_mode_without_files_routes_on_load(start_gateway: StartGateway) -> None:
    gw = await start_gateway(engines=1, tokenizer="local")  # no KVGATE_TOKENIZERS, no cache
    async with gw.client() as client:
        answer = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 1}
        )
        page = (await client.get("/metrics")).text
    assert answer.status_code == 200
    assert answer.headers["x-kvgate-prompt-blocks"] == "0"
    assert metric(page, "kvgate_tokenizer_requests_total", result="failure", tokenizer="local") == 1
    assert metric(page, "kvgate_tokenizer_requests_total", result="miss", tokenizer="remote") == 0


async def test_auto_finds_the_model_in_the_hugging_face_cache(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    snapshot = tmp_path / "hub" / f"models--{MODEL}" / "snapshots" / "rev1"
    shutil.copytree(SIM_TOKENIZER, snapshot, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    gw = await start_gateway(engines=1, hf_hub_cache=tmp_path / "hub")
    async with gw.client() as client:
        answer = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 1}
        )
        page = (await client.get("/metrics")).text
    assert int(answer.headers["x-kvgate-prompt-blocks"]) > 0
    assert metric(page, "kvgate_tokenizer_requests_total", result="miss", tokenizer="local") == 1


async def test_a_chat_the_template_refuses_is_left_to_the_engine(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1, tokenizers={MODEL: SIM_TOKENIZER})
    body = {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}], "max_tokens": 1}
    async with gw.client() as client:
        answer = await client.post("/v1/chat/completions", json=body)
        page = (await client.get("/metrics")).text
    assert answer.status_code == 400  # the engine's answer, relayed
    assert "wizard" in answer.json()["error"]["message"]
    assert metric(page, "kvgate_tokenizer_requests_total", result="failure", tokenizer="local") == 1


async def test_a_load_only_policy_counts_prompts_in_process_and_never_asks_an_engine(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(
        engines=1, default_policy="round-robin", tokenizers={MODEL: SIM_TOKENIZER}
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    async with gw.client() as client:
        counted = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 1}
        )
        media = await client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "max_tokens": 1,
                  "messages": [{"role": "user", "content": [image]}]},
        )  # fmt: skip
        page = (await client.get("/metrics")).text
    assert counted.status_code == 200
    assert media.status_code == 400  # the engine's answer: a text-only model
    assert counted.headers["x-kvgate-prompt-blocks"] == "0"  # no prefix read: no hashes
    assert metric(page, TOKENIZATIONS, result="miss", tokenizer="local") == 1
    assert metric(page, TOKENIZATIONS, result="failure", tokenizer="local") == 1
    for result in ("hit", "miss", "failure"):  # a count is not worth an engine's call
        assert metric(page, TOKENIZATIONS, result=result, tokenizer="remote") == 0
    assert metric(page, "kvgate_degraded_routing_total", reason="tokenizer") == 0
    exact = gw.state.router.prompt_sizes.bytes_per_token(MODEL, "addr:127.0.0.1")
    assert exact != PRIOR_BYTES_PER_TOKEN  # learned from the exact count
