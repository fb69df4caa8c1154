"""The engine's HTTP API through real clients: the openai SDK and httpx."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from simulator import LatencyModel
from simulator.tokenizer import SimTokenizer
from tests.conftest import StartEngine
from tests.helpers import eventually

SYSTEM = "You are a helpful assistant for the golden capture. " * 8
BOS = SimTokenizer.load().model.token_id("<s>")


@pytest.fixture
async def engine_url(start_engine: StartEngine) -> str:
    return (await start_engine()).url


async def openai_client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)


async def test_completions_with_the_openai_sdk(engine_url: str) -> None:
    async with await openai_client(engine_url) as client:
        first = await client.completions.create(
            model="sim-model", prompt=SYSTEM + "Q1", max_tokens=4
        )
        assert first.choices[0].finish_reason == "length" and first.choices[0].text
        assert first.usage is not None and first.usage.completion_tokens == 4
        again = await client.completions.create(
            model="sim-model", prompt=SYSTEM + "Q2", max_tokens=4
        )
        details = again.usage.prompt_tokens_details  # type: ignore[union-attr]
        assert details is not None and details.cached_tokens and details.cached_tokens > 0
        assert details.cached_tokens % 16 == 0


async def test_chat_streaming_with_usage(engine_url: str) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hi"},
    ]
    async with await openai_client(engine_url) as client:
        stream = await client.chat.completions.create(
            model="sim-model",
            messages=messages,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
        assert text and usage is not None and usage.completion_tokens == 5
        assert chunks[0].choices[0].delta.role == "assistant"
        second = await client.chat.completions.create(
            model="sim-model",
            messages=messages,
            max_tokens=2,
        )
        assert second.choices[0].message.content
        cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        assert cached and cached > 0


async def test_sse_ends_with_done(engine_url: str) -> None:
    body = {"model": "sim-model", "prompt": "hello", "max_tokens": 3, "stream": True}
    async with (
        httpx.AsyncClient(base_url=engine_url, timeout=10) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) == 4


async def test_tokenize_matches_generation_and_vllm_shapes(engine_url: str) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(base_url=engine_url, timeout=10) as client:
        tok = (
            await client.post("/tokenize", json={"model": "sim-model", "messages": messages})
        ).json()
        assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
        assert tok["count"] == len(tok["tokens"]) and tok["token_strs"] is None
        chat = await client.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}
        )
        assert chat.json()["usage"]["prompt_tokens"] == tok["count"]
        plain = (await client.post("/tokenize", json={"prompt": "def hello(): return 42"})).json()
        bare = await client.post(
            "/tokenize", json={"prompt": "def hello(): return 42", "add_special_tokens": False}
        )
        assert plain["tokens"][0] == BOS and plain["tokens"][1:] == bare.json()["tokens"]
        strs = await client.post(
            "/tokenize", json={"prompt": "def hello", "return_token_strs": True}
        )
        assert strs.json()["token_strs"][0] == "<s>"
        detok = await client.post(
            "/detokenize", json={"model": "sim-model", "tokens": plain["tokens"]}
        )
        assert detok.json() == {"prompt": "<s>def hello(): return 42"}
        wrong = await client.post("/tokenize", json={"model": "nope", "prompt": "x"})
        assert wrong.status_code == 404
        assert wrong.json()["error"] == {
            "message": "The model `nope` does not exist. Valid aliases: sim-model.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }


async def test_chats_the_template_refuses_get_vllms_400(engine_url: str) -> None:
    wizard = [{"role": "wizard", "content": "x"}]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    refused = [
        ("/v1/chat/completions", {"messages": wizard, "max_tokens": 1}, "unknown message role"),
        ("/tokenize", {"messages": wizard}, "unknown message role: wizard"),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 1}, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": [image]}]}, "image_url"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "add_generation_prompt": "yes"}, "add_generation_prompt"),
    ]  # fmt: skip
    async with httpx.AsyncClient(base_url=engine_url, timeout=10) as client:
        for path, body, says in refused:
            response = await client.post(path, json=body)
            assert response.status_code == 400, (path, body)
            error = response.json()["error"]
            assert error["type"] == "BadRequestError" and error["code"] == 400
            assert says in error["message"], (says, error)
        stats = (await client.get("/sim/stats")).json()
    assert stats["scheduler"]["prompt_tokens"] == 0  # nothing refused reached the engine


async def test_sglang_tokenizes_a_prompt_only(start_engine: StartEngine) -> None:
    """SGLang's /tokenize takes no `messages` (no chat template): without a prompt it is
    refused, with one the messages are ignored."""
    server = await start_engine(flavor="sglang")
    messages = [{"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        refused = await client.post("/tokenize", json={"messages": messages})
        assert refused.status_code == 400 and "prompt" in refused.json()["error"]["message"]
        both = await client.post("/tokenize", json={"prompt": "hi", "messages": messages})
        alone = await client.post("/tokenize", json={"prompt": "hi"})
    assert both.json()["tokens"] == alone.json()["tokens"] == server.engine.tokenizer.encode("hi")


async def test_health_models_metrics(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=10) as client:
        health = await client.get("/health")
        assert health.status_code == 200 and health.content == b""
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["id"] == "sim-model"
        await client.post("/v1/completions", json={"prompt": SYSTEM, "max_tokens": 1})
        await client.post("/v1/completions", json={"prompt": SYSTEM, "max_tokens": 1})
        page = (await client.get("/metrics")).text
    for name in (
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        'vllm:cache_config_info{block_size="16"',
    ):
        assert name in page, name
    hits = next(x for x in page.splitlines() if x.startswith("vllm:prefix_cache_hits_total"))
    assert float(hits.rsplit(" ", 1)[1]) > 0


async def test_vllm_flavor_has_no_pin_endpoints(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=10) as client:
        for path in ("/hicache/pin_blocks", "/hicache/unpin_blocks", "/flush_cache"):
            response = await client.post(path, json={"block_hashes": [1]})
            assert response.status_code == 404
        assert (await client.post("/reset_prefix_cache")).status_code == 200


async def test_pin_contract_on_sglang_flavor(start_engine: StartEngine) -> None:
    server = await start_engine(flavor="sglang", gpu_blocks=16)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        await client.post("/v1/completions", json={"prompt": SYSTEM, "max_tokens": 1})
        gpu = (await client.get("/sim/cache")).json()["tiers"]["GPU"]
        assert gpu and all(-(2**63) <= h < 2**63 for h in gpu)  # SGLang: signed int64
        pin = await client.post("/hicache/pin_blocks", json={"block_hashes": [*gpu, 42]})
        assert pin.json() == {"pinned_count": len(gpu)}
        assert (await client.post("/flush_cache")).status_code == 200
        assert sorted((await client.get("/sim/cache")).json()["tiers"]["GPU"]) == sorted(gpu)
        unpin = await client.post("/hicache/unpin_blocks", json={"block_hashes": gpu})
        assert unpin.json() == {"unpinned_count": len(gpu)}
        assert (await client.post("/flush_cache")).status_code == 200
        assert (await client.get("/sim/cache")).json()["tiers"]["GPU"] == []


async def test_bytes_hash_format_lists_hex(start_engine: StartEngine) -> None:
    server = await start_engine(hash_format="bytes")
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        await client.post("/v1/completions", json={"prompt": SYSTEM, "max_tokens": 1})
        gpu = (await client.get("/sim/cache")).json()["tiers"]["GPU"]
    assert gpu and all(isinstance(h, str) and len(h) == 64 for h in gpu)


async def test_request_faults(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url, timeout=10) as client:
        armed = await client.post("/sim/faults", json={"fail_requests": 1, "status": 503})
        assert armed.json()["armed"] == {"fail_requests": {"count": 1, "status": 503}}
        failed = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert failed.status_code == 503 and "error" in failed.json()
        ok = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200
        bad = await client.post("/sim/faults", json={"explode": True})
        assert bad.status_code == 400
        await client.post("/sim/faults", json={"close_midstream": 1})
        body = {"prompt": "x", "max_tokens": 5, "stream": True}
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("POST", "/v1/completions", json=body) as response:
                _ = [line async for line in response.aiter_lines()]
        again = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert again.status_code == 200


async def test_too_long_prompt_is_rejected(start_engine: StartEngine) -> None:
    server = await start_engine(gpu_blocks=4)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        response = await client.post(
            "/v1/completions", json={"prompt": "a " * 100, "max_tokens": 1}
        )
    assert response.status_code == 400 and "maximum context length" in response.text


async def test_a_prompt_longer_than_any_tokenization_of_the_context_is_refused_by_length(
    start_engine: StartEngine,
) -> None:
    """As vLLM: more characters than `max_model_len` × the longest token's are refused
    before tokenizing (a 400 naming the bound); `/tokenize` checks no length."""
    server = await start_engine(max_model_len=64)
    bound = 64 * server.engine.tokenizer.max_chars_per_token
    long = "a" * (bound + 1)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        text = await client.post("/v1/completions", json={"prompt": long, "max_tokens": 1})
        chat = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": long}]}
        )
        tokenized = await client.post("/tokenize", json={"prompt": long})
        truncated = await client.post(
            "/v1/completions",
            json={"prompt": long, "max_tokens": 1, "truncate_prompt_tokens": 8},
        )
    for refused in (text, chat):
        assert refused.status_code == 400
        assert f"more than {bound} characters" in refused.json()["error"]["message"]
    assert tokenized.status_code == 200
    assert "characters" not in truncated.text  # exempt from the character bound


async def test_stall_and_drop_fraction_faults(start_engine: StartEngine) -> None:
    server = await start_engine()
    engine = server.engine
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        body = {"stall_ms": 1, "seconds": 30, "drop_fraction": 1.0}
        armed = (await client.post("/sim/faults", json=body)).json()["armed"]
        assert armed == {
            "drop_fraction": {"fraction": 1.0, "seconds": 30.0},
            "stall_ms": {"stall_ms": 1.0, "seconds": 30.0},
        }
        before = engine.publisher.dropped_batches
        await client.post("/v1/completions", json={"prompt": SYSTEM, "max_tokens": 2})
        assert engine.faults.fired["stall_ms"] >= 1
        assert engine.publisher.dropped_batches > before
        missing = await client.post("/sim/faults", json={"stall_ms": 5})
        assert missing.status_code == 400 and "seconds" in missing.json()["error"]["message"]


async def test_a_client_leaving_a_non_streamed_request_aborts_it(start_engine: StartEngine) -> None:
    server = await start_engine(latency=LatencyModel(time_scale=2.0))
    engine = server.engine
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        body = {"prompt": SYSTEM, "max_tokens": 2000}
        request = asyncio.ensure_future(client.post("/v1/completions", json=body))
        await eventually(lambda: bool(engine.scheduler.running), what="the engine working")
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
    await eventually(
        lambda: not engine.scheduler.running and not engine.scheduler.waiting,
        what="the request aborted",
    )


async def test_a_restart_that_wipes_the_cache_ends_the_running_requests(
    start_engine: StartEngine,
) -> None:
    """A restarted engine has neither cache nor requests: streams are cut, a non-streamed
    request gets a 503 (a gateway retries it elsewhere), and nothing they computed is
    stored after the wipe."""
    server = await start_engine(latency=LatencyModel(time_scale=2.0))
    engine = server.engine
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        body = {"prompt": SYSTEM, "max_tokens": 300}
        plain = asyncio.ensure_future(client.post("/v1/completions", json=body))

        async def streamed() -> bytes:
            received = b""
            stream_body = {**body, "prompt": "another " + SYSTEM, "stream": True}
            async with client.stream("POST", "/v1/completions", json=stream_body) as response:
                async for chunk in response.aiter_bytes():
                    received += chunk
            return received

        stream = asyncio.ensure_future(streamed())
        scheduler = engine.scheduler
        await eventually(
            lambda: (
                len(scheduler.running) >= 1 and len(scheduler.running) + len(scheduler.waiting) == 2
            ),
            what="both in the engine",
        )
        restart = {"restart_publisher": True, "wipe_cache": True}
        assert (await client.post("/sim/faults", json=restart)).status_code == 200
        answer = await plain
        assert answer.status_code == 503 and "restarted" in answer.json()["error"]["message"]
        with pytest.raises(httpx.RemoteProtocolError):
            await stream
        await eventually(lambda: not engine.scheduler.running, what="requests ended")
        assert (await client.get("/sim/cache")).json()["tiers"]["GPU"] == []
        after = await client.post("/v1/completions", json={"prompt": "fresh", "max_tokens": 1})
        assert after.status_code == 200
