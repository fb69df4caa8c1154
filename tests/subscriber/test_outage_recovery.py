"""An engine down for longer than a replay can wait, then back on the same address.

While it is down the subscriber's replay times out, so it resets the pod and waits for a
new baseline. Once the engine answers again the subscriber must rebuild the pod whole from
the replay buffer, whether or not the engine publishes anything (an idle engine that just
restarted publishes nothing for a while).
"""

from __future__ import annotations

import httpx

from indexer import IndexConfig, SyncPrefixHashTable, Tier
from simulator import EngineServer
from subscriber import IndexSink, PodEndpoint, SubscriberManager, SubscriberSettings
from tests.conftest import StartEngine
from tests.helpers import eventually

SETTINGS = SubscriberSettings(
    replay_timeout_s=0.3, reconnect_initial_s=0.05, reconnect_max_s=0.5, idle_probe_s=0.3
)


async def _complete(server: EngineServer, prompt: str) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 4}
        assert (await client.post("/v1/completions", json=body)).status_code == 200


async def _cache(server: EngineServer) -> dict[str, set[int]]:
    async with httpx.AsyncClient(base_url=server.url) as client:
        tiers = (await client.get("/sim/cache")).json()["tiers"]
    return {tier: set(hashes) for tier, hashes in tiers.items()}


async def test_pod_is_whole_again_after_an_outage_longer_than_the_replay_timeout(
    start_engine: StartEngine,
) -> None:
    table = SyncPrefixHashTable(IndexConfig(block_size=16))
    first = await start_engine(name="e-outage")
    endpoint = PodEndpoint(
        name="e-outage",
        model="sim-model",
        events=first.engine.publisher.events_endpoint,
        replay=first.engine.publisher.replay_endpoint,
        topic="kv-events",
    )

    async with SubscriberManager(IndexSink(table), settings=SETTINGS) as manager:
        await manager.upsert(endpoint)

        async def in_sync(server: EngineServer) -> bool:
            status = manager.status("e-outage")
            if status is None or not status.whole or not table.has_pod("e-outage"):
                return False
            held = table.dump_tiers("e-outage")
            indexed = {t.name: held[t] for t in (Tier.GPU, Tier.CPU, Tier.STORAGE)}
            return indexed == await _cache(server)

        await _complete(first, "before the outage " * 12)
        await eventually(lambda: in_sync(first), what="index == engine before the outage")
        port = first.port
        await first.stop()
        # The replay times out: the pod is reset and marked degraded.
        await eventually(
            lambda: "no replay" in str(manager.status("e-outage").degraded_reason),  # type: ignore[union-attr]
            what="pod degraded while the engine is down",
        )
        assert not table.dump("e-outage")
        second = await start_engine(
            name="e-outage",
            port=port,
            events_endpoint=endpoint.events,
            replay_endpoint=endpoint.replay,
        )
        # No traffic: the idle probe asks the replay buffer again and finds a fresh engine.
        await eventually(lambda: in_sync(second), what="whole again without traffic")
        await _complete(second, "after the outage " * 12)
        await eventually(lambda: in_sync(second), what="index == engine after the outage")


async def _next_seq(server: EngineServer) -> int:
    async with httpx.AsyncClient(base_url=server.url) as client:
        seq: int = (await client.get("/sim/stats")).json()["publisher"]["next_seq"]
    return seq


async def test_restarted_engine_whose_seq_caught_up_while_disconnected_is_rebuilt(
    start_engine: StartEngine,
) -> None:
    """The engine restarts and, before the subscriber's socket reconnects, publishes as many
    batches as the old one had: the first batch seen live then carries exactly the expected
    seq. Only the reconnection tells a restart happened; the subscriber must check."""
    settings = SubscriberSettings(
        replay_timeout_s=1.0, reconnect_initial_s=0.05, reconnect_max_s=0.5, idle_probe_s=60
    )
    table = SyncPrefixHashTable(IndexConfig(block_size=16))
    first = await start_engine(name="e-seq")
    endpoint = PodEndpoint(
        name="e-seq",
        model="sim-model",
        events=first.engine.publisher.events_endpoint,
        replay=first.engine.publisher.replay_endpoint,
        topic="kv-events",
    )
    async with SubscriberManager(IndexSink(table), settings=settings) as manager:
        await manager.upsert(endpoint)

        async def in_sync(server: EngineServer) -> bool:
            status = manager.status("e-seq")
            if status is None or not status.whole or not table.has_pod("e-seq"):
                return False
            held = table.dump_tiers("e-seq")
            indexed = {t.name: held[t] for t in (Tier.GPU, Tier.CPU, Tier.STORAGE)}
            return indexed == await _cache(server)

        await _complete(first, "old engine one " * 12)
        await _complete(first, "old engine two " * 12)
        assert await _next_seq(first) == 2
        await eventually(lambda: in_sync(first), what="index == old engine")
        port = first.port
        await first.stop()
        await eventually(lambda: not manager.status("e-seq").connected, what="disconnect seen")  # type: ignore[union-attr]
        second = await start_engine(
            name="e-seq", port=port, events_endpoint=endpoint.events,
            replay_endpoint=endpoint.replay,
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=second.url) as client:
            armed = await client.post("/sim/faults", json={"drop_batches": 2})
            assert armed.status_code == 200
        await _complete(second, "new engine one " * 12)  # seq 0, never seen live
        await _complete(second, "new engine two " * 12)  # seq 1, never seen live
        assert await _next_seq(second) == 2
        await eventually(lambda: manager.status("e-seq").connected, what="reconnected")  # type: ignore[union-attr]
        await _complete(second, "new engine three " * 12)  # seq 2: the seq expected next
        await eventually(lambda: in_sync(second), what="index == the new engine")
        assert manager.status("e-seq").restarts >= 1  # type: ignore[union-attr]
