"""The replica channel against hostile parties, on real ZMQ sockets and real gateways: a
process without the key can neither read nor feed it; a start-up that would expose it
without keys is refused; and what even a key holder sends is bounded — made-up models
evict nothing, fake load stays within what real load could produce, a frame flood keeps
memory bounded."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
import zmq
import zmq.asyncio

from gateway.cli import main
from gateway.control.replication import CurveKeys, ReplicaSync, load_keys
from gateway.control.replication.bounds import MIN_PEER_TICKETS_PER_POD
from gateway.control.replication.keys import public_of
from gateway.errors import ConfigError
from gateway.settings import Settings
from indexer import IndexConfig, SyncPrefixHashTable
from predictor import Predictor
from tests.gateway.conftest import MODEL, Gateway, StartGateway
from tests.gateway.test_replicas import EveryPod, body
from tests.helpers import eventually, free_ports, run_kvgate


def frame(replica: str, *messages: list[Any]) -> bytes:
    return bytes(msgpack.packb(["kvgate-sync", 2, replica, list(messages)]))


class Rogue:
    """A ZMQ PUB that speaks the wire format, bound where a replica expects a peer (as a
    process that took a down peer's port would)."""

    def __init__(self, endpoint: str, *, curve_secret: bytes | None = None) -> None:
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        if curve_secret is not None:  # a CURVE server with a key pair of its own
            self.pub.setsockopt(zmq.CURVE_SECRETKEY, curve_secret)
            self.pub.setsockopt(zmq.CURVE_SERVER, 1)
        self.pub.bind(endpoint)

    def send(self, payload: bytes) -> None:
        self.pub.send(payload)

    def close(self) -> None:
        self.pub.close(linger=0)
        self.context.term()


@contextlib.asynccontextmanager
async def running(*syncs: ReplicaSync) -> AsyncIterator[None]:
    tasks = []
    for sync in syncs:
        sync.start()
        tasks.append(asyncio.create_task(sync.run()))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sync in syncs:
            sync.close()


def replica(
    bind: str, peers: tuple[str, ...], keys: CurveKeys | None, **kwargs: Any
) -> ReplicaSync:
    """A channel on its own, in front of one pod `e0` that publishes events."""
    table = SyncPrefixHashTable(IndexConfig())
    table.register_pod("e0", MODEL)
    return ReplicaSync(bind=bind, peers=peers, table=table, cost=Predictor(),
                       fleet=EveryPod(lambda name: name == "e0"), keys=keys, heartbeat_s=0.1,
                       **kwargs)  # fmt: skip


# -- keys -----------------------------------------------------------------------------------


def test_the_key_command_prints_a_pair_that_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replica-keys"]) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == {"secret-key", "public-key"}
    assert public_of(lines["secret-key"]) == lines["public-key"]
    for name, value in lines.items():  # the Secret's files, as Kubernetes mounts them
        (tmp_path / name).write_text(value + "\n")
    keys = load_keys(None, (), tmp_path)
    assert keys is not None and keys.public == lines["public-key"]
    assert keys.trusted == (keys.public,) and lines["secret-key"] not in repr(keys)
    # The same pair through the environment variable (and Settings' validation).
    settings = Settings.load({"KVGATE_REPLICA_CURVE_SECRET_KEY": lines["secret-key"],
                              "KVGATE_REPLICA_SYNC_BIND": "tcp://0.0.0.0:5590"})  # fmt: skip
    assert settings.replica_curve_secret_key == lines["secret-key"]
    assert lines["secret-key"] not in repr(settings)
    # --kubernetes: a Secret manifest holding the pair under the directory's file names.
    done = run_kvgate("replica-keys", "--kubernetes", "--namespace", "llm")
    assert done.returncode == 0, done.stderr
    secret = yaml.safe_load(done.stdout)
    assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == "llm"
    data = secret["stringData"]
    assert public_of(data["secret-key"]) == data["public-key"] != keys.public  # a new pair
    (tmp_path / "public-key").write_text(data["public-key"])  # not secret-key's own
    with pytest.raises(ConfigError) as mismatch:
        load_keys(None, (), tmp_path)
    assert "public-key" in str(mismatch.value) and lines["secret-key"] not in str(mismatch.value)


def serve_error(pods: Path | None = None, **env: str) -> tuple[int, list[str]]:
    flags = ["--pods", str(pods)] if pods is not None else []
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "1", *flags],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **env},
    )  # fmt: skip
    return result.returncode, result.stderr.splitlines()


@pytest.mark.parametrize("bind", ["tcp://0.0.0.0:5590", "tcp://10.1.2.3:5590",
                                  "tcp://kvgate-0.kvgate-sync:5590"])  # fmt: skip
def test_a_bind_beyond_loopback_without_keys_refuses_to_start_in_one_line(bind: str) -> None:
    status, lines = serve_error(KVGATE_REPLICA_SYNC_BIND=bind)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(
        f"kvgate serve: invalid configuration: KVGATE_REPLICA_SYNC_BIND={bind!r}"
    )
    assert "KVGATE_REPLICA_CURVE_SECRET_KEY" in lines[0] and "kvgate replica-keys" in lines[0]


def test_loopback_and_ipc_binds_need_no_keys_and_a_bad_key_is_never_shown(tmp_path: Path) -> None:
    for bind in ("tcp://127.0.0.1:5590", "tcp://localhost:5590", "tcp://127.0.0.2:5590",
                 f"ipc://{tmp_path}/sync"):  # fmt: skip
        assert Settings.load({"KVGATE_REPLICA_SYNC_BIND": bind}).replica_sync_bind == bind
    almost = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf"  # 39 characters of a secret
    status, lines = serve_error(KVGATE_REPLICA_CURVE_SECRET_KEY=almost,
                                KVGATE_REPLICA_SYNC_BIND="tcp://0.0.0.0:5590")  # fmt: skip
    assert status == 2 and len(lines) == 1 and almost not in lines[0]
    assert "KVGATE_REPLICA_CURVE_SECRET_KEY='(hidden)' is invalid" in lines[0]
    pods, empty = tmp_path / "pods.json", tmp_path / "keys"
    pods.write_text('{"pods": []}')
    empty.mkdir()
    status, lines = serve_error(pods, KVGATE_REPLICA_CURVE_KEYS_DIR=str(empty),
                                KVGATE_REPLICA_SYNC_BIND="tcp://0.0.0.0:5590")  # fmt: skip
    assert status == 2 and len(lines) == 1 and "keys/secret-key" in lines[0], lines


# -- who may read and feed the channel --------------------------------------------------------


async def test_without_a_trusted_key_nobody_reads_or_feeds_the_channel() -> None:
    keys = CurveKeys.of(zmq.curve_keypair()[1].decode())
    ports = free_ports(4)
    a_end, b_end, plain_end, curve_end = (f"tcp://127.0.0.1:{port}" for port in ports)
    # The rogues took the ports of two peers that are down: one speaks plain ZMQ, one
    # CURVE with a key pair of its own.
    rogues = [Rogue(plain_end), Rogue(curve_end, curve_secret=zmq.curve_keypair()[1])]
    a = replica(a_end, (b_end, plain_end, curve_end), keys)
    b = replica(b_end, (a_end,), keys)
    context = zmq.asyncio.Context()
    readers = []
    for mechanism in ("plain", "curve"):  # and two readers without the key
        reader = context.socket(zmq.SUB)
        reader.setsockopt(zmq.LINGER, 0)
        reader.setsockopt(zmq.SUBSCRIBE, b"")
        if mechanism == "curve":  # the server key is public; its own pair is not trusted
            public, own_secret = zmq.curve_keypair()
            reader.setsockopt(zmq.CURVE_SECRETKEY, own_secret)
            reader.setsockopt(zmq.CURVE_PUBLICKEY, public)
            reader.setsockopt(zmq.CURVE_SERVERKEY, keys.public.encode())
        reader.connect(a_end)
        readers.append(reader)
    try:
        async with running(a, b):
            await eventually(lambda: a.live_peers() == 1 and b.live_peers() == 1,
                             what="the replicas with the key hear each other")  # fmt: skip

            async def flood() -> bool:  # the rogues keep sending what a peer would
                for rogue in rogues:
                    rogue.send(frame("rogue", ["h"], ["d", 1, "e0", MODEL, None, [1, 2], 9e6]))
                return a.rejected["refused_key"] >= 1 and a.rejected["handshake_failed"] >= 1

            await eventually(flood, what="both readers refused at the PUB")
            for _ in range(20):
                await flood()
                await asyncio.sleep(0.02)
            assert set(a.peers) == {b.replica}  # nothing from the rogues arrived
            assert a.received["d"] == 0 and a.cost.outstanding("e0") == (0.0, 0, 0)
            assert b.received["h"] >= 1 and a.sent["h"] >= 1
            for reader in readers:  # a's heartbeats went to b, never to them
                assert not await reader.poll(timeout=200)
            assert a.view()["curve"] == {"public_key": keys.public, "trusted_keys": 1}
    finally:
        for reader in readers:
            reader.close(linger=0)
        context.term()
        for rogue in rogues:
            rogue.close()


async def test_replicas_with_different_pairs_talk_when_each_trusts_the_other() -> None:
    """A key rotation: the old and the new pair, each listing the other's public key."""
    old, new = (zmq.curve_keypair()[1].decode() for _ in range(2))
    a_end, b_end = (f"tcp://127.0.0.1:{port}" for port in free_ports(2))
    a = replica(a_end, (b_end,), CurveKeys.of(old, [public_of(new)]))
    b = replica(b_end, (a_end,), CurveKeys.of(new, [public_of(old)]))
    async with running(a, b):
        await eventually(lambda: a.live_peers() == 1 and b.live_peers() == 1,
                         what="the two pairs hear each other")  # fmt: skip
        assert a.rejected["refused_key"] == 0 and b.rejected["refused_key"] == 0


# -- what a peer with the key can do ------------------------------------------------------------


async def gateway_with_rogue_peer(
    start_gateway: StartGateway, tmp_path: Path
) -> tuple[Gateway, Rogue, Callable[..., None]]:
    """A gateway in front of two engines (KV events: its index is whole) that follows a
    rogue peer; `send(*messages)` delivers frames from it once the subscription is up."""
    rogue_end = f"ipc://{tmp_path}/rogue.sync"
    rogue = Rogue(rogue_end)
    gateway = await start_gateway(engines=2, replica_sync_bind=f"ipc://{tmp_path}/g.sync",
                                  replica_peers=(rogue_end,))  # fmt: skip
    sync = gateway.state.replica_sync

    async def subscribed() -> bool:
        rogue.send(frame("rogue", ["h"]))
        return "rogue" in sync.peers

    await eventually(subscribed, what="the gateway hears the rogue peer")

    def send(*messages: list[Any]) -> None:
        for start in range(0, len(messages), 1000):
            rogue.send(frame("rogue", *messages[start : start + 1000]))

    return gateway, rogue, send


async def matched(gateway: Gateway) -> dict[str, int]:
    async with gateway.admin() as admin:
        answer = (await admin.post("/admin/match", json=body("a question"))).json()
    return {pod: view["matched_blocks"] for pod, view in answer["pods"].items()}


async def test_decisions_for_made_up_models_evict_nothing_of_the_real_one(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    gateway, rogue, send = await gateway_with_rogue_peer(start_gateway, tmp_path)
    sync, table = gateway.state.replica_sync, gateway.state.table
    try:
        async with gateway.client() as client:
            answer = await client.post("/v1/chat/completions", json={**body("hi"), "stream": False})
            assert answer.status_code == 200
        pod = answer.headers["x-kvgate-pod"]

        async def stored() -> bool:
            return (await matched(gateway))[pod] > 0

        await eventually(stored, what="the engine's blocks indexed")
        before, stats = await matched(gateway), table.stats()
        # 2,100 decisions naming made-up models (and LoRA adapters) on both real pods, then
        # the real model with 16,384 random hashes per decision (as much as a frame holds).
        send(*(["d", n, f"e{n % 2}", f"made-up-{n}", None if n % 3 else "lora", [n, n + 1], 10.0]
               for n in range(2_100)))  # fmt: skip
        for n in range(40):
            hashes = list(range(n * 20_000, n * 20_000 + 16_384))
            rogue.send(frame("rogue", ["d", 10_000 + n, pod, MODEL, None, hashes, 10.0]))
        await eventually(lambda: sync.rejected["unknown_model"] == 2_100
                         and sync.rejected["index_full"] + sync.received["d"] >= 40,
                         what="every decision seen")  # fmt: skip
        assert sync.rejected["index_full"] >= 30  # half the pod's entries at most
        after = table.stats()
        assert after.contexts == stats.contexts and after.evicted_contexts == 0
        assert after.evicted_blocks == 0
        assert after.expected <= table.config.limits.max_expected_per_pod // 2 + stats.expected
        assert await matched(gateway) == before  # the real model's blocks, all still there
        async with gateway.client() as client:
            page = (await client.get("/metrics")).text
        assert 'kvgate_replica_sync_rejected_total{reason="unknown_model"} 2100.0' in page
        assert 'kvgate_replica_sync_rejected_total{reason="refused_key"} 0.0' in page
    finally:
        rogue.close()


async def test_fake_load_stays_within_what_real_requests_could_make(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    gateway, rogue, send = await gateway_with_rogue_peer(start_gateway, tmp_path)
    sync, cost, models = gateway.state.replica_sync, gateway.state.router.cost, gateway.state.models
    try:
        await eventually(lambda: models.max_model_len(MODEL) is not None,
                         what="the engines' model cards read")  # fmt: skip
        longest = models.max_model_len(MODEL)
        # 2,100 requests of 10 M uncached tokens each on e0, and first bytes for half of
        # them (decoding sequences count too), while the rogue keeps sending heartbeats.
        send(*(["d", n, "e0", MODEL, None, [], 10_000_000] for n in range(2_100)))
        send(*(["b", n] for n in range(0, 2_100, 2)))
        await eventually(lambda: sync.rejected["excess_load"] >= 2_100 - MIN_PEER_TICKETS_PER_POD,
                         what="the decisions seen")  # fmt: skip
        tokens, prefilling, decoding = cost.outstanding("e0")
        assert prefilling + decoding == MIN_PEER_TICKETS_PER_POD  # the engine reports no load
        assert tokens <= prefilling * longest
        # What the most real requests could put there: as many prompts of the model's
        # greatest length, sent by this replica itself.
        real = Predictor(gateway.state.settings.cost_params())
        for _ in range(MIN_PEER_TICKETS_PER_POD):
            real.start(real.predict("e0", longest, 0.0), streamed=True)
        faked = cost.predict("e0", 1_000, 0.0).ttft_s
        assert 0 < faked <= real.predict("e0", 1_000, 0.0).ttft_s * 1.001
        async with gateway.admin() as admin:
            view = (
                await admin.post(
                    "/admin/match", json=body("q"), headers={"x-kvgate-policy": "predicted-latency"}
                )
            ).json()
        predicted = view["pods"]["e0"]["predicted_ttft_ms"]
        assert predicted is not None and predicted < 1e3 * faked * 2
    finally:
        rogue.close()


async def test_a_live_peers_requests_expire_all_the_same(tmp_path: Path) -> None:
    """Heartbeats keep a peer live, not its requests: each goes after the bound."""
    rogue_end = f"ipc://{tmp_path}/rogue.sync"
    rogue = Rogue(rogue_end)
    sync = replica(f"ipc://{tmp_path}/a.sync", (rogue_end,), None, ticket_ttl_s=1.0)
    try:
        async with running(sync):

            async def beating() -> bool:
                rogue.send(frame("rogue", ["h"]))
                return "rogue" in sync.peers

            await eventually(beating, what="the rogue heard")
            rogue.send(frame("rogue", *(["d", n, "e0", MODEL, None, [], 500] for n in range(8))))
            await eventually(lambda: sync.cost.outstanding("e0")[1] == 8, what="load queued")

            async def dropped() -> bool:
                await beating()
                return sync.cost.outstanding("e0") == (0.0, 0, 0)

            await eventually(dropped, what="the requests expired while the peer beats")
            assert sync.expired == 8 and sync.losses == 0 and sync.live_peers() == 1
    finally:
        rogue.close()


FLOOD = """
import sys, msgpack, zmq
context = zmq.Context()
pub = context.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 100)
pub.bind(sys.argv[1])
hashes = list(range(2**63, 2**63 + 16_000))
messages = [["d", n, "e0", "m", None, hashes[n:n + 1_000], 10.0] for n in range(26)]
payload = msgpack.packb(["kvgate-sync", 2, "flood", messages])
assert len(payload) < 256 * 1024
while True:
    pub.send(payload)
"""


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_a_frame_flood_keeps_memory_bounded(tmp_path: Path) -> None:
    """A peer sending ~250 KiB frames as fast as it can, for 4 s: what waits for the
    replica is bounded by the receive queue, and everything beyond the rate is refused."""
    endpoint = f"ipc://{tmp_path}/flood.sync"
    sync = replica(f"ipc://{tmp_path}/a.sync", (endpoint,), None)
    flood = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOD, endpoint)
    try:
        async with running(sync):
            await eventually(lambda: sync.received["d"] > 0, what="the flood arrives")
            before = rss_bytes()
            loop = asyncio.get_running_loop()
            lag, end = 0.0, loop.time() + 4
            while loop.time() < end:  # the event loop keeps serving others meanwhile
                asked = loop.time()
                await asyncio.sleep(0.01)
                lag = max(lag, loop.time() - asked - 0.01)
            grown = rss_bytes() - before
        assert sync.rejected["rate_limited"] > 0
        assert grown < 96 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB"
        assert lag < 1.0, f"the event loop stalled for {lag:.2f} s"
    finally:
        flood.kill()
        await flood.wait()
