"""`kvgate bench indexer`: throughput, latency and memory of the sync prefix-hash table.

The index runs compiled where its extension is built (`config.compiled` in the JSON;
KVGATE_PURE_PYTHON=1 measures the pure-Python path). Figures (JSON keys):
ingest_blocks_per_s (with kvgate's GC setting, see gateway/runtime.py;
ingest_blocks_per_s_default_gc without it), remove_blocks_per_s, match_p50_us /
match_p99_us (128-block prompt, 8 candidates), match_p50_us_64 / match_p99_us_64 (64
candidates), hash_2048_tokens_p50_us, bytes_per_pair (tracemalloc, whole fleet indexed).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.indexer_workload import FleetWorkload, build_fleet
from bench.results_io import add_output_arguments, figure, percentile, print_table, write_json
from gateway.runtime import tune_gc
from indexer import IndexConfig, IndexLimits, ModelContext, SyncPrefixHashTable

MODEL = "bench-model"
TARGETS = {
    "ingest_blocks_per_s": (">=", 500_000),
    "match_p50_us": ("<=", 50),
    "match_p50_us_64": ("<=", 100),
    "hash_2048_tokens_p50_us": ("<=", 60),
    "bytes_per_pair": ("<=", 200),
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small fleet, finishes in < 20 s")
    parser.add_argument("--pods", type=int, default=None, help="pods (default 64; quick 16)")
    parser.add_argument(
        "--blocks-per-pod", type=int, default=None, help="blocks per pod (default 20000)"
    )
    parser.add_argument("--matches", type=int, default=None, help="match queries per setting")
    parser.add_argument("--seed", type=int, default=7, help="workload seed")
    parser.add_argument(
        "--vs",
        choices=["dynamo"],
        default=None,
        help="compare with NVIDIA Dynamo's RadixTree (installed into bench/.venvs on first use)",
    )
    add_output_arguments(parser, "indexer")


def run(args: argparse.Namespace) -> int:
    if args.vs == "dynamo":
        from bench.indexer_vs_dynamo import run as run_vs_dynamo

        return run_vs_dynamo(args)
    pods = args.pods or (16 if args.quick else 64)
    blocks_per_pod = args.blocks_per_pod or (5_000 if args.quick else 20_000)
    matches = args.matches or (2_000 if args.quick else 10_000)
    print(f"building workload: {pods} pods x {blocks_per_pod} blocks (seed {args.seed})...")
    workload = build_fleet(pods=pods, blocks_per_pod=blocks_per_pod, seed=args.seed)
    results: dict[str, Any] = {
        "config": {
            "pods": pods,
            "blocks_per_pod": blocks_per_pod,
            "block_size": 16,
            "chain_blocks": 128,
            "distinct_blocks": workload.distinct_blocks,
            "pairs": workload.total_blocks,
            "quick": bool(args.quick),
        }
    }
    # First with CPython's default collector settings, then as kvgate's processes run.
    table, ingest = _measure_ingest(workload)
    results["ingest_blocks_per_s_default_gc"] = ingest
    del table
    gc.collect()
    default_thresholds = tune_gc()
    results["config"]["gc_thresholds"] = list(gc.get_threshold())
    table, ingest = _measure_ingest(workload)
    results["ingest_blocks_per_s"] = ingest
    results["config"]["compiled"] = table.compiled  # KVGATE_PURE_PYTHON=1: False
    latencies = {}
    for candidates in (8, 64):
        samples = _measure_match(table, workload, candidates, matches, args.seed)
        latencies[candidates] = samples
        suffix = "" if candidates == 8 else f"_{candidates}"
        results[f"match_p50_us{suffix}"] = percentile(samples, 50)
        results[f"match_p99_us{suffix}"] = percentile(samples, 99)
    results["hash_2048_tokens_p50_us"] = _measure_hashing(table, args.seed)
    results["remove_blocks_per_s"] = _measure_removal(table, workload)
    del table
    gc.collect()
    results.update(_measure_memory(workload))
    gc.set_threshold(*default_thresholds)
    _report(results)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    if _plot(args.plot, latencies, pods):
        print(f"plot written to {args.plot}")
    return 0


def _new_table(pods: list[str]) -> SyncPrefixHashTable:
    limits = IndexLimits(max_prefixes_per_context=10_000_000, max_blocks_per_pod=10_000_000)
    table = SyncPrefixHashTable(IndexConfig(block_size=16, limits=limits))
    for pod in pods:
        table.register_pod(pod, MODEL)
    return table


def _ingest(table: SyncPrefixHashTable, workload: FleetWorkload) -> tuple[int, float]:
    """Apply every event; returns (blocks applied, seconds spent inside apply_stored).

    Each event's token ids are unpacked into a fresh list first, outside the timing, as
    the subscriber's decoder hands them over.
    """
    applied = 0
    elapsed = 0.0
    clock = time.perf_counter
    for pod in workload.pods:
        for packed in workload.events[pod]:
            event = packed.as_decoded()
            start = clock()
            applied += table.apply_stored(pod, event)
            elapsed += clock() - start
    return applied, elapsed


def _measure_ingest(workload: FleetWorkload) -> tuple[SyncPrefixHashTable, float]:
    table = _new_table(workload.pods)
    applied, elapsed = _ingest(table, workload)
    if applied != workload.total_blocks:
        raise RuntimeError(f"applied {applied} blocks of {workload.total_blocks}")
    return table, applied / elapsed


def _measure_match(
    table: SyncPrefixHashTable,
    workload: FleetWorkload,
    candidates: int,
    queries: int,
    seed: int,
) -> list[float]:
    """Latency of matching a held 128-block prompt against `candidates` pods.

    The candidates always include a pod holding the whole prompt (the case a router
    cares about, and the slowest: the walk goes to the last block).
    """
    rng = random.Random(seed + candidates)
    context = ModelContext(MODEL)
    pods = workload.pods
    prompts = [(holder, table.prefix_hashes(tokens)) for holder, tokens in workload.prompts]
    samples = []
    clock = time.perf_counter
    for _ in range(queries):
        holder, hashes = rng.choice(prompts)
        others = [pod for pod in rng.sample(pods, min(candidates, len(pods))) if pod != holder]
        chosen = [holder, *others[: candidates - 1]]
        rng.shuffle(chosen)
        start = clock()
        table.match(context, hashes, chosen)
        samples.append((clock() - start) * 1e6)
    return samples


def _measure_hashing(table: SyncPrefixHashTable, seed: int) -> float:
    rng = random.Random(seed)
    prompts = [[rng.randrange(150_000) for _ in range(2048)] for _ in range(50)]
    samples = []
    clock = time.perf_counter
    for _ in range(20):
        for tokens in prompts:
            start = clock()
            table.prefix_hashes(tokens)
            samples.append((clock() - start) * 1e6)
    return percentile(samples, 50)


def _measure_removal(table: SyncPrefixHashTable, workload: FleetWorkload) -> float:
    """Evict every block of half the pods, tail first, 16 hashes per call (one batch)."""
    removed = 0
    start = time.perf_counter()
    for pod in workload.pods[: max(1, len(workload.pods) // 2)]:
        hashes = [h for event in workload.events[pod] for h in event.block_hashes]
        hashes.reverse()
        for i in range(0, len(hashes), 16):
            removed += table.apply_removed(pod, hashes[i : i + 16], "GPU")
    elapsed = time.perf_counter() - start
    return removed / elapsed


def _measure_memory(workload: FleetWorkload) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    table = _new_table(workload.pods)
    _ingest(table, workload)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    stats = table.stats()
    return {
        "bytes_per_pair": used / stats.pairs,
        "bytes_per_distinct_block": used / stats.blocks,
        "index_bytes": used,
        "pairs_measured": stats.pairs,
    }


def _report(results: dict[str, Any]) -> None:
    config = results["config"]
    sharing = config["pairs"] / max(1, config["distinct_blocks"])
    rows = []
    for key, unit in (
        ("ingest_blocks_per_s", "blocks/s"),
        ("ingest_blocks_per_s_default_gc", "blocks/s"),
        ("remove_blocks_per_s", "blocks/s"),
        ("match_p50_us", "us"),
        ("match_p99_us", "us"),
        ("match_p50_us_64", "us"),
        ("match_p99_us_64", "us"),
        ("hash_2048_tokens_p50_us", "us"),
        ("bytes_per_pair", "bytes"),
        ("bytes_per_distinct_block", "bytes"),
    ):
        value = results[key]
        note = ""
        if key in TARGETS:
            op, target = TARGETS[key]
            ok = value >= target if op == ">=" else value <= target
            note = f"target {op} {target:,}  {'ok' if ok else 'MISSED'}"
        rows.append((key, f"{value:,.1f} {unit}", note))
    print_table(
        f"kvgate indexer: {config['pods']} pods x {config['blocks_per_pod']} blocks, "
        f"{config['pairs']:,} (block, pod) pairs, {config['distinct_blocks']:,} distinct "
        f"blocks (each held by {sharing:.2f} pods on average)",
        rows,
    )


def _plot(path: Path, latencies: dict[int, list[float]], pods: int) -> bool:
    with figure(path, figsize=(7, 4), dpi=120) as (_fig, axis):
        for candidates, samples in sorted(latencies.items()):
            ordered = sorted(samples)
            fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
            axis.plot(ordered, fractions, label=f"{min(candidates, pods)} candidate pods")
        axis.set_xscale("log")
        axis.set_xlabel("match latency (µs), 128-block prompt")
        axis.set_ylabel("fraction of queries")
        axis.set_title("kvgate indexer: prefix match latency (CDF)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    return True
