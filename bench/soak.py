"""`kvgate bench soak --minutes 10`: does the gateway stay flat under long steady load? The
chaos fleet, its capacity measured first, then `--load` of it with occasional faults that
must not lose a request; how it is checked and what it found: docs/reliability.md ("Soak").
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.chaos.faults import fault_plan
from bench.chaos.harness import Harness, running_harness
from bench.chaos.loadgen import LoadGenerator, TrafficShape
from bench.chaos.sampler import Sample, slope_per_minute
from bench.harness.fleet import SimOptions
from bench.results_io import (
    add_output_arguments,
    figure,
    percentile,
    print_table,
    write_json,
)

# Faults after which no client request may fail (the gateway retries or never notices).
# Not `restart_wipe_cache`: like a real engine restart it cuts the streams it was serving.
SOAK_FAULTS = (
    "drop_batches",
    "drop_fraction",
    "restart_keep_cache",
    "stall",
    "fail_5xx",
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--minutes", type=float, default=10.0, help="soak duration after the capacity probe")
    add("--engines", type=int, default=3, help="simulated engines (one process each)")
    add("--load", type=float, default=0.8, help="fraction of the measured capacity to send")
    add("--capacity-seconds", type=float, default=5.0, help="length of the capacity probe")
    add("--rate", type=float, default=None, help="fixed requests/s (skips the capacity probe)")
    add("--fault-every", type=float, default=30.0, help="seconds between faults (0 = none)")
    add("--sample-interval", type=float, default=5.0, help="seconds between gateway samples")
    add("--warmup-fraction", type=float, default=0.2, help="share of the run before slopes")
    add("--seed", type=int, default=1)
    add_output_arguments(parser, "soak/soak")
    add("--workdir", type=Path, default=None, help="logs and pods file (default: temporary)")


def run(args: argparse.Namespace) -> int:
    if args.minutes <= 0 or not 0 < args.load <= 1:
        print("kvgate bench soak: --minutes must be > 0 and --load in (0, 1]")
        return 2
    with tempfile.TemporaryDirectory(prefix="kvgate-soak-") as tmp:
        results = asyncio.run(run_soak(args, args.workdir or Path(tmp)))
    print_table("kvgate bench soak", _rows(results))
    print(f"results: {args.json}\nplot: {args.plot}")
    return 0


async def measure_capacity(harness: Harness, seconds: float, seed: int) -> float:
    """Completed requests/s with far more offered than the setup can serve."""
    shape = TrafficShape(rate=2000.0, max_inflight=48)
    load = LoadGenerator(harness.gateway.url, shape, random.Random(seed))
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    await asyncio.sleep(seconds / 3)  # ramp up: connections, tokenizer cache, engine caches
    since = time.monotonic()
    await asyncio.sleep(seconds * 2 / 3)
    completed = load.completed_since(since)
    elapsed = time.monotonic() - since
    stop.set()
    await task
    return completed / elapsed if elapsed > 0 else 0.0


async def run_soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    options = SimOptions(gpu_blocks=512, time_scale=10.0, max_batch=64, replay_buffer=10_000)
    async with running_harness(
        workdir, engines=args.engines, options=options, seed=args.seed, snapshot_dir=None
    ) as harness:
        capacity = None
        if args.rate is None:
            capacity = await measure_capacity(harness, args.capacity_seconds, args.seed)
            await harness.checker.wait_converged(time.monotonic(), 30.0)
        rate = args.rate if args.rate is not None else max(1.0, capacity or 0.0) * args.load
        duration = args.minutes * 60
        shape = TrafficShape(rate=rate)
        async with harness.traffic(shape, args.seed, args.sample_interval) as traffic:
            load, sampler, t0 = traffic
            faults = await _inject_occasionally(harness, args, duration, t0)
        final = await harness.checker.wait_converged(time.monotonic(), 30.0)
    warmup = duration * args.warmup_fraction
    results: dict[str, Any] = {
        "config": {
            "minutes": args.minutes,
            "engines": args.engines,
            "load": args.load,
            "sample_interval_s": args.sample_interval,
            "warmup_s": round(warmup, 1),
            "fault_every_s": args.fault_every,
            "seed": args.seed,
        },
        "capacity_rps": round(capacity, 1) if capacity is not None else None,
        "offered_rps": round(rate, 1),
        **_traffic(load, duration),
        **_trends(sampler.samples, warmup),
        "faults": faults,
        "final_whole": final.converged,
        "final_divergent_blocks": final.divergent,
        "samples": [s.as_json(pid=False) for s in sampler.samples],
    }
    write_json(args.json, results)
    _plot(args.plot, sampler.samples, warmup, faults, results)
    return results


async def _inject_occasionally(
    harness: Harness, args: argparse.Namespace, duration: float, t0: float
) -> list[dict[str, Any]]:
    every = args.fault_every
    count = int(duration // every) if every > 0 else 0
    plan = fault_plan(args.seed, count, args.engines, SOAK_FAULTS)
    applied: list[dict[str, Any]] = []
    for spec in plan:
        wait = t0 + (spec.index + 1) * every - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if time.monotonic() - t0 >= duration:
            break
        record = await harness.injector.apply(spec)
        applied.append({"t": round(record.started - t0, 2), "kind": spec.kind,
                        "pod": record.pod, "fired": record.fired})  # fmt: skip
    remaining = t0 + duration - time.monotonic()
    if remaining > 0:
        await asyncio.sleep(remaining)
    return applied


def _traffic(load: LoadGenerator, duration: float) -> dict[str, Any]:
    records = load.records
    ok = [r.ended - r.started for r in records if r.error is None]
    return {
        "requests": len(records),
        "achieved_rps": round(len(ok) / duration, 1) if duration else 0.0,
        "lost_requests": sum(r.error is not None for r in records),
        "skipped_over_inflight_cap": load.skipped,
        "latency_p50_ms": round(percentile(ok, 50) * 1e3, 1) if ok else None,
        "latency_p99_ms": round(percentile(ok, 99) * 1e3, 1) if ok else None,
    }


def _trends(samples: Sequence[Sample], warmup: float) -> dict[str, Any]:
    steady = [s for s in samples if s.t >= warmup]
    rss = [(s.t, s.rss_bytes / 2**20) for s in steady]
    fds = [(s.t, float(s.open_fds)) for s in steady if s.open_fds is not None]
    tasks = [(s.t, float(s.asyncio_tasks)) for s in steady if s.asyncio_tasks is not None]
    all_rss = [s.rss_bytes / 2**20 for s in samples]
    return {
        "samples": len(samples),
        "steady_samples": len(steady),
        "rss_mb_first": round(all_rss[0], 1) if all_rss else None,
        "rss_mb_last": round(all_rss[-1], 1) if all_rss else None,
        "rss_mb_max": round(max(all_rss), 1) if all_rss else None,
        "rss_slope_mb_per_min": round(slope_per_minute(rss), 3),
        "open_fds_last": steady[-1].open_fds if steady else None,
        "open_fds_slope_per_min": round(slope_per_minute(fds), 3),
        "asyncio_tasks_last": steady[-1].asyncio_tasks if steady else None,
        "asyncio_tasks_slope_per_min": round(slope_per_minute(tasks), 3),
    }


def _rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        ("capacity (probe)", f"{r['capacity_rps']} req/s", "gateway + engines + client here"),
        ("offered / achieved", f"{r['offered_rps']} / {r['achieved_rps']} req/s", ""),
        ("requests / lost", f"{r['requests']} / {r['lost_requests']}", "target 0 lost"),
        ("latency p50 / p99", f"{r['latency_p50_ms']} / {r['latency_p99_ms']} ms", ""),
        (
            "RSS first / last / max",
            f"{r['rss_mb_first']} / {r['rss_mb_last']} / {r['rss_mb_max']} MB",
            "",
        ),
        ("RSS slope after warm-up", f"{r['rss_slope_mb_per_min']} MB/min", "flat: ~0"),
        ("open fds slope", f"{r['open_fds_slope_per_min']} /min", f"last {r['open_fds_last']}"),
        (
            "asyncio tasks slope",
            f"{r['asyncio_tasks_slope_per_min']} /min",
            f"last {r['asyncio_tasks_last']}",
        ),
        ("faults applied", str(len(r["faults"])), "none may lose a request"),
        (
            "index equal at the end",
            str(r["final_whole"]),
            f"{r['final_divergent_blocks']} divergent",
        ),
    ]


def _plot(
    path: Path,
    samples: Sequence[Sample],
    warmup: float,
    faults: Sequence[dict[str, Any]],
    results: dict[str, Any],
) -> None:
    with figure(path, 3, 1, figsize=(10, 7), sharex=True, dpi=110) as (fig, axes):
        t = [s.t for s in samples]
        series = (
            ("RSS (MB)", [s.rss_bytes / 2**20 for s in samples]),
            ("open fds", [s.open_fds for s in samples]),
            ("asyncio tasks", [s.asyncio_tasks for s in samples]),
        )
        for ax, (label, values) in zip(axes, series, strict=True):
            ax.plot(t, values, "-o", markersize=2)
            ax.set_ylabel(label)
            ax.axvspan(0, warmup, color="grey", alpha=0.15)
            for fault in faults:
                ax.axvline(fault["t"], color="tab:red", alpha=0.3, linewidth=0.8)
        axes[-1].set_xlabel("seconds (grey: warm-up; red: faults)")
        fig.suptitle(
            f"kvgate bench soak: {results['offered_rps']} req/s, {results['requests']} requests, "
            f"{results['lost_requests']} lost, RSS slope {results['rss_slope_mb_per_min']} MB/min"
        )
