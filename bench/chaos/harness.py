"""A running fleet for chaos and soak runs: N engine processes and one gateway process on
fixed loopback ports, with the HTTP client, fault injector and convergence checker that
drive them. Every process is stopped on the way out, also on errors and Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bench.chaos.convergence import Convergence, ConvergenceChecker
from bench.chaos.faults import FaultInjector
from bench.chaos.loadgen import LoadGenerator, TrafficShape
from bench.chaos.sampler import ProcessSampler
from bench.harness.fleet import SimOptions, SimProcess, write_pods_file
from bench.harness.gateway import GatewayProcess
from bench.harness.ports import free_port_block

HEAL_RESET_TIMEOUT_S = 5.0


@dataclass
class Harness:
    engines: list[SimProcess]
    gateway: GatewayProcess
    client: httpx.AsyncClient
    injector: FaultInjector
    checker: ConvergenceChecker
    workdir: Path

    async def heal(self, pod: str) -> str:
        """Bring a pod whose index cannot become whole by itself back to a known state, as
        an operator would: empty the engine's prefix cache (`/reset_prefix_cache`, retried
        while requests run; its AllBlocksCleared makes the index whole), else restart the
        engine with an empty cache. Returns what was done."""
        engine = next(e for e in self.engines if e.endpoint.name == pod)
        deadline = time.monotonic() + HEAL_RESET_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                response = await self.client.post(f"{engine.endpoint.url}/reset_prefix_cache")
                if response.status_code == 200:
                    return "reset_prefix_cache"
            await asyncio.sleep(0.02)
        await self.injector.arm(engine, {"restart_publisher": True, "wipe_cache": True})
        return "engine_restart"

    async def converge_or_heal(
        self, since: float, timeout_s: float
    ) -> tuple[Convergence, Convergence | None, dict[str, str]]:
        """The convergence after a fault; for pods left degraded, the heal and the
        convergence after it."""
        first = await self.checker.wait_converged(since, timeout_s)
        if first.converged or not first.not_whole:
            return first, None, {}
        healed = {pod: await self.heal(pod) for pod in first.not_whole}
        # Right after the heal the pod still reads degraded until its AllBlocksCleared
        # arrives: wait for it rather than giving up on the stale reason.
        after = await self.checker.wait_converged(
            time.monotonic(), timeout_s, give_up_when_permanent=False
        )
        return first, after, healed

    @contextlib.asynccontextmanager
    async def traffic(
        self, shape: TrafficShape, seed: int, sample_interval_s: float
    ) -> AsyncIterator[tuple[LoadGenerator, ProcessSampler, float]]:
        """Steady client traffic and samples of the gateway process while the block runs;
        yields them and when they started."""
        t0 = time.monotonic()
        load = LoadGenerator(self.gateway.url, shape, random.Random(seed))
        sampler = ProcessSampler(self.gateway, sample_interval_s, t0)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(load.run(stop), name="chaos-load"),
            asyncio.create_task(sampler.run(stop), name="chaos-sampler"),
        ]
        try:
            yield load, sampler, t0
        finally:
            stop.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:  # the block went well: a failed task is the error
            if isinstance(outcome, BaseException):
                raise outcome


@contextlib.asynccontextmanager
async def running_harness(
    workdir: Path,
    *,
    engines: int,
    options: SimOptions,
    seed: int,
    snapshot_dir: Path | None,
) -> AsyncIterator[Harness]:
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    # Engine i: HTTP base+3i, events base+3i+1, replay base+3i+2; the gateway base+3N.
    base = free_port_block(3 * engines + 1, random.Random())
    log = workdir / "processes.log"
    procs = [
        SimProcess(replace(options, seed=seed + 100 * i), log, name=f"chaos-{i}", port=base + 3 * i)
        for i in range(engines)
    ]
    token = secrets.token_hex(16)
    env = {"KVGATE_UPSTREAM_TIMEOUT": os.environ.get("KVGATE_UPSTREAM_TIMEOUT", "60")}
    if snapshot_dir is not None:  # honoured by gateways with index persistence
        env["KVGATE_SNAPSHOT_DIR"] = str(snapshot_dir)
        env["KVGATE_SNAPSHOT_INTERVAL_S"] = os.environ.get("KVGATE_SNAPSHOT_INTERVAL_S", "1")
    gateway = GatewayProcess(
        workdir / "pods.json", log, port=base + 3 * engines, admin_token=token, env=env
    )
    try:
        await asyncio.gather(*(p.start() for p in procs))
        addresses = [p.endpoint for p in procs]
        write_pods_file(gateway.pods_file, addresses)
        await gateway.start()
        limits = httpx.Limits(max_keepalive_connections=32)
        async with httpx.AsyncClient(timeout=10.0, limits=limits) as client:
            yield Harness(
                procs,
                gateway,
                client,
                FaultInjector(client, procs, gateway),
                ConvergenceChecker(gateway.admin(client), addresses),
                workdir,
            )
    finally:
        await gateway.stop()
        for proc in procs:
            await proc.stop()
