"""A pod whose KV events can never be indexed (every block breaks its chain, as SGLang
<= 0.4's unchained per-token hashes do) is shown as `unindexable`, counted, and routed from
the gateway's own entries until its blocks chain again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from subscriber import BlockStored, KVEventBatch, encode_batch, encode_pub_message
from tests.gateway.conftest import MODEL, StartGateway, pod_entry
from tests.helpers import eventually, free_port

TOPIC = "kv-events"


class Publisher:
    """A PUB socket speaking vLLM's wire format, standing in for the pod's event endpoint."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        self.seq = 0

    async def publish(self, *events: BlockStored) -> None:
        batch = encode_batch(KVEventBatch(0.0, tuple(events)))
        await self.socket.send_multipart(encode_pub_message(TOPIC, self.seq, batch))
        self.seq += 1

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.destroy(linger=0)


@pytest.fixture
async def publisher() -> AsyncIterator[Publisher]:
    publisher = Publisher(f"tcp://127.0.0.1:{free_port()}")
    yield publisher
    publisher.close()


def unchained(first: int, blocks: int) -> BlockStored:
    """Blocks whose parent the gateway never heard of (SGLang <= 0.4: parent `hash(())`)."""
    return BlockStored(tuple(range(first, first + blocks)), 5_740_354_900_026_072_187,
                       tuple(range(blocks * 16)), 16)  # fmt: skip


async def test_a_pod_whose_blocks_never_chain_is_unindexable_until_they_do(
    start_gateway: StartGateway, start_engine: object, publisher: Publisher
) -> None:
    engine = await start_engine(name="old-sglang")  # type: ignore[operator]
    entry = pod_entry(engine, events=False) | {"events": publisher.endpoint, "topic": TOPIC}
    gw = await start_gateway(engines=0, pods=[entry], scrape_interval_s=0.1)
    registry = gw.state.registry

    async def flood() -> bool:
        await publisher.publish(unchained(1000 + publisher.seq * 8, 8))
        await asyncio.sleep(0.02)
        return registry.index_mode("old-sglang") == "unindexable"

    await eventually(flood, what="marked unindexable")
    async with gw.admin() as admin:
        view = (await admin.get("/admin/pods")).json()["pods"][0]
        page = (await admin.get("/metrics")).text
    assert view["index"] == "unindexable" and "broke their chains" in view["index_reason"]
    assert 'kvgate_pod_unindexable{pod="old-sglang"} 1.0' in page
    # routed from the gateway's own entries: a repeated prompt finds its blocks expected
    body = {"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": "the same long question " * 20}]}  # fmt: skip
    async with gw.client() as client:
        await client.post("/v1/chat/completions", json=body)
        again = await client.post("/v1/chat/completions", json=body)
    assert int(again.headers["x-kvgate-cached-blocks"]) > 0
    # the engine starts chaining its blocks (parent None: a chain root)
    chained = BlockStored((7, 8), None, tuple(range(32)), 16)

    async def healed() -> bool:
        await publisher.publish(chained)
        await asyncio.sleep(0.05)
        return registry.index_mode("old-sglang") != "unindexable"

    await eventually(healed, what="indexable again")
