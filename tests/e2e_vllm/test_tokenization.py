"""kvgate's in-process tokenization against a real vLLM: the same token ids as vLLM's own
`/tokenize`, and as its `/v1/chat/completions` renders, for text prompts and chats
(multi-turn, a system prompt, tools and tool calls, content parts, the developer role,
continuing the final message). The tiny model's files are what kvgate loads
(`KVGATE_TOKENIZERS=tiny=<its directory>`)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http.server import GatewayServer
from gateway.settings import Settings
from gateway.upstream.local_tokenizer import LocalTokenizers
from gateway.upstream.tokenizer import TokenizeInput
from tests.e2e_vllm.conftest import MODEL_NAME, RealVllm
from tests.e2e_vllm.traffic import system_prompt
from tokenization import ModelTokenizer

pytestmark = pytest.mark.e2e_vllm
JSON_HEADERS = {"content-type": "application/json"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find a block in the prefix cache.",
            "parameters": {
                "type": "object",
                "properties": {"hash": {"type": "string", "description": "the block hash"}},
                "required": ["hash"],
            },
        },
    },
    {"type": "function", "function": {"name": "evict", "strict": True}},
]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "lookup", "arguments": '{"hash": "ab12", "depth": 3}'}}  # fmt: skip
TEXTS = (
    "the prefix cache",
    system_prompt(1) + "What is a radix tree?",
    "Ünïcode — 日本語 text, emoji 🙂, tabs\tand\nnewlines  with  spaces.",
    "<s> a special token written as text </s>",
)
CHATS: tuple[dict[str, Any], ...] = (
    {"messages": [{"role": "user", "content": "What is a radix tree?"}]},
    {
        "messages": [
            {"role": "system", "content": system_prompt(2)},
            {"role": "user", "content": "How does a gateway pick a pod?"},
            {"role": "assistant", "content": "By the longest cached prefix."},
            {"role": "user", "content": "And when none holds it?"},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "You look things up."},
            {"role": "user", "content": "Find block ab12."},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found on pod 3"},
        ],
        "tools": TOOLS,
    },
    {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "part one"}, "part two"]},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Complete this:"},
            {"role": "assistant", "content": "The cache holds"},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
    {"messages": [{"role": "user", "content": "with BOS"}], "add_special_tokens": True},
)


@pytest.fixture
async def client(vllm: RealVllm) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=vllm.base_url, timeout=300.0) as http:
        yield http


async def vllm_tokens(client: httpx.AsyncClient, body: dict[str, Any]) -> list[int]:
    response = await client.post("/tokenize", json={"model": MODEL_NAME, **body})
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("special", [True, False])
async def test_text_prompts_tokenize_as_vllm_does(
    vllm: RealVllm, client: httpx.AsyncClient, text: str, special: bool
) -> None:
    local = ModelTokenizer.load(vllm.model_dir)
    body = {"prompt": text, "add_special_tokens": special}
    assert local.encode(text, add_special_tokens=special) == await vllm_tokens(client, body)


@pytest.mark.parametrize("request_fields", CHATS, ids=range(len(CHATS)))
async def test_chats_tokenize_as_vllm_does(
    vllm: RealVllm, client: httpx.AsyncClient, request_fields: dict[str, Any]
) -> None:
    local = ModelTokenizer.load(vllm.model_dir)
    expected = await vllm_tokens(client, request_fields)
    assert local.encode_chat(request_fields, completions=False) == expected
    # what the gateway computes for a /v1/chat/completions body (cached, off-loop for long
    # prompts): the ids the engine generates from, as it reports them
    tokenizers = LocalTokenizers(
        directories={MODEL_NAME: vllm.model_dir}, hub_cache=None, executor=None, cache_size=8
    )
    loaded = await tokenizers.tokenizer(MODEL_NAME)
    assert loaded is not None
    body = {"model": MODEL_NAME, "max_tokens": 1, "return_token_ids": True, **request_fields}
    if "tools" in body:  # offered, not called: no tool parser is configured
        body["tool_choice"] = "none"
    ours = await tokenizers.tokenize(loaded, TokenizeInput.for_chat(body))
    answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert ours == answer.json()["prompt_token_ids"]


@pytest.mark.parametrize("tokenizer", ["local", "remote"])
async def test_a_prompt_too_long_for_the_model_through_kvgate(
    vllm: RealVllm, tmp_path: Path, e2e_report: dict[str, object], tokenizer: str
) -> None:
    """A 5 MiB prompt to the 2,048-token model through kvgate: tokenized in-process, the
    gateway refuses it before anything is tokenized; remotely, it never sends it to
    /tokenize (the engine refuses it by its own character bound). Both a 400."""
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [
        {"name": "vllm-0", "url": vllm.base_url, "model": MODEL_NAME},
    ]}))  # fmt: skip
    settings = Settings(
        pods_file=pods, tokenizer=tokenizer, tokenizers={MODEL_NAME: vllm.model_dir},
        kv_event_sync=False,
    )  # fmt: skip
    app = create_app(settings, metrics_registry=CollectorRegistry())
    server = GatewayServer(app)
    await server.start()
    try:
        body = {"model": MODEL_NAME, "prompt": "x" * (5 * 1024 * 1024), "max_tokens": 1}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            await client.get("/v1/models")  # the gateway has read the engine's max_model_len
            warm = {"model": MODEL_NAME, "prompt": "the prefix cache", "max_tokens": 1}
            assert (await client.post("/v1/completions", json=warm)).status_code == 200
            raw = json.dumps(body).encode()  # the client's own cost is not the gateway's
            started = time.perf_counter()
            answer = await client.post(
                "/v1/completions", content=raw, headers=JSON_HEADERS, timeout=60
            )
            elapsed = time.perf_counter() - started
            page = (await client.get("/metrics")).text
    finally:
        await server.stop()
    assert answer.status_code == 400, answer.text
    assert "maximum context length is 2048 tokens" in answer.json()["error"]["message"]
    # /tokenize was never asked (the warm-up prompt was, in remote mode)
    assert 'result="miss",tokenizer="remote"} ' + ("0.0" if tokenizer == "local" else "1.0") in page
    e2e_report[f"5 MiB prompt through kvgate, {tokenizer} tokenizer: 400 in (ms)"] = round(
        elapsed * 1e3, 1
    )
