"""`kvgate bench tables`: docs/benchmarks.md's tables, regenerated from the committed
results (bench/results/), checked (the default) or written (`--update`).

Each table sits in the document right after its `<!-- table:NAME -->` line.
After `kvgate bench … --keep`, run `kvgate bench tables --update` and commit both.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable
from pathlib import Path

from bench.results_io import RESULTS_DIR
from bench.tables import components, overhead, routing
from bench.tables.markdown import TablesError, blocks, fill

DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"

TABLES: dict[str, Callable[[Path], str]] = {
    "indexer": components.indexer,
    "indexer-vs-dynamo": components.indexer_vs_dynamo,
    "decoder": components.decoder,
    "sim": components.sim,
    "subscriber": components.subscriber,
    "overhead": overhead.overhead,
    "overhead-tokenizers": overhead.tokenizers,
    "overhead-streams": overhead.streams,
    "fuzz": components.fuzz,
    "decision": components.decision,
    "demo": components.demo,
    "routing-workloads": routing.workloads,
    "routing-vip-flood": routing.vip_flood,
    "routing-closed": routing.closed,
    "routing-traces-conversation": routing.traces_conversation,
    "routing-traces-synthetic": routing.traces_synthetic,
    "routing-engines": routing.engines,
    "routing-real-vllm": routing.real_vllm,
    "routing-replicas": routing.replicas,
    "routing-replica-kill": routing.replica_kill,
    "chaos": components.chaos,
    "soak": components.soak,
    "pin-depth": components.pin_depth,
}
"""Every generated table by its block name, each rendered from the results folder."""


def generate(results: Path = RESULTS_DIR) -> dict[str, str]:
    return {name: render(results) for name, render in TABLES.items()}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--update", action="store_true", help="rewrite the document's tables (default: check)"
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the document (docs/benchmarks.md)")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_DIR, help="the results (bench/results)"
    )


def run(args: argparse.Namespace) -> int:
    document = args.doc.read_text()
    try:
        updated = fill(document, generate(args.results))
    except TablesError as exc:
        print(f"kvgate bench tables: {args.doc}: {exc}")
        return 1
    if updated == document:
        print(f"{args.doc}: {len(blocks(document))} tables match bench/results")
        return 0
    if args.update:
        args.doc.write_text(updated)
        print(f"{args.doc}: tables updated from {args.results}")
        return 0
    diff = difflib.unified_diff(
        document.splitlines(), updated.splitlines(), str(args.doc), "generated", lineterm=""
    )
    print("\n".join(diff))
    print(f"{args.doc}: tables differ from bench/results; run `kvgate bench tables --update`")
    return 1
