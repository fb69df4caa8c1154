"""Crash safety of the snapshot files, for real: a `kvgate serve` process writing
snapshots as fast as it can is SIGKILLed at random moments; every restart must resume
from its files to an index equal to the engines' caches.

The engines' replay buffers hold far less than their history, so a restart that did not
resume from valid snapshots could not become whole: equality proves the files were
complete and consistent whenever the kill fell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from simulator import EngineServer
from tests.conftest import StartEngine
from tests.gateway.conftest import ADMIN_TOKEN, pod_entry
from tests.gateway.test_snapshots import engine_truth, send
from tests.helpers import eventually, free_port

KILLS = 5
REPLAY_BUFFER = 64
HISTORY = 100  # batches per engine before the kills: more than the replay buffer holds
LENGTH = 8  # ~80 blocks per request: snapshots of ~10 000 entries take a while to write


class GatewayProcess:
    def __init__(self, pods_file: Path, snaps: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._pods_file = pods_file
        self._snaps = snaps
        self._log = log
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {
            **os.environ,
            "KVGATE_SNAPSHOT_DIR": str(self._snaps),
            "KVGATE_SNAPSHOT_INTERVAL_S": "0.001",  # writing nearly all the time
            "KVGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "KVGATE_SCRAPE_INTERVAL": "0.5",
        }
        args = ["serve", "--pods", str(self._pods_file), "--port", str(self.port)]
        with self._log.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", *args, env=env, stdout=log, stderr=log
            )

    async def kill(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGKILL)
        await self._process.wait()
        self._process = None

    async def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._process.wait(), 30)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
            self._process = None

    async def admin(self, path: str, **params: str) -> Any:
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10) as client:
            response = await client.get(path, params=params)
            response.raise_for_status()
            return response.json()

    async def metric(self, line: str) -> float:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            text = (await client.get("/metrics")).text
        found = re.search(rf"^{re.escape(line)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0


async def whole_and_equal(gateway: GatewayProcess, engines: list[EngineServer]) -> bool:
    try:
        for engine in engines:
            view = await gateway.admin("/admin/index", pod=engine.engine.config.name)
            held = {tier: set(hashes) for tier, hashes in view["engine_hashes"].items()}
            if view["state"] != "whole" or held != await engine_truth(engine):
                return False
    except httpx.HTTPError:
        return False  # not up yet
    return True


@contextlib.asynccontextmanager
async def traffic(engines: list[EngineServer], round_: int) -> AsyncIterator[None]:
    """Requests straight to every engine, three at a time each, until the block ends."""

    async def loop(engine: EngineServer, worker: int) -> None:
        for i in range(10_000):
            await send(engine, 1, f"round {round_} worker {worker} request {i}", length=LENGTH)

    tasks = [asyncio.create_task(loop(e, w)) for e in engines for w in range(3)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_kill_9_during_snapshot_writes_never_loses_the_index(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engines = [
        await start_engine(name=f"e{i}", replay_buffer=REPLAY_BUFFER, gpu_blocks=32_768)
        for i in range(2)
    ]
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps({"pods": [pod_entry(engine) for engine in engines]}))
    snaps, log = tmp_path / "snapshots", tmp_path / "gateway.log"
    gateway = GatewayProcess(pods_file, snaps, log)
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    try:
        await gateway.start()
        await eventually(lambda: whole_and_equal(gateway, engines), within=60, what="first start")
        for engine in engines:
            await send(engine, HISTORY, "history", length=LENGTH)
        await eventually(lambda: whole_and_equal(gateway, engines), within=30, what="history")
        for round_ in range(KILLS):
            async with traffic(engines, round_):
                await asyncio.sleep(rng.uniform(0.1, 1.0))
                await gateway.kill()
            # Traffic stops while the gateway is down: what it missed stays within replay reach.
            await gateway.start()
            await eventually(
                lambda: whole_and_equal(gateway, engines),
                within=60,
                what=f"whole and equal after kill {round_ + 1} (seed {seed})",
            )
            restored = await gateway.metric('kvgate_snapshots_restored_total{source="file"}')
            assert restored == len(engines), f"seed {seed}"
            pods = (await gateway.admin("/admin/pods"))["pods"]
            assert all(pod["subscriber"]["restarts"] == 0 for pod in pods), f"seed {seed}"
    finally:
        await gateway.stop()
    leftovers = log.read_text().count("unfinished snapshot writes")
    print(f"seed {seed}: {KILLS} kills, {leftovers} left an unfinished write behind")


# -- the file layer alone, killed mid-write ----------------------------------------------------

WRITER = """
import sys
from pathlib import Path
from gateway.control.persistence import SnapshotDir
from indexer import PodSnapshot, decode_snapshot, encode_snapshot
from indexer.snapshot import PartialRecord, PodIndexState, Tier

directory = SnapshotDir(Path(sys.argv[1]))
directory.prepare()
seq = max((decode_snapshot(f.data).seq for f in directory.read_all(1 << 30)), default=0)
index = PodIndexState((), (PartialRecord(Tier.GPU, 1, 2, (3, 4), 0),))
model = "m" * 8_000_000  # cheap to encode, long to write and sync
while True:  # little but writes: a kill almost always lands inside one
    seq += 1
    for pod in ("e0", "e1"):
        snapshot = PodSnapshot(pod, model, "tcp://e", seq, seq, True, 16, 0, 0.0, index)
        directory.write(pod, encode_snapshot(snapshot))
"""


async def test_kill_9_mid_write_leaves_the_old_file_or_the_new_one(tmp_path: Path) -> None:
    from gateway.control.persistence import SnapshotDir
    from indexer import decode_snapshot

    rng = random.Random()
    directory = SnapshotDir(tmp_path / "snapshots")
    last_seq = {"e0": 0, "e1": 0}
    torn = 0
    for _ in range(20):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(directory.path), cwd=Path(__file__).parents[2]
        )
        await asyncio.sleep(rng.uniform(0.3, 0.8))  # start-up, then writing
        process.send_signal(signal.SIGKILL)
        await process.wait()
        torn += len(list(directory.path.glob(".*.tmp")))
        for found in directory.read_all(1 << 30):
            assert found.data is not None
            snapshot = decode_snapshot(found.data)  # never a torn or mixed file
            assert snapshot.seq >= last_seq[snapshot.pod]  # never an older one either
            last_seq[snapshot.pod] = snapshot.seq
    assert min(last_seq.values()) > 0, "the writer never wrote: the test proves nothing"
    print(f"20 kills: {torn} left a torn temporary file; every snapshot file was whole")
