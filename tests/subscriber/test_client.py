"""PodSubscriber and SubscriberManager against real simulated engines over real ZMQ.

After every fault the index must equal what the engine reports in GET /sim/cache.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import zmq
import zmq.asyncio

from indexer import IndexConfig, ModelContext, SyncPrefixHashTable, Tier
from simulator import EngineServer
from subscriber import (
    BlockStored,
    IndexSink,
    KVEventBatch,
    Phase,
    PodEndpoint,
    SubscriberManager,
    SubscriberSettings,
    encode_batch,
    encode_pub_message,
)
from tests.conftest import StartEngine
from tests.helpers import eventually, free_port

SETTINGS = SubscriberSettings(
    replay_timeout_s=1.0, reconnect_initial_s=0.05, reconnect_max_s=0.5, idle_probe_s=0.5
)


class Fleet:
    """The gateway side under test: an index fed by a subscriber manager."""

    def __init__(self, manager: SubscriberManager, table: SyncPrefixHashTable) -> None:
        self.manager = manager
        self.table = table

    async def subscribe(self, server: EngineServer, **overrides: Any) -> PodEndpoint:
        endpoint = endpoint_of(server, **overrides)
        await self.manager.upsert(endpoint)
        return endpoint

    async def in_sync(self, server: EngineServer) -> bool:
        pod = server.engine.config.name
        if not self.table.has_pod(pod):
            return False
        held = self.table.dump_tiers(pod)
        indexed = {tier.name: held[tier] for tier in (Tier.GPU, Tier.CPU, Tier.STORAGE)}
        return indexed == await sim_cache(server)

    async def wait_in_sync(self, server: EngineServer) -> None:
        await eventually(lambda: self.in_sync(server), what="index == /sim/cache")

    def status(self, server: EngineServer) -> Any:
        return self.manager.status(server.engine.config.name)


def endpoint_of(server: EngineServer, **overrides: Any) -> PodEndpoint:
    engine = server.engine
    fields: dict[str, Any] = {
        "name": engine.config.name,
        "model": engine.config.model,
        "events": engine.publisher.events_endpoint,
        "replay": engine.publisher.replay_endpoint,
        "topic": engine.config.topic,
    }
    fields.update(overrides)
    return PodEndpoint(**fields)


async def sim_cache(server: EngineServer) -> dict[str, set[int]]:
    async with httpx.AsyncClient(base_url=server.url) as client:
        tiers = (await client.get("/sim/cache")).json()["tiers"]
    return {tier: set(hashes) for tier, hashes in tiers.items()}


async def complete(server: EngineServer, prompt: str, max_tokens: int = 4) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        body = {"model": server.engine.config.model, "prompt": prompt, "max_tokens": max_tokens}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text


async def traffic(server: EngineServer, tag: str, requests: int = 4) -> None:
    for i in range(requests):
        await complete(server, f"system {i % 2} " * 20 + f"{tag} question {i} " * 6)


async def arm(server: EngineServer, **fault: Any) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        response = await client.post("/sim/faults", json=fault)
        assert response.status_code == 200, response.text


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    table = SyncPrefixHashTable(IndexConfig(block_size=16))
    async with SubscriberManager(IndexSink(table), settings=SETTINGS) as manager:
        yield Fleet(manager, table)


async def test_late_start_is_filled_by_replay_then_follows_live(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    server = await start_engine()
    await traffic(server, "before")
    await fleet.subscribe(server)
    await fleet.wait_in_sync(server)
    await traffic(server, "after")
    await fleet.wait_in_sync(server)
    status = fleet.status(server)
    assert status.phase is Phase.LIVE
    assert status.whole
    assert status.degraded_reason is None
    assert status.connected
    assert status.gaps == 0
    assert status.last_seq is not None
    assert fleet.table.stats().broken_chain_events == 0


async def test_sglang_page_size_one_is_rechunked_into_gateway_blocks(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    # One block per token, signed int64 hashes: the index (16-token blocks) still equals
    # the engine, and prompts match at gateway granularity.
    server = await start_engine(flavor="sglang", block_size=1, gpu_blocks=4096)
    await fleet.subscribe(server)
    await traffic(server, "paged")
    await fleet.wait_in_sync(server)
    pod = server.engine.config.name
    assert fleet.table.rejected_blocks(pod) == {}
    prompt = "system 0 " * 20 + "paged question 0 " * 6
    async with httpx.AsyncClient(base_url=server.url) as client:
        tokens = (await client.post("/tokenize", json={"prompt": prompt})).json()["tokens"]
    hashes = fleet.table.prefix_hashes(tokens)
    result = fleet.table.match(ModelContext(server.engine.config.model), hashes, [pod])
    assert result.matched(pod) == len(hashes) > 0


async def test_dropped_batches_are_replayed(start_engine: StartEngine, fleet: Fleet) -> None:
    server = await start_engine()
    await fleet.subscribe(server)
    await traffic(server, "warm")
    await fleet.wait_in_sync(server)
    await arm(server, drop_batches=3)
    await traffic(server, "lossy", requests=6)
    await fleet.wait_in_sync(server)
    status = fleet.status(server)
    assert status.gaps >= 1
    assert status.whole


async def test_lost_last_batches_are_found_by_the_idle_probe(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    server = await start_engine()
    await fleet.subscribe(server)
    await traffic(server, "warm")
    await fleet.wait_in_sync(server)
    await arm(server, drop_batches=100)  # everything from now on is lost on the wire...
    await traffic(server, "lost", requests=3)  # ...and no later batch reveals the gap
    await fleet.wait_in_sync(server)
    status = fleet.status(server)
    assert status.idle_probes >= 1
    assert status.gaps == 0 and status.whole


@pytest.mark.parametrize("wipe", [False, True], ids=["cache-kept", "cache-wiped"])
async def test_publisher_restart_rebuilds_the_pod(
    start_engine: StartEngine, fleet: Fleet, wipe: bool
) -> None:
    server = await start_engine()
    await fleet.subscribe(server)
    await traffic(server, "first life", requests=6)
    await fleet.wait_in_sync(server)
    await arm(server, restart_publisher=True, wipe_cache=wipe)
    await traffic(server, "second life")
    await fleet.wait_in_sync(server)
    status = fleet.status(server)
    assert status.restarts >= 1
    assert status.whole


async def test_replay_buffer_overrun_resets_and_never_leaves_stale_blocks(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    server = await start_engine(replay_buffer=2, gpu_blocks=64)
    await fleet.subscribe(server)
    await traffic(server, "warm")
    await fleet.wait_in_sync(server)
    await arm(server, drop_batches=5)
    await traffic(server, "overrun", requests=8)
    pod = server.engine.config.name
    await eventually(lambda: not fleet.status(server).whole, what="pod marked degraded")
    assert "overrun" in (fleet.status(server).degraded_reason or "")
    await traffic(server, "later", requests=2)
    # Whatever the index holds, the engine holds: nothing stale survived the reset.
    await eventually(lambda: fleet.status(server).phase is Phase.LIVE, what="live again")
    cache = await sim_cache(server)
    assert fleet.table.dump(pod) <= set().union(*cache.values())
    # A reset of the engine's cache makes the pod whole again.
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.post("/reset_prefix_cache")).status_code == 200
    await traffic(server, "fresh", requests=2)
    await fleet.wait_in_sync(server)
    assert fleet.status(server).whole


async def test_engine_killed_and_restarted_on_the_same_address(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    first = await start_engine(name="e-restart")
    endpoint = await fleet.subscribe(first)
    await traffic(first, "first process")
    await fleet.wait_in_sync(first)
    port = first.port
    await first.stop()
    await eventually(lambda: not fleet.status(first).connected, what="disconnect seen")
    second = await start_engine(
        name="e-restart",
        port=port,
        events_endpoint=endpoint.events,
        replay_endpoint=endpoint.replay,
    )
    await traffic(second, "second process")
    await fleet.wait_in_sync(second)
    status = fleet.status(second)
    assert status.restarts >= 1
    assert status.whole
    assert status.connected


async def test_garbage_frames_are_counted_and_leave_the_index_alone(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    # The gateway binds; the engine and a garbage publisher both connect to it.
    bound = f"tcp://127.0.0.1:{free_port()}"
    server = await start_engine(events_endpoint=bound, events_mode="connect")
    await fleet.subscribe(server, events=bound, bind=True)
    await traffic(server, "clean")
    await fleet.wait_in_sync(server)
    before = fleet.table.dump(server.engine.config.name)

    context = zmq.asyncio.Context()
    garbage = context.socket(zmq.PUB)
    garbage.setsockopt(zmq.LINGER, 0)
    garbage.connect(bound)
    topic = server.engine.config.topic.encode()
    last = fleet.status(server).last_seq
    messages = [
        [topic, b"\x00" * 8],  # two frames
        [topic, b"\x01\x02", b"\x90"],  # a 2-byte seq
        [topic, (last + 1).to_bytes(8, "big"), b"not msgpack at all"],  # the next seq, junk
        encode_pub_message(server.engine.config.topic, 10**9, b"\x93\xcb"),  # truncated batch
        [topic, (last + 1).to_bytes(8, "big"), b"\x93\xa3abc\x90\xc0"],  # ts is a string
        [topic, *[b"part"] * 5000],  # parts without end: read, dropped, refused
    ]
    try:
        await eventually(lambda: fleet.status(server).connected, what="connected")
        for _ in range(40):  # PUB drops until connected; send until some arrive
            for frames in messages:
                await garbage.send_multipart(frames)
            await asyncio.sleep(0.05)
            if fleet.status(server).frames_rejected >= 10:
                break
    finally:
        garbage.close(linger=0)
        context.destroy(linger=0)
    status = fleet.status(server)
    assert status.frames_rejected >= 10
    assert status.whole
    assert fleet.table.dump(server.engine.config.name) == before
    rejects = fleet.manager.rejects.snapshot()
    reasons = {reason for (pod, reason) in rejects if pod == server.engine.config.name}
    assert {"frame_count", "bad_seq", "msgpack", "bad_timestamp"} <= reasons
    await traffic(server, "still fine")
    await fleet.wait_in_sync(server)


async def test_pod_without_replay_stays_degraded_until_a_reset(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    server = await start_engine()
    await traffic(server, "unseen")  # published before we subscribe: lost for good
    await fleet.subscribe(server, replay=None)
    await traffic(server, "seen")
    await eventually(lambda: fleet.status(server).batches_applied > 0, what="live batches")
    status = fleet.status(server)
    assert not status.whole
    assert "no replay" in (status.degraded_reason or "")
    await arm(server, drop_batches=2)
    await traffic(server, "gap", requests=4)
    await eventually(lambda: fleet.status(server).gaps >= 1, what="gap seen")
    assert not fleet.status(server).whole  # never whole after a gap without replay
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.post("/reset_prefix_cache")).status_code == 200
    await traffic(server, "after reset")
    await fleet.wait_in_sync(server)
    assert fleet.status(server).whole


async def test_manager_follows_discovery_and_shuts_down_cleanly(
    start_engine: StartEngine,
) -> None:
    one = await start_engine(name="one")
    two = await start_engine(name="two")
    table = SyncPrefixHashTable(IndexConfig(block_size=16))
    manager = SubscriberManager(IndexSink(table), settings=SETTINGS)
    fleet = Fleet(manager, table)
    await fleet.subscribe(one)
    await fleet.subscribe(two)
    await fleet.subscribe(two)  # unchanged: a no-op
    await traffic(one, "one")
    await traffic(two, "two")
    await fleet.wait_in_sync(one)
    await fleet.wait_in_sync(two)
    assert sorted(manager.pods()) == ["one", "two"]

    await manager.remove("two")
    assert not table.has_pod("two")
    assert manager.status("two") is None

    # "one" changes address (here: its topic) -> its subscriber restarts from scratch
    await fleet.subscribe(one, topic="kv-events-other")
    assert manager.status("one").batches_applied == 0  # type: ignore[union-attr]
    await fleet.subscribe(one)
    await fleet.wait_in_sync(one)

    await manager.close()
    leftovers = [t for t in asyncio.all_tasks() if t.get_name().startswith("kv-")]
    assert leftovers == []
    assert table.has_pod("one")  # closing keeps the index; removing a pod drops it
    with pytest.raises(RuntimeError, match="closed"):
        await manager.upsert(endpoint_of(one))


async def test_an_engine_down_for_a_while_then_restarted_is_counted_as_a_restart(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    """As a real vLLM restart goes (SIGTERM, seconds down, back on the same ports): the
    silence probe finds the replay socket unreachable and resets the pod; the engine then
    publishes from seq 0. Both are counted: the reset by cause, the restart."""
    first = await start_engine(name="e-down")
    endpoint = await fleet.subscribe(first)
    await traffic(first, "first process")
    await fleet.wait_in_sync(first)
    port = first.port
    await first.stop()
    await eventually(
        lambda: "no replay" in (fleet.status(first).degraded_reason or ""),
        within=30.0,
        what="the silence probe found no replay socket",
    )
    assert fleet.status(first).resets.get("replay_unavailable") == 1
    second = await start_engine(
        name="e-down", port=port, events_endpoint=endpoint.events, replay_endpoint=endpoint.replay
    )
    await traffic(second, "second process")
    await fleet.wait_in_sync(second)
    status = fleet.status(second)
    assert status.restarts == 1
    assert status.whole


async def test_a_restart_after_a_short_life_is_counted_whatever_the_new_seq(
    start_engine: StartEngine, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """The first life publishes little; the engine is down long enough for the silence
    probe to find no replay socket; the new life publishes past the old last seq before (or
    while) the subscriber looks again. Its seq alone cannot tell; its history does: the
    restart is counted and logged once."""
    first = await start_engine(name="e-short")
    endpoint = await fleet.subscribe(first)
    await traffic(first, "short life", requests=1)
    await fleet.wait_in_sync(first)
    old_last = fleet.status(first).last_seq
    assert old_last is not None
    port = first.port
    await first.stop()
    await eventually(
        lambda: "no replay" in (fleet.status(first).degraded_reason or ""),
        within=30.0,
        what="the silence probe found no replay socket",
    )
    with caplog.at_level(logging.INFO, logger="subscriber.client"):
        second = await start_engine(
            name="e-short", port=port, events_endpoint=endpoint.events,
            replay_endpoint=endpoint.replay,
        )  # fmt: skip
        await arm(second, drop_batches=3)  # its first batches are not seen live
        await traffic(second, "second life", requests=6)
        await fleet.wait_in_sync(second)
    status = fleet.status(second)
    assert (status.last_seq or 0) > old_last
    assert status.restarts == 1
    assert status.resets.get("replay_unavailable") == 1
    restarts = [r for r in caplog.records if "engine restarted" in r.getMessage()]
    assert len(restarts) == 1, [r.getMessage() for r in restarts]


async def test_a_bound_event_socket_refuses_publishers_from_other_addresses(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    """The gateway binds; the engine connects from the pod's address (127.0.0.1). A rogue
    local process connecting from another address (127.0.0.3, all of 127/8 is loopback)
    with a forged batch for the pod is refused by the ZAP check and counted."""
    port = free_port()
    bound = f"tcp://127.0.0.1:{port}"
    server = await start_engine(events_endpoint=bound, events_mode="connect")
    await fleet.subscribe(server, events=bound, bind=True, allowed_peers=("127.0.0.1",))
    await traffic(server, "genuine")
    await fleet.wait_in_sync(server)
    pod = server.engine.config.name
    before = fleet.table.dump(pod)
    forged = KVEventBatch(0.0, (BlockStored(tuple(range(900, 930)), None,
                                            tuple(range(30 * 16)), 16),))  # fmt: skip
    context = zmq.asyncio.Context()
    rogue = context.socket(zmq.PUB)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(f"tcp://127.0.0.3:0;127.0.0.1:{port}")  # source address ; destination
    topic = server.engine.config.topic
    try:
        for _ in range(40):  # PUB drops until connected: keep sending, as the next batch
            seq = (fleet.status(server).last_seq or 0) + 1
            await rogue.send_multipart(encode_pub_message(topic, seq, encode_batch(forged)))
            await asyncio.sleep(0.02)
            if fleet.status(server).refused_peers >= 2:
                break
    finally:
        rogue.close(linger=0)
        context.destroy(linger=0)
    assert fleet.status(server).refused_peers >= 1
    assert fleet.table.dump(pod) == before  # nothing forged reached the index
    await traffic(server, "still genuine")
    await fleet.wait_in_sync(server)  # the engine's own connection is unaffected


async def test_an_idle_pod_is_probed_without_counting_replays(
    start_engine: StartEngine, fleet: Fleet
) -> None:
    """Silence is checked every idle_probe_s; those checks are idle probes, not replays (a
    dashboard of replays must show recoveries, not the clock)."""
    server = await start_engine()
    await fleet.subscribe(server)
    await traffic(server, "warm")
    await fleet.wait_in_sync(server)
    replays = fleet.status(server).replays
    probes = fleet.status(server).idle_probes
    await eventually(lambda: fleet.status(server).idle_probes >= probes + 3, within=10,
                     what="three idle probes")  # fmt: skip
    assert fleet.status(server).replays == replays
