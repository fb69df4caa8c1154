"""`kvgate bench …`: one sub-command per benchmark."""

from __future__ import annotations

import argparse
import importlib

from bench.results_io import add_keep_argument, keep_outputs

# name -> (module with configure_parser/run, help); modules are imported only when run.
_BENCHMARKS: dict[str, tuple[str, str]] = {
    "indexer": (
        "bench.indexer_bench",
        "prefix-hash indexer: ingest, removal, match latency, hashing, memory per pair",
    ),
    "decoder": (
        "bench.decoder_fuzz",
        "KV event decoder: fuzzing (random and mutated frames) and decode throughput",
    ),
    "sim": ("simulator.bench", "one simulated engine's sustainable requests/s and events/s"),
    "subscriber": (
        "bench.subscriber_load.cli",
        "KV event ingest rate from N engines and recovery time after a gap",
    ),
    "overhead": (
        "bench.overhead.cli",
        "latency the gateway adds (p50/p99, c=1/32, tokenized), first-chunk delay, max req/s",
    ),
    "fuzz": (
        "bench.frame_fuzz",
        "KV event frames fuzzed through the live subscriber: crashes, index = truth, rejects",
    ),
    "routing": (
        "bench.routing.cli",
        "routing quality (TTFT, hit rate, throughput) per policy and workload",
    ),
    "traces": (
        "bench.routing.trace_files",
        "the production traces `routing --trace` replays: fetch them (checksummed), describe them",
    ),
    "joiners": (
        "bench.routing.joiners",
        "a gateway's kvgate.predictions log split by engine step: prediction error of the "
        "requests joined by later ones, the rest, and without the joiners' prefill",
    ),
    "decision": (
        "bench.decision_bench",
        "CPU cost of one routing decision per policy with 64 pods, tokenization excluded",
    ),
    "chaos": (
        "bench.chaos.runner",
        "fault injection: index divergence and convergence time after each fault",
    ),
    "pin-depth": (
        "bench.pin_depth",
        "pinning: a VIP conversation's TTFT after a cache flood, baseline vs pinned, by depth",
    ),
    "tables": (
        "bench.tables.cli",
        "docs/benchmarks.md's tables from the committed results in bench/results/: "
        "checked, or rewritten with --update",
    ),
    "soak": (
        "bench.soak",
        "long steady traffic at 0.8 of capacity: RSS, fds, asyncio tasks slope, lost requests",
    ),
}

_KEPT = frozenset(_BENCHMARKS) - {"traces", "joiners", "tables"}
"""The benchmarks that write results (and so take `--keep`)."""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    benches = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module_name, summary) in _BENCHMARKS.items():
        sub = benches.add_parser(name, help=summary, description=summary)
        module = importlib.import_module(module_name)
        module.configure_parser(sub)
        if name in _KEPT:
            add_keep_argument(sub)
        sub.set_defaults(_bench=module.run)


def run(args: argparse.Namespace) -> int:
    keep_outputs(args)
    status: int = args._bench(args)
    return status
