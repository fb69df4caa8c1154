"""`kvgate bench indexer --vs dynamo`: kvgate's index against NVIDIA Dynamo's Rust RadixTree.

Users comparing KV routers compare the index with Dynamo's, so both run in one process
on the identical event stream (Dynamo lives in its own venv, `bench/.venvs/`, with
kvgate's source on PYTHONPATH), in alternated order, and each figure is the median of
the runs. Dynamo gets its block hashes precomputed (`tokens_hash`) and its events
serialized outside the timing; kvgate hashes the tokens itself, as the gateway does.

Ratios are kvgate's figure divided by Dynamo's (blocks/s, µs, bytes). Dynamo's tree
works on its own thread, so its timings include a hand-off per call and on a shared
2-core machine swing by up to 5x between runs (see `spread` in the JSON); Dynamo's memory
is resident growth, kvgate's tracemalloc.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import xxhash

from bench.indexer_workload import (
    FleetWorkload,
    RemovedEvent,
    StoredEvent,
    build_churn,
    build_fleet,
)
from bench.results_io import RESULTS_DIR, RUNS_DIR, percentile, print_table, pyplot, write_json

PACKAGE = "ai-dynamo-runtime==1.6.1"
MODEL = "bench-model"
BLOCK_SIZE = 16
REPO = Path(__file__).resolve().parent.parent
TARGETS = {
    "ingest_ratio": (">=", 0.5),
    "remove_ratio": (">=", 0.8),
    "match_p50_ratio_8": ("<=", 1.0),
    "match_p50_ratio_64": ("<=", 1.0),
    "bytes_per_pair_ratio": ("<=", 1.3),
}


def run(args: argparse.Namespace) -> int:
    """Install Dynamo on first use, then measure inside its venv and report."""
    from bench.routing.routers import ensure_venv

    venv = ensure_venv(PACKAGE)
    python = str(venv / "bin" / "python")
    deps = venv / ".kvgate-deps"
    if not deps.exists():
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "xxhash", "msgpack"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deps.write_text("xxhash msgpack\n")
    json_path = args.json
    if json_path.name == "indexer.json" and json_path.parent in (RESULTS_DIR, RUNS_DIR):
        json_path = json_path.parent / "indexer_vs_dynamo.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [python, "-m", "bench.indexer_vs_dynamo", "--json", str(json_path)]
    if args.quick:
        command.append("--quick")
    subprocess.run(command, check=True, cwd=REPO, env=env)
    results = json.loads(json_path.read_text())
    plot_path = args.plot
    if plot_path.name == "indexer.png" and plot_path.parent in (RESULTS_DIR, RUNS_DIR):
        plot_path = plot_path.parent / "indexer_vs_dynamo.png"
    if _plot(plot_path, results):
        print(f"plot written to {plot_path}")
    return 0


class DynamoEvents:
    """kvgate's workload events as Dynamo's JSON events, encoded outside the timing.

    Dynamo's tree expects a block's external hash to be the same on every worker that
    holds it (as vLLM's with a fixed hash seed); the workload's are per pod, so each is
    mapped to a content-chained one."""

    def __init__(self, pods: list[str]) -> None:
        from dynamo._core import compute_block_hash_for_seq  # type: ignore[import-not-found]  # only in its venv

        self.hash = compute_block_hash_for_seq
        self.worker = {pod: i for i, pod in enumerate(pods)}
        self._external: dict[tuple[str, int], int] = {}
        self._event_id = 0

    def stored(self, pod: str, event: StoredEvent) -> tuple[int, bytes, int]:
        hashes = self.hash(list(event.token_ids), BLOCK_SIZE)
        parent = event.parent_block_hash
        chained = 0 if parent is None else self._external[(pod, parent)]
        parent_hash = None if parent is None else chained
        blocks: list[dict[str, Any]] = []
        for engine_hash, tokens_hash in zip(event.block_hashes, hashes, strict=True):
            chained = xxhash.xxh64_intdigest(
                chained.to_bytes(8, "little") + tokens_hash.to_bytes(8, "little")
            )
            self._external[(pod, engine_hash)] = chained
            blocks.append({"block_hash": chained, "tokens_hash": tokens_hash})
        body = {"stored": {"parent_hash": parent_hash, "blocks": blocks}}
        return self._payload(pod, body, len(blocks))

    def removed(self, pod: str, engine_hashes: Sequence[int]) -> tuple[int, bytes, int]:
        external = [self._external[(pod, h)] for h in engine_hashes]
        return self._payload(pod, {"removed": {"block_hashes": external}}, len(external))

    def _payload(self, pod: str, body: dict[str, Any], blocks: int) -> tuple[int, bytes, int]:
        self._event_id += 1
        payload = json.dumps({"event_id": self._event_id, "data": body}).encode()
        return self.worker[pod], payload, blocks


def _new_table(pods: list[str]) -> Any:
    from indexer import IndexConfig, IndexLimits, SyncPrefixHashTable

    limits = IndexLimits(max_prefixes_per_context=10_000_000, max_blocks_per_pod=10_000_000)
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK_SIZE, limits=limits))
    for pod in pods:
        table.register_pod(pod, MODEL)
    return table


def _new_tree() -> Any:
    from dynamo._core import RadixTree

    return RadixTree()


class DynamoSide:
    """Dynamo's RadixTree fed the workload's events as precomputed JSON bytes."""

    def __init__(self, workload: FleetWorkload) -> None:
        encode = DynamoEvents(workload.pods)
        self.hash = encode.hash
        self.worker = encode.worker
        self.stored = [
            encode.stored(pod, event) for pod in workload.pods for event in workload.events[pod]
        ]
        self.removed = [encode.removed(pod, batch) for pod, batch in _removal_batches(workload)]

    def new(self) -> Any:
        return _new_tree()

    def ingest(self, tree: Any) -> int:
        applied = 0
        for worker, payload, blocks in self.stored:
            tree.apply_event(worker, payload)
            applied += blocks
        tree.find_matches([0])  # the tree applies on its own thread: wait for it
        return applied

    def remove(self, tree: Any) -> int:
        removed = 0
        for worker, payload, blocks in self.removed:
            tree.apply_event(worker, payload)
            removed += blocks
        tree.find_matches([0])
        return removed

    def match(self, tree: Any, hashes: list[int]) -> dict[int, int]:
        return _dynamo_scores(tree, hashes)


def _dynamo_scores(tree: Any, hashes: list[int]) -> dict[int, int]:
    """Dynamo's matched blocks per worker."""
    scores = tree.find_matches(hashes).scores
    return {worker: count for (worker, _rank), count in scores.items()}


def _answers_agree(result: Any, worker: dict[str, int], scores: dict[int, int]) -> bool:
    """kvgate's match `result` and Dynamo's `scores` give every worker the same blocks."""
    ours = {worker[pod]: n for pod, n in result.blocks.items() if n}
    return ours == {w: n for w, n in scores.items() if n}


def _medians(figures: dict[str, list[float]]) -> dict[str, Any]:
    """Each figure's median over the runs, and its range under `spread`."""
    out: dict[str, Any] = {key: statistics.median(vals) for key, vals in figures.items()}
    out["spread"] = {key: [min(vals), max(vals)] for key, vals in figures.items()}
    return out


class KvgateSide:
    """kvgate's SyncPrefixHashTable, fed decoded events and hashing their tokens."""

    def __init__(self, workload: FleetWorkload) -> None:
        self.workload = workload
        self.removed = list(_removal_batches(workload))

    def new(self) -> Any:
        return _new_table(self.workload.pods)

    def ingest(self, table: Any) -> int:
        applied = 0
        for pod in self.workload.pods:
            for event in self.workload.events[pod]:
                applied += table.apply_stored(pod, event)
        return applied

    def remove(self, table: Any) -> int:
        removed = 0
        for pod, batch in self.removed:
            removed += table.apply_removed(pod, batch, "GPU")
        return removed


def _removal_batches(workload: FleetWorkload) -> list[tuple[str, list[int]]]:
    """Every block of half the pods, tail first, 16 hashes per event."""
    batches: list[tuple[str, list[int]]] = []
    for pod in workload.pods[: max(1, len(workload.pods) // 2)]:
        hashes = [h for event in workload.events[pod] for h in event.block_hashes]
        hashes.reverse()
        batches.extend((pod, hashes[i : i + 16]) for i in range(0, len(hashes), 16))
    return batches


def _timed(action: Any, index: Any) -> tuple[int, float]:
    start = time.perf_counter()
    count = action(index)
    return count, time.perf_counter() - start


def _measure_fleet(pods: int, blocks_per_pod: int, runs: int, queries: int) -> dict[str, Any]:
    """Ingest, match and removal of one fleet, both indexes, alternated, medians of runs."""
    from indexer import ModelContext

    print(f"building workload: {pods} workers x {blocks_per_pod} blocks...", flush=True)
    workload = build_fleet(pods=pods, blocks_per_pod=blocks_per_pod, seed=7)
    # kvgate decodes into fresh lists in production; keep the events decoded up front so
    # neither side pays for unpacking inside the timing.
    events = {pod: [e.as_decoded() for e in evs] for pod, evs in workload.events.items()}
    workload = FleetWorkload(
        workload.pods, events, workload.prompts, workload.total_blocks, workload.distinct_blocks
    )
    dynamo, kvgate = DynamoSide(workload), KvgateSide(workload)
    figures: dict[str, list[float]] = {}
    answers_equal = True
    rng = random.Random(pods)
    context = ModelContext(MODEL)
    for run_index in range(runs):
        order: list[tuple[str, Any]] = [("kvgate", kvgate), ("dynamo", dynamo)]
        if run_index % 2:
            order.reverse()
        indexes: dict[str, Any] = {}
        for name, side in order:
            gc.collect()
            index = side.new()
            applied, seconds = _timed(side.ingest, index)
            figures.setdefault(f"{name}_ingest", []).append(applied / seconds)
            indexes[name] = index
        table, tree = indexes["kvgate"], indexes["dynamo"]
        prompts = [
            (table.prefix_hashes(tokens), dynamo.hash(tokens, BLOCK_SIZE))
            for _holder, tokens in workload.prompts
        ]
        samples: dict[str, list[float]] = {"kvgate": [], "dynamo": []}
        clock = time.perf_counter
        for q in range(queries):
            ours, theirs = rng.choice(prompts)
            pair = [("kvgate", ours), ("dynamo", theirs)]
            if q % 2:
                pair.reverse()
            for name, hashes in pair:
                if name == "kvgate":
                    start = clock()
                    result = table.match(context, hashes, workload.pods)
                    samples[name].append((clock() - start) * 1e6)
                else:
                    start = clock()
                    scores = dynamo.match(tree, hashes)
                    samples[name].append((clock() - start) * 1e6)
            if not _answers_agree(result, dynamo.worker, scores):
                answers_equal = False
        for name in ("kvgate", "dynamo"):
            figures.setdefault(f"{name}_match_p50", []).append(percentile(samples[name], 50))
            figures.setdefault(f"{name}_match_p99", []).append(percentile(samples[name], 99))
        for name, side in order:
            removed, seconds = _timed(side.remove, indexes[name])
            figures.setdefault(f"{name}_remove", []).append(removed / seconds)
        del indexes, table, tree
    out = _medians(figures)
    out["answers_equal"] = answers_equal
    out["blocks"] = workload.total_blocks
    out["memory"] = _measure_memory(kvgate, dynamo, workload.total_blocks)
    return out


def _measure_churn(pods: int, held_blocks: int, runs: int, queries: int) -> dict[str, Any]:
    """A full fleet's stream of stores and the LRU removals they cause, interleaved, both
    indexes, alternated; blocks applied (stored + removed) per second, then the answers
    on the final state."""
    from indexer import ModelContext

    print(f"building workload: churn, {pods} workers holding {held_blocks} blocks...", flush=True)
    workload = build_churn(pods=pods, held_blocks=held_blocks)
    stream = [
        (pod, event.as_decoded() if isinstance(event, StoredEvent) else event)
        for pod, event in workload.stream
    ]
    encode = DynamoEvents(workload.pods)
    payloads = [
        encode.stored(pod, event)
        if isinstance(event, StoredEvent)
        else encode.removed(pod, event.block_hashes)
        for pod, event in workload.stream
    ]
    blocks = workload.stored_blocks + workload.removed_blocks

    def apply_kvgate(table: Any) -> int:
        for pod, event in stream:
            if isinstance(event, RemovedEvent):
                table.apply_removed(pod, event.block_hashes, "GPU")
            else:
                table.apply_stored(pod, event)
        return blocks

    def apply_dynamo(tree: Any) -> int:
        for worker, payload, _blocks in payloads:
            tree.apply_event(worker, payload)
        tree.find_matches([0])  # the tree applies on its own thread: wait for it
        return blocks

    def new_table() -> Any:
        return _new_table(workload.pods)

    sides: dict[str, tuple[Callable[[], Any], Callable[[Any], int]]] = {
        "kvgate": (new_table, apply_kvgate),
        "dynamo": (_new_tree, apply_dynamo),
    }
    figures: dict[str, list[float]] = {}
    answers_equal = True
    context = ModelContext(MODEL)
    rng = random.Random(pods)
    for run_index in range(runs):
        order = ["kvgate", "dynamo"] if run_index % 2 == 0 else ["dynamo", "kvgate"]
        indexes: dict[str, Any] = {}
        for name in order:
            new, apply = sides[name]
            gc.collect()
            index = new()
            applied, seconds = _timed(apply, index)
            figures.setdefault(f"{name}_blocks_per_s", []).append(applied / seconds)
            indexes[name] = index
        table, tree = indexes["kvgate"], indexes["dynamo"]
        held = table.stats().pairs
        for _ in range(queries):
            _holder, tokens = rng.choice(workload.prompts)
            result = table.match(context, table.prefix_hashes(tokens), workload.pods)
            theirs = _dynamo_scores(tree, encode.hash(tokens, BLOCK_SIZE))
            if not _answers_agree(result, encode.worker, theirs):
                answers_equal = False
        del indexes, table, tree
    out = _medians(figures)
    out["answers_equal"] = answers_equal
    out["stored_blocks"] = workload.stored_blocks
    out["removed_blocks"] = workload.removed_blocks
    out["held_blocks"] = workload.held_blocks
    out["kvgate_held_pairs"] = held
    return out


def _rss() -> int:
    with Path("/proc/self/statm").open() as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measure_memory(kvgate: KvgateSide, dynamo: DynamoSide, pairs: int) -> dict[str, float]:
    """Bytes per (block, worker) pair: tracemalloc for kvgate, resident growth for Dynamo
    (its memory is outside Python's allocator)."""
    gc.collect()
    before = _rss()
    tree = dynamo.new()
    dynamo.ingest(tree)
    dynamo_bytes = max(0, _rss() - before)
    del tree
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    table = kvgate.new()
    kvgate.ingest(table)
    gc.collect()
    kvgate_bytes = tracemalloc.get_traced_memory()[0] - start
    tracemalloc.stop()
    del table
    return {
        "kvgate_bytes_per_pair": kvgate_bytes / pairs,
        "dynamo_bytes_per_pair": dynamo_bytes / pairs,
    }


def _measure_hashing(dynamo: Any) -> dict[str, float]:
    from indexer import PrefixHasher

    hasher = PrefixHasher(BLOCK_SIZE)
    rng = random.Random(3)
    prompts = [[rng.randrange(150_000) for _ in range(2048)] for _ in range(50)]
    samples: dict[str, list[float]] = {"kvgate": [], "dynamo": []}
    clock = time.perf_counter
    for round_index in range(20):
        for tokens in prompts:
            pair = [("kvgate", hasher.prefix_hashes), ("dynamo", lambda t: dynamo(t, BLOCK_SIZE))]
            if round_index % 2:
                pair.reverse()
            for name, fn in pair:
                start = clock()
                fn(tokens)
                samples[name].append((clock() - start) * 1e6)
    return {f"{name}_hash_2048_tokens_p50_us": percentile(s, 50) for name, s in samples.items()}


def measure(quick: bool) -> dict[str, Any]:
    """Both fleets and hashing; ratios are kvgate ÷ Dynamo."""
    from dynamo._core import compute_block_hash_for_seq

    runs = 2 if quick else 4  # alternated: kvgate first on even runs, Dynamo first on odd
    queries = 300 if quick else 600
    small = _measure_fleet(8, 2_000 if quick else 12_500, runs, queries)
    large = _measure_fleet(64, 1_000 if quick else 15_625, runs, queries)
    churn = _measure_churn(16, 50_000 if quick else 200_000, runs, queries)
    hashing = _measure_hashing(compute_block_hash_for_seq)
    from indexer import SyncPrefixHashTable

    compiled = SyncPrefixHashTable().compiled  # KVGATE_PURE_PYTHON=1: the pure-Python path
    results: dict[str, Any] = {
        "config": {
            "quick": quick,
            "runs": runs,
            "queries": queries,
            "dynamo": PACKAGE,
            "kvgate_compiled": compiled,
        },
        "ingest_ratio": small["kvgate_ingest"] / small["dynamo_ingest"],
        "ingest_ratio_64": large["kvgate_ingest"] / large["dynamo_ingest"],
        "remove_ratio": large["kvgate_remove"] / large["dynamo_remove"],
        "match_p50_ratio_8": small["kvgate_match_p50"] / small["dynamo_match_p50"],
        "match_p50_ratio_64": large["kvgate_match_p50"] / large["dynamo_match_p50"],
        "bytes_per_pair_ratio": large["memory"]["kvgate_bytes_per_pair"]
        / max(1e-9, large["memory"]["dynamo_bytes_per_pair"]),
        "churn_ratio": churn["kvgate_blocks_per_s"] / churn["dynamo_blocks_per_s"],
        "answers_equal": small["answers_equal"]
        and large["answers_equal"]
        and churn["answers_equal"],
        "hash_ratio": hashing["kvgate_hash_2048_tokens_p50_us"]
        / hashing["dynamo_hash_2048_tokens_p50_us"],
        **hashing,
        "workers_8": small,
        "workers_64": large,
        "churn": churn,
    }
    return results


def _plot(path: Path, results: dict[str, Any]) -> bool:
    try:
        plt = pyplot(path)
    except SystemExit:
        return False
    keys = list(TARGETS)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(keys, [results[k] for k in keys])
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("kvgate ÷ Dynamo")
    ax.set_title("kvgate index vs Dynamo RadixTree (median of alternated runs)")
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    from gateway.runtime import tune_gc

    tune_gc()  # as kvgate's processes run (see gateway/runtime.py)
    results = measure(args.quick)
    results["config"]["gc_thresholds"] = list(gc.get_threshold())
    rows = [(key, f"{results[key]:.3g}", f"{op} {goal}") for key, (op, goal) in TARGETS.items()]
    rows.append(("answers_equal", str(results["answers_equal"]), "true"))
    rows.append(("hash_ratio", f"{results['hash_ratio']:.3g}", ""))
    rows.append(("churn_ratio", f"{results['churn_ratio']:.3g}", "stores + LRU removals"))
    print_table("kvgate index vs Dynamo RadixTree (kvgate ÷ Dynamo)", rows)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
