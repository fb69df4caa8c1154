"""The simulator's vLLM endpoints beyond generation: embeddings, pooling, score, rerank,
responses, and model cards with LoRA adapters — through the openai SDK and httpx."""

from __future__ import annotations

import math

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError

from simulator.pooling_api import EMBEDDING_DIM, embed
from tests.conftest import StartEngine


@pytest.fixture
async def engine_url(start_engine: StartEngine) -> str:
    return (await start_engine(loras=("adapter-a",))).url


def openai_client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=10)


def test_vectors_are_deterministic_and_normalised() -> None:
    vector = embed([1, 2, 3])
    assert vector == embed([1, 2, 3]) != embed([3, 4])
    assert len(vector) == EMBEDDING_DIM
    assert math.isclose(math.fsum(v * v for v in vector), 1.0)
    assert embed([]) == [0.0] * EMBEDDING_DIM


async def test_embeddings_base64_and_float_agree(engine_url: str) -> None:
    async with openai_client(engine_url) as client:
        default = await client.embeddings.create(model="sim-model", input="hello")  # base64
        floats = await client.embeddings.create(
            model="sim-model", input=["hello", "world"], encoding_format="float"
        )
        assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)
        assert len(floats.data) == 2 and floats.data[1].index == 1
        assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
        with pytest.raises(BadRequestError):
            await client.embeddings.create(model="sim-model", input="x", dimensions=8)
        with pytest.raises(NotFoundError):
            await client.embeddings.create(model="unknown", input="x")


async def test_embeddings_take_token_ids(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url) as client:
        ids = (await client.post("/tokenize", json={"prompt": "hello"})).json()["tokens"]
        by_ids = await client.post("/v1/embeddings", json={"input": [ids]})
        by_text = await client.post("/v1/embeddings", json={"input": "hello"})
        assert by_ids.json()["data"][0]["embedding"] == by_text.json()["data"][0]["embedding"]
        bad = await client.post("/v1/embeddings", json={"input": {"a": 1}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
        broken = await client.post("/v1/embeddings", content=b"{")
        assert broken.status_code == 400


async def test_score_rerank_pooling_shapes(engine_url: str) -> None:
    async with httpx.AsyncClient(base_url=engine_url) as client:
        score = (await client.post("/score", json={"text_1": "q", "text_2": ["q", "z y"]})).json()
        assert score["object"] == "list"
        assert [d["object"] for d in score["data"]] == ["score", "score"]
        assert score["data"][0]["score"] == pytest.approx(1.0)
        assert 0.0 <= score["data"][1]["score"] < 1.0
        mismatch = await client.post("/v1/score", json={"text_1": ["a", "b"], "text_2": ["c"]})
        assert mismatch.status_code == 400
        rerank = (
            await client.post(
                "/v2/rerank", json={"query": "q", "documents": ["z y", "q", "w"], "top_n": 2}
            )
        ).json()
        assert rerank["results"][0]["index"] == 1
        assert len(rerank["results"]) == 2
        assert rerank["results"][0]["document"] == {"text": "q"}
        assert rerank["usage"]["total_tokens"] > 0
        pooled = (await client.post("/pooling", json={"input": ["a", "b"]})).json()
        assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]


async def test_responses_plain_and_streamed(engine_url: str) -> None:
    async with openai_client(engine_url) as client:
        response = await client.responses.create(
            model="sim-model",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            max_output_tokens=3,
        )
        assert response.object == "response" and response.status == "completed"
        assert response.output_text
        assert response.usage is not None and response.usage.output_tokens == 3
        stream = await client.responses.create(
            model="sim-model", input="hi", max_output_tokens=3, stream=True
        )
        events = [event async for event in stream]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert events[-1].type == "response.completed"
        assert events[-1].response.output_text == deltas
        with pytest.raises(BadRequestError):
            await client.responses.create(model="sim-model", input=[], max_output_tokens=3)
        with pytest.raises(NotFoundError):
            await client.responses.create(model="nope", input="hi")


async def test_models_list_adapters_like_vllm(engine_url: str) -> None:
    async with openai_client(engine_url) as client:
        cards = {card.id: card.model_dump() for card in (await client.models.list()).data}
    assert cards["sim-model"]["parent"] is None
    assert cards["sim-model"]["max_model_len"] > 0
    assert cards["adapter-a"]["parent"] == "sim-model"
    assert cards["adapter-a"]["root"] != "adapter-a"
