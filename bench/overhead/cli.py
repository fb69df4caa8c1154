"""`kvgate bench overhead`: its flags, the plan they make, and the run from start to report."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.overhead.channels import client_factory
from bench.overhead.fleet import running_fleet
from bench.overhead.phases import (
    Bodies,
    Case,
    compare_blocks,
    compare_c1,
    headline,
    measured,
    summarise,
    throughput,
)
from bench.overhead.report import Samples, plot, print_profile, report
from bench.results_io import add_output_arguments, write_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--quick", action="store_true", help="fewer requests, shorter phases (< 40 s)")
    add("--requests", type=int, default=None, help="requests per side and case at "
        "concurrency 1 (default 2000; quick 150)")  # fmt: skip
    add("--requests-c32", type=int, default=None, help="requests per side and case at "
        "concurrency 32 (default 4000; quick 320)")  # fmt: skip
    add("--stream-requests", type=int, default=None, help="streamed requests per side")
    add("--duration", type=float, default=None, help="seconds per throughput run (10; quick 3)")
    add("--rps-concurrency", type=int, default=64, help="requests in flight, throughput run")
    add("--engines", type=int, default=1, help="simulated engine processes (default 1)")
    add("--client", choices=["raw", "httpx"], default="raw", help="load generator's client")
    add("--profile-gateway", type=Path, default=None, metavar="PATH",
        help="run the gateway under cProfile (CPU clock), save the stats here")  # fmt: skip
    add_output_arguments(parser, "overhead")  # --json, --plot


@dataclass(frozen=True)
class Plan:
    requests: int
    requests_c32: int
    stream_requests: int
    duration_s: float
    rps_concurrency: int
    engines: int
    client: str
    profile: Path | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        requests = args.requests or (150 if args.quick else 2000)
        return cls(
            requests=requests,
            requests_c32=args.requests_c32 or (320 if args.quick else 4000),
            stream_requests=args.stream_requests or requests,
            duration_s=args.duration or (3.0 if args.quick else 10.0),
            rps_concurrency=args.rps_concurrency,
            engines=args.engines,
            client=args.client,
            profile=args.profile_gateway,
        )

    def cases(self) -> list[Case]:
        one, many = self.requests, self.requests_c32
        return [
            Case("c1", "round-robin", 1, one),
            Case("c1_relay", "round-robin", 1, one, via="relay"),
            Case("c32", "round-robin", 32, many),
            Case("c1_tokenized", "prefix-cache", 1, one),
            Case("c1_tokenized_distinct", "prefix-cache", 1, one, distinct=True),
            Case("c32_tokenized", "prefix-cache", 32, many),
            Case("c32_tokenized_distinct", "prefix-cache", 32, many, distinct=True),
            Case("stream", "round-robin", 1, self.stream_requests, stream=True),
        ]

    def config(self) -> dict[str, Any]:
        return {
            "requests_c1": self.requests,
            "requests_c32": self.requests_c32,
            "stream_requests": self.stream_requests,
            "throughput_seconds": self.duration_s,
            "throughput_concurrency": self.rps_concurrency,
            "engines": self.engines,
            "client": self.client,
            "profiled": self.profile is not None,
            "cpu_cores": os.cpu_count(),
            "processes": "engines, gateway (kvgate serve), load generator: one process each",
            "load_average_before": [round(v, 2) for v in os.getloadavg()],
        }


T = TypeVar("T")


def run(args: argparse.Namespace) -> int:
    plan = Plan.from_args(args)
    try:
        results, samples = asyncio.run(_stoppable(bench(plan)))
    except (RuntimeError, OSError, EOFError) as exc:  # EOFError: a server hung up mid-answer
        print(f"kvgate bench overhead: {exc!r}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("kvgate bench overhead: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    report(results)
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    plot(args.plot, samples, results)
    print(f"plot written to {args.plot}")
    if plan.profile is not None:
        print_profile(plan.profile)
    failed: Counter[str] = Counter()
    for case in results["cases"].values():
        failed.update(case["error_statuses"])
    for side in ("direct", "gateway"):
        failed.update(results["throughput"][f"{side}_error_statuses"])
    if failed:
        print(f"kvgate bench overhead: failed requests by status: {dict(failed)}", file=sys.stderr)
    return 1 if failed else 0


async def _stoppable(work: Coroutine[Any, Any, T]) -> T:
    """`work`, cancelled on SIGTERM as asyncio.run cancels it on Ctrl-C, so that every
    process it started is stopped either way."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def bench(plan: Plan) -> tuple[dict[str, Any], Samples]:
    results: dict[str, Any] = {"config": plan.config(), "cases": {}}
    samples: Samples = {}
    bodies = Bodies()
    with tempfile.TemporaryDirectory(prefix="kvgate-overhead-") as workdir:
        async with (
            client_factory(plan.client) as new,
            running_fleet(plan.engines, Path(workdir), plan.profile) as fleet,
        ):
            for case in plan.cases():
                print(f"  {case.key}: {case.requests} requests per side...", flush=True)
                compare = compare_c1 if case.concurrency == 1 else compare_blocks
                comparison = await compare(case, fleet, new, bodies)
                results["cases"][case.key] = summarise(case, comparison)
                samples[case.key] = (
                    [v * 1e3 for v in measured(case, comparison.direct)],
                    [v * 1e3 for v in measured(case, comparison.gateway)],
                )
            print(f"  throughput: {plan.duration_s:g} s per side...", flush=True)
            rps = await throughput(fleet, new, bodies, plan.rps_concurrency, plan.duration_s)
            results["config"]["pids"] = {c.name: c.pid for c in fleet.children}
    results["throughput"] = rps
    results["config"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    results.update(headline(results["cases"], rps))
    return results, samples
