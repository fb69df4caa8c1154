"""The STORAGE tier: write-through, survival across a restart, start-up validation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgpack
import zmq
import zmq.asyncio

from simulator import EngineServer, SimEngine
from simulator.wire import BlockStored, decode_batch
from tests.conftest import StartEngine, loopback_config

PROMPT = "You are a helpful assistant for the golden capture. " * 8


async def replay_all(endpoint: str) -> list[BlockStored]:
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    stored: list[BlockStored] = []
    while True:
        frames = await asyncio.wait_for(dealer.recv_multipart(), 5)
        if frames[2] == b"\xff" * 8:
            break
        stored += [e for e in decode_batch(frames[3]).events if isinstance(e, BlockStored)]
    dealer.close(linger=0)
    ctx.term()
    return stored


async def test_storage_survives_restart_and_is_announced(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    first = await start_engine(disk_dir=tmp_path)
    async with httpx.AsyncClient(base_url=first.url, timeout=10) as client:
        await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        before = (await client.get("/sim/cache")).json()["tiers"]
    assert before["STORAGE"] and sorted(before["STORAGE"]) == sorted(before["GPU"])
    await first.stop()
    assert len(list((tmp_path / "blocks").glob("*.blk"))) == len(before["STORAGE"])

    second = await start_engine(disk_dir=tmp_path)
    assert second.engine.disk is not None and second.engine.disk.stats.last_shutdown_clean
    async with httpx.AsyncClient(base_url=second.url, timeout=10) as client:
        after = (await client.get("/sim/cache")).json()["tiers"]
        assert sorted(after["STORAGE"]) == sorted(before["STORAGE"]) and after["GPU"] == []
        announced = await replay_all(second.engine.publisher.replay_endpoint or "")
        assert {m.medium for m in announced} == {"STORAGE"}
        assert sorted(h for m in announced for h in m.block_hashes) == sorted(before["STORAGE"])
        hit = await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        assert hit.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert (await client.get("/sim/cache")).json()["tiers"]["GPU"]


async def test_startup_validation_cleans_the_directory(tmp_path: Path) -> None:
    config = loopback_config(disk_dir=tmp_path)
    server = EngineServer(SimEngine(config))
    await server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        stored = (await client.get("/sim/cache")).json()["tiers"]["STORAGE"]
    await server.stop()
    files = sorted((tmp_path / "blocks").glob("*.blk"))
    assert len(files) == len(stored) >= 3
    root = server.engine.cache.hasher.chain(
        server.engine.tokenizer.encode(PROMPT, add_special_tokens=True)
    )[0]
    (tmp_path / "blocks" / f"{root.hex()}.blk").unlink()  # the chain's root goes missing
    (tmp_path / "blocks" / f"{'ab' * 32}.blk").write_bytes(b"orphan")

    engine = SimEngine(loopback_config(disk_dir=tmp_path))
    await engine.start()
    try:
        assert engine.disk is not None
        stats = engine.disk.stats
        assert stats.missing_cleaned == 1 and stats.orphans_cleaned == 1
        assert stats.unreachable_cleaned == len(stored) - 1 and stats.loaded == 0
        assert engine.cache_snapshot()["tiers"]["STORAGE"] == []
        assert list((tmp_path / "blocks").glob("*.blk")) == []
    finally:
        await engine.stop()


async def test_pending_writes_are_drained_at_shutdown(tmp_path: Path) -> None:
    engine = SimEngine(loopback_config(disk_dir=tmp_path, disk_queue=1))
    server = EngineServer(engine)
    await server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        await client.post("/v1/completions", json={"prompt": PROMPT * 3, "max_tokens": 1})
        stats = (await client.get("/sim/stats")).json()
    stored = stats["cache"]["resident"]["STORAGE"]
    assert stored >= 10
    await server.stop()  # the writer drains the backlog before the engine stops
    assert len(list((tmp_path / "blocks").glob("*.blk"))) == stored
    index = msgpack.unpackb((tmp_path / "index.msgpack").read_bytes())
    assert index["clean_shutdown"] is True and len(index["entries"]) == stored
