"""A simulated engine hashing blocks as vLLM does (sha256_cbor) behind the gateway."""

from __future__ import annotations

import httpx

from simulator.block_hash import VllmBlockHasher, int_hash
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, StartGateway, pod_entry


async def test_the_engine_publishes_vllm_hashes_and_the_gateway_indexes_them(
    start_engine: StartEngine, start_gateway: StartGateway
) -> None:
    engine = await start_engine(name="vllm-hashes", block_hash="sha256_cbor")
    gw = await start_gateway(engines=0, pods=[pod_entry(engine)])
    prompt = "the prompt whose blocks are hashed as vLLM does " * 8
    async with gw.client() as client:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
        await client.post("/v1/completions", json=body)
        async with httpx.AsyncClient(base_url=engine.url) as direct:
            ids = (await direct.post("/tokenize", json={"model": MODEL, "prompt": prompt})).json()
            resident = (await direct.get("/sim/cache")).json()["tiers"]["GPU"]
        again = await client.post("/v1/completions", json=body)
    chain = VllmBlockHasher(16, seed=0).chain(ids["tokens"])
    assert {int_hash(digest) for digest in chain} <= set(resident)
    assert int(again.headers["x-kvgate-cached-blocks"]) == len(chain)
