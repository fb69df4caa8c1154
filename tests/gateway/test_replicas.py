"""Replicas sharing their routing decisions over ZMQ: what one routes, the other sees
(expected blocks, queued prefill); a peer that falls silent leaves no load behind; a
hostile or broken message is counted and ignored."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from gateway.control.replication import MAX_MESSAGE_BYTES, ReplicaSync
from gateway.errors import ConfigError
from indexer import IndexConfig, ModelContext, SyncPrefixHashTable
from predictor import Predictor
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, Gateway, StartGateway, pod_entry
from tests.helpers import eventually


class EveryPod:
    """A `Fleet` whose pods (those `pods` accepts) serve every model, each in its own
    context: a channel tested on its own, without a gateway."""

    def __init__(self, pods: Callable[[str], bool]) -> None:
        self._pods = pods

    def known_pod(self, pod: str) -> bool:
        return self._pods(pod)

    def context_of(self, pod: str, model: str, lora: str | None) -> ModelContext | None:
        return ModelContext(model, lora) if self._pods(pod) else None

    def prompt_ceiling(self, model: str) -> int:
        return 131_072

    def concurrency(self, pod: str) -> float:
        return 0.0


PROMPT = "the same long system prompt for every question " * 40


def body(user: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": PROMPT}, {"role": "user", "content": user}],
        "max_tokens": 2,
        "stream": True,
    }


async def two_replicas(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> tuple[Gateway, Gateway]:
    """Two gateways in front of the same two engines, which publish no KV events: what a
    replica knows of the other's requests comes only from the sync channel."""
    engines = [await start_engine(name=f"e{i}") for i in range(2)]
    entries = [pod_entry(engine, events=False) for engine in engines]
    a_end, b_end = f"ipc://{tmp_path}/a.sync", f"ipc://{tmp_path}/b.sync"
    first = await start_gateway(engines=0, pods=entries, replica_sync_bind=a_end,
                                replica_peers=(b_end,))  # fmt: skip
    second = await start_gateway(engines=0, pods=entries, replica_sync_bind=b_end,
                                 replica_peers=(a_end,))  # fmt: skip
    return first, second


async def matched_on(gateway: Gateway, pod: str) -> int:
    async with gateway.admin() as admin:
        answer = (await admin.post("/admin/match", json=body("a question"))).json()
    return int(answer["pods"][pod]["matched_blocks"])


async def test_a_decision_on_one_replica_is_seen_by_the_other(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    first, second = await two_replicas(start_engine, start_gateway, tmp_path)
    sync_a, sync_b = first.state.replica_sync, second.state.replica_sync
    await eventually(lambda: sync_a.live_peers() == 1 and sync_b.live_peers() == 1,
                     within=10, what="peers heard each other's heartbeats")  # fmt: skip
    async with (
        first.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body("hi")) as response,
    ):
        assert response.status_code == 200
        await response.aread()
        pod = response.headers["x-kvgate-pod"]

    async def seen() -> bool:
        return await matched_on(second, pod) > 0

    await eventually(seen, what="the other replica expects the prompt's blocks there")
    other = next(name for name in ("e0", "e1") if name != pod)
    assert await matched_on(second, other) == 0
    received = sync_b.peers[sync_a.replica].received
    await eventually(lambda: received["f"] >= 1, what="the end of the exchange shared")
    assert received["d"] == 1 and received["b"] == 1
    # The next turn: the first replica shares only the blocks the pod does not hold yet,
    # and the other replica's view of the whole longer prompt is complete.
    later = body("hi")
    later["messages"] = [*later["messages"], {"role": "assistant", "content": "hello " * 40},
                         {"role": "user", "content": "and now? " * 20}]  # fmt: skip
    sent = sync_a.sent["d"]
    async with first.client() as client:
        answer = await client.post("/v1/chat/completions", json={**later, "stream": False})
        assert answer.status_code == 200 and answer.headers["x-kvgate-pod"] == pod
    assert sync_a.sent["d"] == sent + 1
    await eventually(lambda: received["f"] >= 2, what="the second turn shared")
    async with second.admin() as admin:
        view = (await admin.post("/admin/match", json=later)).json()
    assert view["pods"][pod]["matched_blocks"] == view["prompt_blocks"] > 0
    assert second.state.router.cost.outstanding(pod) == (0.0, 0, 0)  # nothing left behind
    async with second.admin() as admin:
        view = (await admin.get("/admin/pods")).json()["replica_sync"]
    assert view["peers"][0]["replica"] == sync_a.replica and view["peers"][0]["live"]
    async with second.client() as client:
        page = (await client.get("/metrics")).text
    assert 'kvgate_replica_sync_messages_total{direction="received",kind="d"} 2.0' in page
    assert "kvgate_replica_sync_peers_live 1.0" in page


async def test_a_silent_peers_requests_are_dropped_and_bad_messages_ignored(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    gateway = await start_gateway(engines=2, replica_sync_bind=f"ipc://{tmp_path}/g.sync")
    sync = gateway.state.replica_sync
    cost = gateway.state.router.cost

    def message(*fields: Any) -> bytes:
        return bytes(msgpack.packb(["kvgate-sync", 2, "ghost-replica", [list(fields)]]))

    sync.receive(message("d", 7, "e0", MODEL, None, [1, 2, 3], 1500.0))
    assert cost.outstanding("e0") == (1500.0, 1, 0)  # another replica's prefill queued there
    for bad in (
        b"\xc1 not msgpack",
        message("d", 8, "e0", MODEL, None, [-1], 10.0),  # a hash out of range
        message("d", 9, "e0", MODEL, None, [1], float("nan")),
        message("d", 10, "no-such-pod", MODEL, None, [1], 10.0),
        message("x"),
        bytes(msgpack.packb(["other-wire", 2, "ghost-replica", [["h"]]])),
        bytes(msgpack.packb(["kvgate-sync", 1, "ghost-replica", "h"])),  # the old version
        bytes(msgpack.packb(["kvgate-sync", 2, "ghost-replica", []])),  # an empty frame
        bytes(msgpack.packb(["kvgate-sync", 2, "ghost-replica", [3, ["h"]]])),  # half bad
    ):
        sync.receive(bad)
    assert sum(sync.rejected.values()) == 9
    assert cost.outstanding("e0") == (1500.0, 1, 0)
    # The ghost never sends a heartbeat: after the timeout its request is dropped.
    await eventually(lambda: cost.outstanding("e0") == (0.0, 0, 0), within=10,
                     what="the silent peer's request dropped")  # fmt: skip
    assert sync.peers["ghost-replica"].losses == 1


async def test_peers_found_through_a_service_name(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    """As a headless Service resolves to every replica: `localhost:PORT` resolves to the
    first replica's address, and the second connects to it."""
    engines = [await start_engine(name=f"e{i}") for i in range(2)]
    entries = [pod_entry(engine) for engine in engines]
    with socket.socket() as probe:  # a port free right now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = await start_gateway(engines=0, pods=entries,
                                replica_sync_bind=f"tcp://127.0.0.1:{port}")  # fmt: skip
    second = await start_gateway(engines=0, pods=entries,
                                 replica_sync_bind=f"ipc://{tmp_path}/second.sync",
                                 replica_peer_service=f"localhost:{port}")  # fmt: skip
    sync = second.state.replica_sync
    await eventually(lambda: first.state.replica_sync.replica in sync.peers, within=10,
                     what="the peer found by name and heard")  # fmt: skip
    assert f"tcp://127.0.0.1:{port}" in sync.view()["peer_endpoints"]


def test_a_sync_port_already_taken_stops_start_up_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        table = SyncPrefixHashTable(IndexConfig())
        sync = ReplicaSync(bind=endpoint, peers=(), table=table, cost=Predictor(),
                           fleet=EveryPod(lambda name: False))  # fmt: skip
        try:
            with pytest.raises(ConfigError) as refused:
                sync.start()
        finally:
            sync.close()
    assert refused.value.variable == "KVGATE_REPLICA_SYNC_BIND"


async def test_a_burst_of_decisions_leaves_in_frames_a_peer_accepts(tmp_path: Path) -> None:
    """One event-loop turn's messages share a frame, but never one over the peers'
    MAXMSGSIZE (ZMQ would drop the connection): 40 decisions of 4,000 hashes each."""
    endpoint = f"ipc://{tmp_path}/burst.sync"
    cost = Predictor()
    sync = ReplicaSync(bind=endpoint, peers=(), table=SyncPrefixHashTable(IndexConfig()),
                       cost=cost, fleet=EveryPod(lambda name: True))  # fmt: skip
    sync.start()
    context = zmq.asyncio.Context()
    peer = context.socket(zmq.SUB)
    peer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    peer.setsockopt(zmq.SUBSCRIBE, b"")
    peer.connect(endpoint)
    try:
        # The subscription reaches the PUB asynchronously: heartbeats until one arrives.
        async def heard() -> bool:
            sync.flush()
            sync._send(["h"])
            sync.flush()
            return bool(await peer.poll(timeout=50))

        await eventually(heard, what="the peer subscribed")
        while await peer.poll(timeout=50):
            await peer.recv()
        for number in range(40):  # one turn: no await between them
            ticket = cost.start(cost.predict("e0", 64_000, 0.0), streamed=True)
            sync.decided(ticket, ModelContext(MODEL), list(range(number, number + 4_000)))
        frames = []
        while len(frames) < 40 and await peer.poll(timeout=2_000):
            frame = await peer.recv()
            assert len(frame) <= MAX_MESSAGE_BYTES
            frames.extend(m for m in msgpack.unpackb(frame)[3] if m[0] == "d")
        assert len(frames) == 40  # every decision arrived: the connection survived
        assert sync.sent["d"] == 40 and sync.dropped == 0
    finally:
        peer.close(linger=0)
        context.term()
        sync.close()
