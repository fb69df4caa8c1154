"""`kvgate demo`: the one-command demonstration.

Starts `--engines` simulated engines (a child process) and the gateway on loopback, waits
until every KV-event subscriber is whole, runs a multi-turn chat workload with round-robin
and then with prefix-cache routing (engine caches reset in between), prints the comparison
and writes JSON + PNG under `--out`. Then the gateway keeps serving until Ctrl-C, unless
`--no-serve`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bench.results_io import RUNS_DIR, add_keep_argument, keep_outputs
from gateway.routing.config import load_specs


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--engines", type=int, default=4, help="number of simulated engines (default 4)")
    add("--sessions", type=int, default=None, help="concurrent chat sessions (default 24)")
    add("--turns", type=int, default=None, help="turns per session (default 10)")
    add("--time-scale", type=float, default=None,
        help="engines run this many times faster than the modelled GPU")  # fmt: skip
    add("--seed", type=int, default=0, help="workload seed (same seed, same workload)")
    add("--port", type=int, default=8080,
        help="gateway port (8080; a free one if taken; 0 = any free port)")  # fmt: skip
    add("--no-serve", action="store_true", help="exit after the results table")
    add("--quick", action="store_true", help="a tiny workload (seconds; for tests)")
    add("--out", type=Path, default=RUNS_DIR / "demo",
        help="directory for JSON + PNG (default bench/results/runs/demo; "
        "with --keep bench/results/demo)")  # fmt: skip
    add_keep_argument(parser)
    add("--quiet", action="store_true", help="no progress bar or status lines")
    add("--policies", default="round-robin,prefix-cache",
        help="BASELINE,CANDIDATE: the two routing policies compared, in that order "
        "(default round-robin,prefix-cache)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from bench.demo.plan import make_plan
    from bench.demo.progress import stderr_is_tty
    from bench.demo.runner import DemoOptions, run_demo

    errors = {
        "--engines": args.engines < 1,
        "--sessions": args.sessions is not None and args.sessions < 1,
        "--turns": args.turns is not None and args.turns < 1,
        "--time-scale": args.time_scale is not None and args.time_scale <= 0,
        "--port": not 0 <= args.port < 65536,
    }
    policies = tuple(args.policies.split(","))
    errors["--policies"] = len(policies) != 2 or not set(policies) <= set(load_specs(None))
    bad = [name for name, wrong in errors.items() if wrong]
    if bad:
        print(f"kvgate demo: invalid value for {', '.join(bad)}")
        return 2
    keep_outputs(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    plan = make_plan(
        engines=args.engines,
        sessions=args.sessions,
        turns=args.turns,
        time_scale=args.time_scale,
        seed=args.seed,
        quick=args.quick,
    )
    options = DemoOptions(
        plan=plan,
        port=args.port,
        out_dir=args.out,
        serve=not args.no_serve,
        quiet=args.quiet,
        progress=not args.quiet and stderr_is_tty(),
        policies=(policies[0], policies[1]),
    )
    return run_demo(options)
