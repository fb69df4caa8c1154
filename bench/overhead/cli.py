"""`kvgate bench overhead`: its flags, the plan they make, and the run from start to report."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.overhead.channels import client_factory
from bench.overhead.epp import MODES, pick_phase
from bench.overhead.fleet import running_fleet, stream_fleet
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
from bench.overhead.report import (
    Samples,
    plot,
    print_profile,
    report,
    router_figures,
    targets,
    tokenizer_figures,
)
from bench.overhead.streams import StreamPlan, StreamSamples, stream_phase
from bench.results_io import add_output_arguments, write_json
from bench.routing.routers import PACKAGES, ensure_venv

PEERS = ("sglang-router", "vllm-router")
"""Peer routers this benchmark can start (`--peers`), each with `--policy cache_aware`."""


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
    add("--peers", nargs="?", const="sglang-router", default="", metavar="NAMES",
        help="also measure these routers (comma-separated; alone: sglang-router), installed "
        "into bench/.venvs/ on first use")  # fmt: skip
    add("--streams", type=int, default=None, help="streams running at once, streaming "
        "phase (32; quick 16); 2x as many per round and target, starts evenly spread")  # fmt: skip
    add("--stream-tokens", type=int, default=None, help="tokens per stream (256; quick 64)")
    add("--stream-rounds", type=int, default=None, help="rounds per target (2)")
    add("--stream-policy", default=None, metavar="NAME", help="kvgate's policy for the "
        "streams (default: its default, prefix-cache)")  # fmt: skip
    add("--stream-decode-ms", type=float, default=25.0, help="the streaming engine's "
        "--decode-ms-per-token (its step adds 0.2 ms per running sequence)")  # fmt: skip
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
    stream: StreamPlan
    peers: tuple[str, ...] = ()
    skipped_peers: tuple[tuple[str, str], ...] = ()
    """Peers asked for that could not be installed, with why."""

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, peers: tuple[str, ...] = (),
        skipped: tuple[tuple[str, str], ...] = (),
    ) -> Plan:  # fmt: skip
        requests = args.requests or (150 if args.quick else 2000)
        stream = StreamPlan(
            streams=args.streams or (16 if args.quick else 32),
            tokens=args.stream_tokens or (64 if args.quick else 256),
            rounds=args.stream_rounds or 2,
            decode_ms=(args.stream_decode_ms, 0.2),
            kvgate_policy=args.stream_policy,
        )
        return cls(
            requests=requests,
            requests_c32=args.requests_c32 or (320 if args.quick else 4000),
            stream_requests=args.stream_requests or requests,
            duration_s=args.duration or (3.0 if args.quick else 10.0),
            rps_concurrency=args.rps_concurrency,
            engines=args.engines,
            client=args.client,
            profile=args.profile_gateway,
            stream=stream,
            peers=peers,
            skipped_peers=skipped,
        )

    def cases(self) -> list[Case]:
        one, many = self.requests, self.requests_c32
        return [
            Case("c1", "round-robin", 1, one),
            Case("c1_relay", "round-robin", 1, one, via="relay"),
            Case("c32", "round-robin", 32, many),
            Case("c32_relay", "round-robin", 32, many, via="relay"),
            *self.tokenizer_cases(),
            Case("stream", "round-robin", 1, self.stream_requests, stream=True),
            *(case for peer in self.peers for case in self.peer_cases(peer)),
        ]

    def tokenizer_cases(self) -> list[Case]:
        """Tokenized requests (prefix-cache), text and chat, by pairs: through the gateway
        that asks the engines' /tokenize and, keys ending in `_local`, through the one
        tokenizing in-process; which of a pair goes first alternates."""
        one, many = self.requests, self.requests_c32
        cases: list[Case] = []
        for index, (key, concurrency, requests, distinct, chat) in enumerate((
            ("c1_tokenized", 1, one, False, False),
            ("c1_tokenized_distinct", 1, one, True, False),
            ("c1_chat_distinct", 1, one, True, True),
            ("c32_tokenized", 32, many, False, False),
            ("c32_tokenized_distinct", 32, many, True, False),
            ("c32_chat_distinct", 32, many, True, True),
        )):  # fmt: skip
            pair = [
                Case(key, "prefix-cache", concurrency, requests, distinct, chat=chat),
                Case(f"{key}_local", "prefix-cache", concurrency, requests, distinct,
                     via="gateway-local", chat=chat),
            ]  # fmt: skip
            cases.extend(pair if index % 2 == 0 else reversed(pair))
        return cases

    def peer_cases(self, peer: str) -> list[Case]:
        """A peer's requests as kvgate's c1, c32 and c32_tokenized_distinct cases, routed
        by its own policy (`cache_aware`)."""
        one, many, key = self.requests, self.requests_c32, peer.replace("-", "_")
        return [
            Case(f"c1_{key}", "cache_aware", 1, one, via=peer),
            Case(f"c32_{key}", "cache_aware", 32, many, via=peer),
            Case(f"c32_distinct_{key}", "cache_aware", 32, many, distinct=True, via=peer),
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
            "peers": list(self.peers),
            "peers_skipped": dict(self.skipped_peers),
        }


def resolve_peers(names: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The peers asked for that are installed (installing them on first use), and those
    that could not be, with why."""
    ok: list[str] = []
    skipped: list[tuple[str, str]] = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name not in PEERS:
            raise SystemExit(f"kvgate bench overhead: --peers: {name!r} is not one of {PEERS}")
        try:
            ensure_venv(PACKAGES[name])
            ok.append(name)
        except (subprocess.CalledProcessError, OSError) as exc:
            print(f"{name} could not be installed ({exc}): its columns are skipped",
                  file=sys.stderr)  # fmt: skip
            skipped.append((name, str(exc)))
    return tuple(ok), tuple(skipped)


T = TypeVar("T")


def run(args: argparse.Namespace) -> int:
    plan = Plan.from_args(args, *resolve_peers(args.peers))
    try:
        results, samples, stream_samples = asyncio.run(_stoppable(bench(plan)))
    except (RuntimeError, OSError, EOFError) as exc:  # EOFError: a server hung up mid-answer
        print(f"kvgate bench overhead: {exc!r}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("kvgate bench overhead: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    report(results)
    pick = results["epp_pick"]
    for mode in MODES:
        for level in ("c1", "c32"):
            figures = pick[mode][level]
            slices = figures["added_p50_ms_by_slice"]
            print(f"kvgate epp pick, {mode} {level}: p50 {figures['picker']['p50_ms']} ms "
                  f"(null picker {figures['null']['p50_ms']} ms: added "
                  f"{figures['added_p50_ms']} ms, by slice {slices})")  # fmt: skip
    print(f"kvgate epp pick: added p50 <= {pick['target_added_p50_c1_ms']:g} ms at c=1 "
          f"(FULL_DUPLEX_STREAMED): {'met' if pick['met'] else 'MISSED'}")  # fmt: skip
    write_json(args.json, results)
    print(f"JSON written to {args.json}")
    plot(args.plot, samples, stream_samples, results)
    print(f"plot written to {args.plot}")
    if plan.profile is not None:
        print_profile(plan.profile)
    failed: Counter[str] = Counter()
    for case in results["cases"].values():
        failed.update(case["error_statuses"])
    for side in ("direct", "gateway"):
        failed.update(results["throughput"][f"{side}_error_statuses"])
    for name, target in results["streaming"]["targets"].items():
        failed.update({f"stream {name} {k}": v for k, v in target["failed_streams"].items()})
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


async def bench(plan: Plan) -> tuple[dict[str, Any], Samples, StreamSamples]:
    results: dict[str, Any] = {"config": plan.config(), "cases": {}}
    samples: Samples = {}
    bodies = Bodies()
    with tempfile.TemporaryDirectory(prefix="kvgate-overhead-") as workdir:
        async with (
            client_factory(plan.client) as new,
            running_fleet(plan.engines, Path(workdir), plan.profile, plan.peers) as fleet,
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
            print(f"  epp picks: {plan.requests} at c=1, {plan.requests_c32} at c=32...",
                  flush=True)  # fmt: skip
            results["epp_pick"] = await pick_phase(
                Path(workdir) / "pods.json", Path(workdir) / "epp.log", plan.requests,
                plan.requests_c32,
            )  # fmt: skip
            results["config"]["pids"] = {c.name: c.pid for c in fleet.children}
        stream = plan.stream
        print(f"  streaming: {stream.per_round} streams x {stream.tokens} tokens per target, "
              f"{stream.rounds} round(s), {stream.streams} at once...", flush=True)  # fmt: skip
        async with stream_fleet(Path(workdir), stream.decode_ms, plan.peers) as fleet:
            results["streaming"], stream_samples = await stream_phase(stream, fleet)
            results["config"]["stream_pids"] = {c.name: c.pid for c in fleet.children}
    results["throughput"] = rps
    results["config"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    results.update(headline(results["cases"], rps))
    results["routers"] = router_figures(results, plan.peers)
    results["tokenizers"] = tokenizer_figures(results["cases"])
    results["targets"] = targets(results)
    return results, samples, stream_samples
