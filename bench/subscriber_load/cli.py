"""`kvgate bench subscriber`: its flags, the config they make, and the run from start to
report."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from bench.results_io import add_output_arguments, write_json
from bench.subscriber_load.engines import CATCH_UP_TIMEOUT_S, EngineProcess, spawn
from bench.subscriber_load.gateway import CountingSink, Gateway
from bench.subscriber_load.phases import (
    check_equal,
    gap_phase,
    overrun_phase,
    publishing,
    subscriber_counters,
)
from bench.subscriber_load.report import plot, report
from bench.subscriber_load.workload import BLOCK_SIZE, PublisherSpec
from gateway.runtime import tune_gc
from indexer import IndexConfig, SyncPrefixHashTable
from subscriber import IndexSink, SubscriberManager


@dataclass(frozen=True, slots=True)
class BenchConfig:
    engines: int
    seconds: float
    batches: int
    gap_rounds: int
    gap_batches: int
    overrun_buffer: int
    gpu_blocks: int
    requests_per_batch: int
    seed: int
    quick: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchConfig:
        quick = bool(args.quick)
        config = cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
        config = replace(
            config,
            seconds=config.seconds or (2.0 if quick else 8.0),
            batches=config.batches or (1000 if quick else 3000),
            gap_rounds=config.gap_rounds or (5 if quick else 10),
            quick=quick,
        )
        for name in ("engines", "batches", "gap_rounds", "gap_batches", "overrun_buffer"):
            value = getattr(config, name)
            if value < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        return config

    def publisher_specs(self) -> list[PublisherSpec]:
        """The fleet's engines, then the overrun engine (a replay buffer shorter than a gap)."""
        names = [f"engine-{i}" for i in range(self.engines)] + ["engine-overrun"]
        buffers = [10_000] * self.engines + [self.overrun_buffer]
        return [
            PublisherSpec(name, self.seed + i, self.gpu_blocks, buffer, self.requests_per_batch)
            for i, (name, buffer) in enumerate(zip(names, buffers, strict=True))
        ]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--quick", action="store_true", help="a short run (< 30 s)")
    add("--engines", type=int, default=4, help="publisher processes (default 4)")
    live_help = "live phase: seconds of stepping the cache and publishing (default 8; quick 2)"
    add("--seconds", type=float, default=None, help=live_help)
    burst_help = "burst phase: batches per engine, prepared then sent back to back "
    add("--batches", type=int, default=None, help=burst_help + "(default 3000; quick 1000)")
    add("--gap-rounds", type=int, default=None, help="gap recoveries timed (default 10; quick 5)")
    add("--gap-batches", type=int, default=20, help="batches dropped per gap")
    add("--overrun-buffer", type=int, default=8, help="replay buffer of the overrun engine")
    add("--gpu-blocks", type=int, default=2048, help="KV blocks per engine (the sim's default)")
    add("--requests-per-batch", type=int, default=2, help="requests served per engine step")
    add("--seed", type=int, default=7, help="workload seed")
    add_output_arguments(parser, "subscriber")


def run(args: argparse.Namespace) -> int:
    config = BenchConfig.from_args(args)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"{config.engines} publisher processes and this subscriber process share {cores} cores "
        f"(live {config.seconds:g} s, then a burst of {config.batches} batches per engine)..."
    )
    previous_gc = tune_gc()  # as `kvgate serve` runs
    try:
        results, gateway = asyncio.run(_bench(config))
    finally:
        gc.set_threshold(*previous_gc)
    results["config"]["cores"] = cores
    report(results)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    if plot(args.plot, gateway, results):
        print(f"plot written to {args.plot}")
    if not results["index_equals_engines"]:
        print("FAILED: the index differs from what the engines hold", file=sys.stderr)
        return 1
    return 0


async def _bench(config: BenchConfig) -> tuple[dict[str, Any], Gateway]:
    with tempfile.TemporaryDirectory(prefix="kvgate-subscriber-") as logs:
        return await _with_engines(config, Path(logs) / "engines.log")


async def _with_engines(config: BenchConfig, log: Path) -> tuple[dict[str, Any], Gateway]:
    processes = await spawn(config.publisher_specs(), log)
    try:
        *fleet, overrun_engine = processes
        t0 = time.monotonic()
        table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK_SIZE))
        sink = CountingSink(IndexSink(table), t0)
        async with SubscriberManager(sink) as manager:
            gateway = Gateway(manager, sink, t0)
            async with gateway.probe.running():
                results = await _phases(gateway, fleet, overrun_engine, config)
    finally:
        await asyncio.gather(*(process.stop() for process in processes))
    return results, gateway


async def _phases(
    gateway: Gateway,
    fleet: list[EngineProcess],
    overrun_engine: EngineProcess,
    config: BenchConfig,
) -> dict[str, Any]:
    for engine in fleet:
        await gateway.manager.upsert(engine.endpoint)
    for engine in fleet:
        await gateway.wait_live(engine.name)
    pods = [engine.name for engine in fleet]
    gateway.mark("live")
    live_command = ("live", config.seconds)
    live_timeout = CATCH_UP_TIMEOUT_S + config.seconds
    live = await publishing(
        gateway, fleet, live_command, "live", steady=True, timeout_s=live_timeout
    )
    checks = {"after_live": await check_equal(gateway, fleet)}
    gateway.mark("prepare")
    prepare = await asyncio.gather(
        *(e.ask("prepare", config.batches, timeout_s=None) for e in fleet)
    )
    gateway.mark("burst")
    burst = await publishing(gateway, fleet, ("burst",), "ingest", steady=False)
    burst["ingest_subscriber_counters"] = subscriber_counters(gateway, pods)
    checks["after_burst"] = await check_equal(gateway, fleet)
    gateway.mark("gaps")
    gaps = await gap_phase(gateway, fleet, config.gap_rounds, config.gap_batches)
    checks["after_gaps"] = await check_equal(gateway, fleet)
    gateway.mark("overrun")
    overrun = await overrun_phase(gateway, overrun_engine, config.overrun_buffer * 4)
    stats = gateway.table.stats()
    return {
        "config": {
            **{k: v for k, v in asdict(config).items() if k != "quick"},
            "block_size": BLOCK_SIZE,
            "overrun_gap_batches": config.overrun_buffer * 4,
            "quick": config.quick,
            "prepare_cpu_s_per_engine": max(p["cpu_s"] for p in prepare),
        },
        "engines": config.engines,
        **burst,
        "subscriber_cpu_s": burst["ingest_cpu_s"],
        **live,
        "index_equals_engines": all(check["equal"] for check in checks.values()),
        "index_checks": checks,
        **gaps,
        **overrun,
        "subscriber_counters": subscriber_counters(gateway, pods),
        "index_rejected_blocks": dict(stats.rejected_blocks),
        "index_unknown_removals": stats.unknown_removals,
    }
