"""SGLang pods: their /tokenize takes a text prompt only (no chat template), as real SGLang
(>= 0.5) serves it. With `KVGATE_TOKENIZER=remote`, text prompts are tokenized there and
chat prompts need a vLLM tokenizer (AIBRIX_REMOTE_TOKENIZER_ENDPOINT), else route on load
alone, counted. (In-process tokenization: tests/gateway/test_local_tokenizer.py.)"""

from __future__ import annotations

import httpx

from tests.gateway.conftest import MODEL, StartGateway

SGLANG = {"flavor": "sglang"}
TEXT = "a long shared document about routing " * 12
CHAT = [{"role": "user", "content": "a long shared question about routing " * 12}]


async def test_sglang_tokenizes_text_but_refuses_chat_messages(start_gateway: StartGateway) -> None:
    gw = await start_gateway(
        engines=1, engine_overrides=SGLANG, tokenizer="remote", tokenizer_endpoint=None
    )
    async with httpx.AsyncClient(base_url=gw.engines[0].url) as engine:
        text = await engine.post("/tokenize", json={"model": MODEL, "prompt": "hello there"})
        chat = await engine.post("/tokenize", json={"model": MODEL, "messages": CHAT})
    assert text.status_code == 200 and text.json()["tokens"]
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "prompt"
    async with gw.client() as client:
        body = {"model": MODEL, "prompt": TEXT, "max_tokens": 1}
        await client.post("/v1/completions", json=body)
        again = await client.post("/v1/completions", json=body)
        assert int(again.headers["x-kvgate-cached-blocks"]) > 0  # routed by prefix
        routed = await client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "max_tokens": 1}
        )
        page = (await client.get("/metrics")).text
    assert routed.status_code == 200
    assert routed.headers["x-kvgate-prompt-blocks"] == "0"  # on load alone
    assert 'kvgate_degraded_routing_total{reason="tokenizer"} 1.0' in page
    assert 'kvgate_tokenizer_requests_total{result="failure",tokenizer="remote"} 1.0' in page


async def test_a_vllm_tokenizer_endpoint_routes_chat_to_sglang_by_prefix(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=2, engine_overrides=SGLANG, tokenizer="remote")  # + vLLM's
    assert gw.state.settings.tokenizer_endpoint is not None
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 1}
    async with gw.client() as client:
        first = await client.post("/v1/chat/completions", json=body)
        again = await client.post("/v1/chat/completions", json=body)
    assert int(first.headers["x-kvgate-prompt-blocks"]) > 0
    assert again.headers["x-kvgate-pod"] == first.headers["x-kvgate-pod"]
    assert int(again.headers["x-kvgate-cached-blocks"]) > 0
