"""`kvgate bench chaos`: seeded faults against a fleet under steady traffic.

Engines (`python -m simulator`, one process each) and the gateway (`kvgate serve`) run on
fixed loopback ports; this process sends steady traffic, applies the faults one after
another and, after each, waits until the gateway reports every pod whole and its index
equals every engine's cache (`bench.chaos.convergence`). A pod that cannot become whole by
itself (replay buffer overrun) is measured, then healed like an operator would, and
reported apart. Output: a table, JSON and a PNG timeline (bench/results/chaos/).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.chaos.faults import KINDS, fault_plan
from bench.chaos.harness import running_harness
from bench.chaos.loadgen import TrafficShape
from bench.chaos.report import (
    client_summary,
    fault_entry,
    fault_summary,
    memory_summary,
    plot_timeline,
    table_rows,
)
from bench.harness.fleet import SimOptions
from bench.results_io import add_output_arguments, print_table, write_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--faults", type=int, default=100, help="faults to apply (default 100)")
    add("--seed", type=int, default=1, help="seed of the fault plan and the traffic")
    add("--engines", type=int, default=4, help="simulated engines (one process each)")
    add("--rate", type=float, default=20.0, help="client requests per second")
    add("--stream-fraction", type=float, default=0.5, help="share of streamed requests")
    add("--kinds", default=",".join(KINDS), help="comma-separated fault kinds to draw from")
    add("--timeout", type=float, default=30.0, help="longest wait for convergence per fault")
    add("--gap", type=float, default=0.5, help="seconds of plain traffic between faults")
    add("--warmup", type=float, default=3.0, help="seconds of traffic before the first fault")
    add("--gpu-blocks", type=int, default=512, help="each engine's GPU blocks (small: evictions)")
    add("--replay-buffer", type=int, default=1000, help="each engine's replay buffer (batches)")
    add("--time-scale", type=float, default=10.0, help="engines' time scale")
    add(
        "--snapshot-dir",
        type=Path,
        default=None,
        help="KVGATE_SNAPSHOT_DIR for the gateway (default: a fresh temporary directory)",
    )
    add("--no-snapshot", action="store_true", help="run the gateway without KVGATE_SNAPSHOT_DIR")
    add("--sample-interval", type=float, default=2.0, help="seconds between gateway samples")
    add_output_arguments(parser, "chaos/chaos")
    add("--workdir", type=Path, default=None, help="logs and pods file (default: temporary)")


def run(args: argparse.Namespace) -> int:
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        print(f"kvgate bench chaos: unknown --kinds {unknown}; known: {list(KINDS)}")
        return 2
    with tempfile.TemporaryDirectory(prefix="kvgate-chaos-") as tmp:
        workdir = args.workdir or Path(tmp)
        snapshot = None if args.no_snapshot else (args.snapshot_dir or Path(tmp) / "snapshots")
        results = asyncio.run(run_chaos(args, kinds, workdir, snapshot))
    print_table("kvgate bench chaos", table_rows(results))
    print(f"results: {args.json}\ntimeline: {args.plot}")
    return 0


async def run_chaos(
    args: argparse.Namespace, kinds: list[str], workdir: Path, snapshot: Path | None
) -> dict[str, Any]:
    options = SimOptions(
        gpu_blocks=args.gpu_blocks,
        time_scale=args.time_scale,
        max_batch=64,
        replay_buffer=args.replay_buffer,
    )
    plan = fault_plan(args.seed, args.faults, args.engines, kinds)
    entries: list[dict[str, Any]] = []
    records = []
    async with running_harness(
        workdir, engines=args.engines, options=options, seed=args.seed, snapshot_dir=snapshot
    ) as harness:
        shape = TrafficShape(rate=args.rate, stream_fraction=args.stream_fraction)
        async with harness.traffic(shape, args.seed, args.sample_interval) as traffic:
            load, sampler, t0 = traffic
            await asyncio.sleep(args.warmup)
            baseline = await harness.checker.wait_converged(time.monotonic(), args.timeout)
            for spec in plan:
                record = await harness.injector.apply(spec)
                first, after, healed = await harness.converge_or_heal(
                    record.settled_at, args.timeout
                )
                records.append(record)
                entry = fault_entry(record, first, healed, after, t0)
                entries.append(entry)
                _progress(entry)
                await asyncio.sleep(args.gap)
        engine_restarts = {e.endpoint.name: e.starts - 1 for e in harness.engines}
        gateway_restarts = harness.gateway.starts - 1
    results: dict[str, Any] = {
        "config": {
            "faults": args.faults,
            "seed": args.seed,
            "engines": args.engines,
            "rate": args.rate,
            "stream_fraction": args.stream_fraction,
            "kinds": kinds,
            "timeout_s": args.timeout,
            "gpu_blocks": args.gpu_blocks,
            "replay_buffer": args.replay_buffer,
            "time_scale": args.time_scale,
            "snapshot_dir": str(snapshot) if snapshot else None,
        },
        "duration_s": round(time.monotonic() - t0, 1),
        "baseline_converged": baseline.converged,
        "faults": fault_summary(entries),
        "clients": client_summary(load.records, records, load.skipped, t0),
        "memory": memory_summary(sampler.samples),
        "restarts": {"engines": engine_restarts, "gateway": gateway_restarts},
        "fault_log": entries,
        "samples": [s.as_json() for s in sampler.samples],
    }
    write_json(args.json, results)
    title = f"kvgate bench chaos: {len(entries)} faults, seed {args.seed}"
    plot_timeline(args.plot, entries, load.records, sampler.samples, t0, title)
    return results


def _progress(entry: dict[str, Any]) -> None:
    state = "converged" if entry["converged"] else f"NOT whole {entry['not_whole']}"
    healed = f" healed {entry['healed']}" if entry.get("healed") else ""
    print(
        f"fault {entry['index']:>3} {entry['kind']:<19} {entry['pod'] or 'gateway':<8} "
        f"{state} in {entry['convergence_s']:.2f} s, divergent {entry['divergent_blocks']}"
        f"{healed}",
        flush=True,
    )
