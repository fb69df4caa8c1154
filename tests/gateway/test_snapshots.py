"""Index snapshots end to end: real gateways over real simulated engines, restarted on the
same snapshot directory, bootstrapped from a peer, fed damaged files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.control.persistence import file_name
from gateway.control.persistence.files import COST_MODEL_FILE
from gateway.errors import ConfigError
from gateway.settings import Settings
from indexer import decode_snapshot
from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.conftest import MODEL, Gateway, StartGateway, pod_entry
from tests.helpers import eventually

FILLER = "lorem ipsum dolor sit amet " * 12  # ~10 blocks of 16 tokens per prompt


async def send(engine: EngineServer, count: int, tag: str, *, length: int = 1) -> None:
    """Requests straight to the engine (not through any gateway): one event batch each,
    of about 10 × `length` blocks."""
    async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
        for i in range(count):
            body = {"model": MODEL, "prompt": f"{tag} {i} {FILLER * length}", "max_tokens": 2}
            response = await client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text


async def engine_truth(engine: EngineServer) -> dict[str, set[Any]]:
    async with httpx.AsyncClient(base_url=engine.url) as client:
        tiers = (await client.get("/sim/cache")).json()["tiers"]
    return {tier: set(hashes) for tier, hashes in tiers.items()}


async def index_of(gw: Gateway, pod: str) -> dict[str, Any]:
    async with gw.admin() as admin:
        response = await admin.get("/admin/index", params={"pod": pod})
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    view["engine_hashes"] = {tier: set(h) for tier, h in view["engine_hashes"].items()}
    return view


async def wait_equal(gw: Gateway, engines: list[EngineServer], *, state: str = "whole") -> None:
    """Every pod's index equals its engine's cache, in `state`."""

    async def equal() -> bool:
        for engine in engines:
            view = await index_of(gw, engine.engine.config.name)
            if view["state"] != state or view["engine_hashes"] != await engine_truth(engine):
                return False
        return True

    await eventually(equal, within=20, what=f"every index {state} and equal to its engine")


def sample(gw: Gateway, name: str, **labels: str) -> float:
    value = gw.state.metrics.prometheus.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def start_fleet(start_engine: StartEngine, **overrides: Any) -> list[EngineServer]:
    return [await start_engine(name=f"e{i}", **overrides) for i in range(2)]


def entries(engines: list[EngineServer]) -> list[dict[str, Any]]:
    return [pod_entry(engine) for engine in engines]


async def index_then_stop(
    start_gateway: StartGateway, engines: list[EngineServer], snaps: Path, batches: int, tag: str
) -> None:
    """A gateway with snapshots follows `batches` requests per engine, then stops cleanly
    (writing its final snapshots)."""
    first = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    for engine in engines:
        await send(engine, batches, tag)
    await wait_equal(first, engines)
    await first.server.stop()


async def test_a_restarted_gateway_resumes_from_its_snapshots(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    # A replay buffer far smaller than the history: without the snapshots the second
    # gateway could only be degraded.
    engines = await start_fleet(start_engine, replay_buffer=8)
    snaps = tmp_path / "snapshots"
    first = await start_gateway(
        engines=0, pods=entries(engines), snapshot_dir=snaps, snapshot_interval_s=0.1
    )
    await wait_equal(first, engines)
    for engine in engines:
        await send(engine, 20, "before")
    await wait_equal(first, engines)
    await first.server.stop()  # a clean shutdown writes a final snapshot of each pod
    assert sorted(p.name for p in snaps.iterdir()) == [file_name("e0"), file_name("e1")]
    for engine in engines:
        await send(engine, 3, "meanwhile")  # within the replay buffer

    second = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    await wait_equal(second, engines)
    assert sample(second, "kvgate_snapshots_restored_total", source="file") == 2
    for name in ("e0", "e1"):
        status = second.state.subscribers.status(name)
        assert status.restarts == 0 and status.whole  # resumed, not rebuilt


async def test_a_snapshot_of_another_engine_incarnation_is_discarded_and_rebuilt(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    engines = await start_fleet(start_engine)
    snaps = tmp_path / "snapshots"
    await index_then_stop(start_gateway, engines, snaps, 5, "old")
    restarted = engines[0]
    async with httpx.AsyncClient(base_url=restarted.url) as client:
        spec = {"restart_publisher": True, "wipe_cache": True}  # seq from 0, empty cache
        assert (await client.post("/sim/faults", json=spec)).status_code == 200
    await send(restarted, 2, "new")

    second = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    await wait_equal(second, engines)
    assert sample(second, "kvgate_snapshots_restored_total", source="file") == 2
    assert second.state.subscribers.status("e0").restarts == 1  # noticed by the digest
    assert second.state.subscribers.status("e1").restarts == 0


async def test_a_snapshot_the_replay_buffer_no_longer_reaches_is_discarded(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    # A small cache: the blocks in the snapshot are evicted by the batches it misses.
    engines = await start_fleet(start_engine, replay_buffer=4, gpu_blocks=64)
    snaps = tmp_path / "snapshots"
    first = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    await send(engines[0], 5, "old")
    await wait_equal(first, engines)
    stale = (await index_of(first, "e0"))["engine_hashes"]["GPU"]
    await first.server.stop()
    await send(engines[0], 10, "new")  # more batches than the buffer holds
    assert stale - (await engine_truth(engines[0]))["GPU"], "the engine evicted nothing"

    second = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    await wait_equal(second, engines[1:])

    async def rebuilt() -> bool:
        view = await index_of(second, "e0")
        held = view["engine_hashes"]["GPU"]
        return view["state"] == "degraded" and bool(held) and not held & stale
        # (degraded: blocks stored in the lost batches and still held are unknown)

    await eventually(rebuilt, what="e0 rebuilt from the replay buffer without the snapshot")
    assert (await index_of(second, "e0"))["engine_hashes"]["GPU"] <= (
        await engine_truth(engines[0])
    )["GPU"]


async def test_a_snapshot_of_a_degraded_index_resumes_degraded(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    engines = [await start_engine(name="e0", replay_buffer=2)]
    await send(engines[0], 5, "before any gateway")  # older than the buffer: never known
    snaps = tmp_path / "snapshots"
    first = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    await eventually(lambda: not first.state.subscribers.status("e0").whole, what="degraded")
    await send(engines[0], 1, "seen")
    await eventually(
        lambda: first.state.subscribers.status("e0").last_seq == 5, what="last batch applied"
    )
    known = (await index_of(first, "e0"))["engine_hashes"]
    await first.server.stop()

    second = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    assert sample(second, "kvgate_snapshots_restored_total", source="file") == 1
    view = await index_of(second, "e0")
    assert view["state"] == "degraded" and view["engine_hashes"] == known
    assert second.state.subscribers.status("e0").restarts == 0


async def test_damaged_snapshots_are_ignored_counted_and_rebuilt_by_replay(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    engines = await start_fleet(start_engine)
    snaps = tmp_path / "snapshots"
    await index_then_stop(start_gateway, engines, snaps, 3, "x")
    good = (snaps / file_name("e1")).read_bytes()
    (snaps / file_name("e1")).write_bytes(good[: len(good) // 2])  # a torn write
    (snaps / file_name("e0")).write_bytes(b"\x00" * 100)  # not a snapshot at all
    (snaps / f".{file_name('e0')}.123.0.tmp").write_bytes(good)  # a crash mid-write

    second = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    await wait_equal(second, engines)
    assert sample(second, "kvgate_snapshots_ignored_total", reason="truncated") == 1
    assert sample(second, "kvgate_snapshots_ignored_total", reason="bad_magic") == 1
    assert sample(second, "kvgate_snapshots_restored_total", source="file") == 0
    assert not any(p.name.endswith(".tmp") for p in snaps.iterdir())


async def test_admin_snapshot_serves_the_pods_current_snapshot(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1)
    await send(gw.engines[0], 2, "y")
    await wait_equal(gw, gw.engines)
    async with gw.client() as client:
        assert (await client.get("/admin/snapshot", params={"pod": "e0"})).status_code == 401
    async with gw.admin() as admin:
        assert (await admin.get("/admin/snapshot")).status_code == 400
        assert (await admin.get("/admin/snapshot", params={"pod": "nope"})).status_code == 404
        response = await admin.get("/admin/snapshot", params={"pod": "e0"})
    assert response.status_code == 200
    snapshot = decode_snapshot(response.content)
    status = gw.state.subscribers.status("e0")
    assert (snapshot.pod, snapshot.model, snapshot.seq) == ("e0", MODEL, status.last_seq)
    assert snapshot.whole and int(response.headers["x-kvgate-snapshot-seq"]) == snapshot.seq
    held = {h for group in snapshot.index.groups for h, _, _ in group.records}
    assert held == (await engine_truth(gw.engines[0]))["GPU"]


async def test_a_new_replica_bootstraps_from_a_running_one(
    start_engine: StartEngine, start_gateway: StartGateway
) -> None:
    engines = await start_fleet(start_engine, replay_buffer=4)
    running = await start_gateway(engines=0, pods=entries(engines))
    for engine in engines:
        await send(engine, 12, "history")  # three times what the replay buffer holds
    await wait_equal(running, engines)

    alone = await start_gateway(engines=0, pods=entries(engines))
    await eventually(
        lambda: all(not s.whole for s in alone.state.subscribers.statuses().values()),
        what="a replica without bootstrap is degraded",
    )
    for engine in engines:
        missing = (await engine_truth(engine))["GPU"] - (
            await index_of(alone, engine.engine.config.name)
        )["engine_hashes"]["GPU"]
        assert missing, "replay alone rebuilt everything: the test proves nothing"

    async with running.client() as client:  # streamed answers: its cost model learns
        for i in range(6):
            body = {"model": MODEL, "prompt": f"learn {i} " * 20, "max_tokens": 2, "stream": True}
            assert (await client.post("/v1/completions", json=body)).status_code == 200
    learned = running.state.router.cost.export()
    assert learned["speeds"]

    joined = await start_gateway(engines=0, pods=entries(engines), bootstrap_peer=running.url)
    await wait_equal(joined, engines)
    assert sample(joined, "kvgate_snapshots_restored_total", source="peer") == 2
    assert joined.state.router.cost.export() == learned  # and it predicts as the peer does


async def test_a_bootstrap_peer_that_does_not_answer_does_not_stop_start_up(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(engines=1, bootstrap_peer="http://127.0.0.1:9")
    await wait_equal(gw, gw.engines)
    assert sample(gw, "kvgate_snapshots_ignored_total", reason="peer_unavailable") == 1


async def test_snapshots_over_the_size_limit_are_not_written(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    snaps = tmp_path / "snapshots"
    gw = await start_gateway(
        engines=1, snapshot_dir=snaps, snapshot_interval_s=0.05, snapshot_max_bytes=64
    )
    await send(gw.engines[0], 2, "z")
    await eventually(
        lambda: sample(gw, "kvgate_snapshot_writes_total", outcome="too_large") >= 1,
        what="an oversized snapshot refused",
    )
    assert not (snaps / file_name("e0")).exists()


async def test_the_snapshot_of_a_pod_that_goes_is_removed(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    snaps = tmp_path / "snapshots"
    gw = await start_gateway(engines=2, snapshot_dir=snaps, snapshot_interval_s=0.05)
    for engine in gw.engines:
        await send(engine, 1, "w")  # a pod whose engine published nothing has no snapshot
    await eventually(
        lambda: (snaps / file_name("e0")).exists() and (snaps / file_name("e1")).exists(),
        what="both snapshots written",
    )
    gw.write_pods([pod_entry(gw.engines[1])])
    await eventually(lambda: not (snaps / file_name("e0")).exists(), what="e0's file removed")
    assert (snaps / file_name("e1")).exists()


def test_snapshot_settings_come_from_the_environment() -> None:
    env = {
        "KVGATE_SNAPSHOT_DIR": "/var/lib/kvgate",
        "KVGATE_SNAPSHOT_INTERVAL_S": "500ms",
        "KVGATE_SNAPSHOT_MAX_BYTES": "1000",
        "KVGATE_BOOTSTRAP_PEER": "http://gw-0:8080/",
    }
    settings = Settings.load(env)
    assert settings.snapshot_dir == Path("/var/lib/kvgate")
    assert (settings.snapshot_interval_s, settings.snapshot_max_bytes) == (0.5, 1000)
    assert settings.bootstrap_peer == "http://gw-0:8080"
    defaults = Settings.load({})
    assert (defaults.snapshot_dir, defaults.bootstrap_peer) == (None, None)
    for variable, value in (
        ("KVGATE_SNAPSHOT_INTERVAL_S", "0"),
        ("KVGATE_SNAPSHOT_MAX_BYTES", "-1"),
        ("KVGATE_BOOTSTRAP_PEER", "gw-0:8080"),
    ):
        with pytest.raises(ConfigError, match=variable):
            Settings.load({variable: value})


def test_a_snapshot_dir_that_cannot_be_created_stops_start_up(tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text('{"pods": [{"name": "p", "url": "http://127.0.0.1:9", "model": "m"}]}')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "KVGATE_SNAPSHOT_DIR": str(blocker / "snapshots")}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods), "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"KVGATE_SNAPSHOT_DIR='{blocker / 'snapshots'}' is invalid" in done.stderr


async def test_a_restarted_gateway_keeps_what_its_cost_model_learned(
    start_engine: StartEngine, start_gateway: StartGateway, tmp_path: Path
) -> None:
    engines = await start_fleet(start_engine)
    snaps = tmp_path / "snapshots"
    first = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    async with first.client() as client:
        for i in range(8):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"q{i} {FILLER}"}],
                    "max_tokens": 2, "stream": True}  # fmt: skip
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                await response.aread()
    learned = first.state.router.cost.export()
    assert learned["fleet"]["observations"] == 8 and learned["speeds"]
    await first.server.stop()  # the final snapshot includes the cost model
    assert (snaps / COST_MODEL_FILE).exists()

    second = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    assert second.state.router.cost.export() == learned  # it predicts as the first did
    await second.server.stop()

    (snaps / COST_MODEL_FILE).write_bytes(b"{not json")
    third = await start_gateway(engines=0, pods=entries(engines), snapshot_dir=snaps)
    assert sample(third, "kvgate_snapshots_ignored_total", reason="malformed") == 1
    assert third.state.router.cost.fleet.observations == 0  # from the prior, and serving
    await wait_equal(third, engines)
