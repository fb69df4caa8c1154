"""The engines' other endpoints through a real gateway, with the `openai` SDK where it has
them: embeddings, responses, models; tokenize, detokenize, rerank, score and pooling raw."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, Gateway, StartGateway, pod_entry


def sdk(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="test", max_retries=0)


def counted(text: str, model: str) -> float:
    """`kvgate_requests_total` summed over the series of `model` that answered 200."""
    total = 0.0
    for line in text.splitlines():
        series = line.startswith("kvgate_requests_total{") and f'model="{model}"' in line
        if series and 'status="200"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_embeddings_through_the_sdk(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=2)
    async with sdk(gateway) as client:
        one = await client.embeddings.create(model=MODEL, input=["hello world", "goodbye"])
        again = await client.embeddings.create(model=MODEL, input="hello world",
                                               encoding_format="float")  # fmt: skip
        assert [item.index for item in one.data] == [0, 1]
        assert len(one.data[0].embedding) == 64
        assert one.data[0].embedding == pytest.approx(again.data[0].embedding, abs=1e-6)
        assert one.usage.prompt_tokens > 0
        async with gateway.client() as http:
            metrics = (await http.get("/metrics")).text
        assert counted(metrics, MODEL) == 2


async def test_responses_through_the_sdk(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=2)
    async with sdk(gateway) as client:
        response = await client.responses.create(
            model=MODEL, input="tell me a story", instructions="be brief", max_output_tokens=6
        )
        assert response.status == "completed"
        assert response.output_text
        assert response.usage is not None and response.usage.output_tokens == 6
        stream = await client.responses.create(
            model=MODEL, input="tell me a story", max_output_tokens=4, stream=True
        )
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created"
        assert kinds.count("response.output_text.delta") == 4
        assert kinds[-1] == "response.completed"


async def test_responses_route_by_prefix(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=2, default_policy="prefix-share")
    prompt = "a long shared system prompt " * 40
    async with gateway.client() as http:
        body = {"model": MODEL, "input": prompt, "max_output_tokens": 2}
        first = await http.post("/v1/responses", json=body)
        assert first.status_code == 200
        second = await http.post("/v1/responses", json=body)
    assert second.headers["x-kvgate-pod"] == first.headers["x-kvgate-pod"]
    assert int(second.headers["x-kvgate-prompt-blocks"]) > 0
    assert int(second.headers["x-kvgate-cached-blocks"]) > 0


async def test_models_from_the_engines(start_engine: StartEngine,
                                       start_gateway: StartGateway) -> None:  # fmt: skip
    base = await start_engine(name="base", loras=("adapter-a",))
    other = await start_engine(name="other", model="other-model")
    gateway = await start_gateway(engines=0, pods=[
        pod_entry(base, loras=["adapter-a"]), pod_entry(other, model="other-model"),
    ])  # fmt: skip
    async with sdk(gateway) as client:
        cards = {card.id: card.model_dump() for card in (await client.models.list()).data}
        assert set(cards) == {MODEL, "adapter-a", "other-model"}
        assert cards[MODEL]["max_model_len"] == base.engine.config.max_model_len
        assert cards[MODEL]["root"] == MODEL and cards[MODEL]["parent"] is None
        assert cards[MODEL]["owned_by"] == "vllm"
        assert cards["adapter-a"]["parent"] == MODEL
        retrieved = await client.models.retrieve("adapter-a")
        assert retrieved.model_dump() == cards["adapter-a"]
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("no-such-model")

        await other.stop()  # a pod that is down drops out of the list
        for _ in range(100):
            ids = {card.id for card in (await client.models.list()).data}
            if "other-model" not in ids:
                break
            await asyncio.sleep(0.1)
        assert ids == {MODEL, "adapter-a"}


async def test_tokenize_and_detokenize(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=2)
    async with gateway.client() as http:
        tokens = await http.post("/tokenize", json={"model": MODEL, "prompt": "hello world"})
        assert tokens.status_code == 200
        assert tokens.headers["x-kvgate-pod"] in ("e0", "e1")
        ids = tokens.json()["tokens"]
        assert tokens.json()["count"] == len(ids) > 0
        text = await http.post("/detokenize", json={"tokens": ids})  # one model: may omit it
        assert text.status_code == 200
        assert "hello world" in text.json()["prompt"]


async def test_rerank_score_and_pooling(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=1)
    async with gateway.client() as http:
        for path in ("/rerank", "/v1/rerank"):
            ranked = await http.post(path, json={
                "model": MODEL, "query": "red apple", "documents": ["blue sky", "red apple"],
                "top_n": 1,
            })  # fmt: skip
            assert ranked.status_code == 200
            assert ranked.json()["results"][0]["index"] == 1
        for path in ("/score", "/v1/score"):
            scored = await http.post(path, json={"model": MODEL, "text_1": "a",
                                                 "text_2": ["a", "b"]})  # fmt: skip
            assert [item["index"] for item in scored.json()["data"]] == [0, 1]
        pooled = await http.post("/pooling", json={"model": MODEL, "input": "hi"})
        assert pooled.json()["data"][0]["object"] == "pooling"


async def test_errors_are_openai_style(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=1, max_body_bytes=1024)
    async with sdk(gateway) as client:
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.embeddings.create(model="no-such-model", input="x")
        assert unknown.value.status_code == 404
        assert unknown.value.code == "model_not_found"
        async with gateway.client() as http:
            for path, body in [
                ("/v1/embeddings", {"model": MODEL, "input": 5}),  # the engine's own 400
                ("/v1/embeddings", {"model": MODEL, "input": "x" * 2000}),  # the gateway's 413
                ("/tokenize", {"model": 7}),
                ("/v1/responses", {"model": MODEL, "input": "x", "stream": "yes"}),
            ]:
                answer = await http.post(path, json=body)
                assert 400 <= answer.status_code < 500, (path, body)
                error = answer.json()["error"]
                assert {"message", "type", "param", "code"} <= set(error)
            bad_json = await http.post("/v1/score", content=b"{", headers={"content-type": "a/j"})
            assert bad_json.status_code == 400


async def test_upstream_down_is_a_502(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(engines=1)
    await gateway.engines[0].stop()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert answer.status_code in (502, 503)
    assert "error" in answer.json()
