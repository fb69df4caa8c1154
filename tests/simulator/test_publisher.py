"""The KV-event wire, end to end: a real pyzmq SUB and DEALER against a running engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from simulator import EngineServer
from simulator.wire import BlockRemoved, BlockStored, KVEvent, decode_batch
from tests.conftest import StartEngine
from tests.golden import FRAMES as GOLDEN
from tests.helpers import eventually

END = b"\xff" * 8
PROMPT = "You are a helpful assistant for the golden capture. " * 6


def golden() -> list[list[bytes]]:
    lines = [json.loads(x) for x in GOLDEN.read_text().splitlines() if x.strip()]
    return [[bytes.fromhex(h) for h in line["frames_hex"]] for line in lines]


class Sockets:
    """A ZMQ context whose sockets the test closes at the end."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.open: list[zmq.asyncio.Socket] = []

    def socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.open.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.open:
            sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
async def zctx() -> AsyncIterator[Sockets]:
    sockets = Sockets()
    yield sockets
    sockets.close()


async def subscribe(ctx: Sockets, server: EngineServer) -> zmq.asyncio.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    publisher = server.engine.publisher
    before = publisher.subscriptions
    sub.connect(publisher.events_endpoint)
    # A subscription reaches the publisher some time after connecting (ZMQ's slow joiner).
    await eventually(lambda: publisher.subscriptions > before, what="subscription arrived")
    return sub


async def complete(server: EngineServer, prompt: str, max_tokens: int = 2) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


async def replay(ctx: Sockets, server: EngineServer, start: int) -> list[list[bytes]]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(server.engine.publisher.replay_endpoint or "")
    await dealer.send_multipart([b"", start.to_bytes(8, "big")])
    replies = []
    while True:
        frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
        replies.append(frames)
        if frames[-2] == END:
            break
    return replies


async def test_live_frames_have_the_golden_shape(start_engine: StartEngine, zctx: Sockets) -> None:
    server = await start_engine()
    sub = await subscribe(zctx, server)
    await complete(server, PROMPT)
    frames = await asyncio.wait_for(sub.recv_multipart(), 5)
    gold = next(f for f in golden() if len(f) == 3)
    assert len(frames) == 3 and frames[0] == gold[0] == b"kv-events"
    assert frames[1] == (0).to_bytes(8, "big") and len(gold[1]) == 8
    ours, theirs = msgpack.unpackb(frames[2]), msgpack.unpackb(gold[2])
    assert [type(x) for x in ours] == [type(x) for x in theirs]  # [float, list, int]
    assert list(ours[1][0]) == list(theirs[1][0])  # same map keys, same order
    event = decode_batch(frames[2]).events[0]
    assert isinstance(event, BlockStored) and event.parent_block_hash is None
    assert len(event.token_ids) == len(event.block_hashes) * 16
    async with httpx.AsyncClient(base_url=server.url) as client:
        cache = (await client.get("/sim/cache")).json()
    assert cache["block_size"] == 16 and sorted(cache["tiers"]["GPU"]) == sorted(event.block_hashes)


async def test_replay_matches_golden_protocol(start_engine: StartEngine, zctx: Sockets) -> None:
    server = await start_engine()
    for i in range(3):
        await complete(server, f"request number {i} " * 10)
    replies = await replay(zctx, server, 0)
    gold_end = next(f for f in golden() if len(f) == 4 and f[2] == END)
    assert replies[-1] == gold_end == [b"", b"", END, b""]
    body = replies[:-1]
    assert [int.from_bytes(f[2], "big") for f in body] == list(range(len(body)))
    assert all(len(f) == 4 and f[0] == b"" and f[1] == b"kv-events" for f in body)
    middle = await replay(zctx, server, 1)
    assert middle[:-1] == body[1:]
    beyond = await replay(zctx, server, 10**6)
    assert beyond == [gold_end]


async def test_start_older_than_buffer_gets_the_oldest(
    start_engine: StartEngine, zctx: Sockets
) -> None:
    server = await start_engine(replay_buffer=2)
    for i in range(4):
        await complete(server, f"distinct prompt {i} " * 10)
    replies = await replay(zctx, server, 0)
    seqs = [int.from_bytes(f[2], "big") for f in replies[:-1]]
    assert len(seqs) == 2 and seqs[0] > 0  # the gateway must notice the gap


async def test_dropped_batch_is_replayable(start_engine: StartEngine, zctx: Sockets) -> None:
    server = await start_engine()
    sub = await subscribe(zctx, server)
    await complete(server, "first prompt " * 10)
    assert (await asyncio.wait_for(sub.recv_multipart(), 5))[1] == (0).to_bytes(8, "big")
    async with httpx.AsyncClient(base_url=server.url) as client:
        armed = await client.post("/sim/faults", json={"drop_batches": 1})
        assert armed.status_code == 200 and armed.json()["armed"] == {"drop_batches": 1}
    await complete(server, "second prompt " * 10)
    await complete(server, "third prompt " * 10)
    frames = await asyncio.wait_for(sub.recv_multipart(), 5)
    assert int.from_bytes(frames[1], "big") == 2  # seq 1 never arrived live
    replies = await replay(zctx, server, 1)
    assert int.from_bytes(replies[0][2], "big") == 1


async def test_restart_publisher_restarts_seq(start_engine: StartEngine, zctx: Sockets) -> None:
    server = await start_engine()
    sub = await subscribe(zctx, server)
    await complete(server, "before restart " * 10)
    await asyncio.wait_for(sub.recv_multipart(), 5)
    async with httpx.AsyncClient(base_url=server.url) as client:
        body = {"restart_publisher": True, "wipe_cache": True}
        assert (await client.post("/sim/faults", json=body)).status_code == 200
        assert (await client.get("/sim/cache")).json()["tiers"]["GPU"] == []
    for attempt in range(10):  # the SUB reconnects by itself; early batches may be missed
        await complete(server, f"after restart {attempt} " * 10)
        try:
            frames = await asyncio.wait_for(sub.recv_multipart(), 0.5)
        except TimeoutError:
            continue
        assert int.from_bytes(frames[1], "big") == attempt  # seq counts from 0 again
        return
    raise AssertionError("no batch received after the publisher restart")


async def test_evictions_precede_stores_on_the_wire(
    start_engine: StartEngine, zctx: Sockets
) -> None:
    server = await start_engine(gpu_blocks=8)
    sub = await subscribe(zctx, server)
    await complete(server, "a " * 60, max_tokens=1)  # 61 tokens: 3 full blocks
    await complete(server, "the " * 100, max_tokens=1)  # needs 7 of 8 slots: evicts 2
    events: list[KVEvent] = []
    for _ in range(2):
        events.extend(decode_batch((await asyncio.wait_for(sub.recv_multipart(), 5))[2]).events)
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "BlockStored" and "BlockRemoved" in kinds
    assert kinds.index("BlockRemoved") < len(kinds) - 1 and kinds[-1] == "BlockStored"
    removed = [e.block_hashes[0] for e in events if isinstance(e, BlockRemoved)]
    first = events[0]
    assert isinstance(first, BlockStored)
    assert removed == list(reversed(first.block_hashes))[: len(removed)]  # tail first


async def test_connect_mode_reaches_a_bound_subscriber(
    start_engine: StartEngine, zctx: Sockets
) -> None:
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.bind("tcp://127.0.0.1:*")
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    server = await start_engine(events_endpoint=endpoint, events_mode="connect")
    for attempt in range(10):  # the PUB's connection comes up asynchronously
        await complete(server, f"connect mode {attempt} " * 10)
        try:
            frames = await asyncio.wait_for(sub.recv_multipart(), 0.5)
        except TimeoutError:
            continue
        assert frames[0] == b"kv-events" and len(frames[1]) == 8
        return
    raise AssertionError("no batch reached the bound SUB")


async def replayed_tiers(zctx: Sockets, server: EngineServer) -> dict[str, set[int]]:
    """What a subscriber rebuilds from a full replay: resident hashes per medium."""
    tiers: dict[str, set[int]] = {"GPU": set(), "CPU": set(), "STORAGE": set()}
    for frames in (await replay(zctx, server, 0))[:-1]:
        for event in decode_batch(frames[3]).events:
            if isinstance(event, BlockStored):
                assert event.medium is not None
                tiers[event.medium].update(int(h) for h in event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert event.medium is not None
                assert event.block_hashes[0] in tiers[event.medium]
                tiers[event.medium].discard(int(event.block_hashes[0]))
    return tiers


async def sim_cache(server: EngineServer) -> dict[str, set[int]]:
    async with httpx.AsyncClient(base_url=server.url) as client:
        cache = (await client.get("/sim/cache")).json()["tiers"]
    return {tier: set(hashes) for tier, hashes in cache.items()}


async def test_replayed_events_rebuild_sim_cache_exactly(
    start_engine: StartEngine, zctx: Sockets
) -> None:
    server = await start_engine(gpu_blocks=24, host_blocks=12, max_batch=4)
    prompts = [f"shared prefix {i % 3} " * 12 + f"tail {i} " * (i % 5 + 1) for i in range(30)]
    await asyncio.gather(*(complete(server, p, max_tokens=20) for p in prompts))
    tiers = await replayed_tiers(zctx, server)
    assert await sim_cache(server) == tiers
    assert tiers["CPU"]  # the host tier took GPU evictions


async def test_restart_keeping_the_cache_announces_what_it_kept(
    start_engine: StartEngine, zctx: Sockets
) -> None:
    server = await start_engine(gpu_blocks=24, host_blocks=12, max_batch=4)
    prompts = [f"kept prefix {i % 3} " * 12 + f"tail {i} " * (i % 5 + 1) for i in range(30)]
    await asyncio.gather(*(complete(server, p, max_tokens=20) for p in prompts))
    before = await sim_cache(server)
    async with httpx.AsyncClient(base_url=server.url) as client:
        body = {"restart_publisher": True, "wipe_cache": False}
        assert (await client.post("/sim/faults", json=body)).status_code == 200
    assert await sim_cache(server) == before  # nothing lost...
    assert await replayed_tiers(zctx, server) == before  # ...and all of it announced from seq 0
    assert before["GPU"] and before["CPU"]
