"""`kvgate bench decision`: the CPU cost of one routing decision, tokenization excluded.

The gateway's own `Router.route` in one process, on a fleet of `--pods` pods of one model
whose index holds 16 shared 1,024-token system prompts (each on a quarter of the pods,
stored through `apply_stored` as the subscriber would): every request is a completion
with its token ids (so no tokenizer call), a system prompt + 1,024 unique tokens. The
figure is the CPU time (this thread's) of `route` less its tokenization (prefix hashing,
index match, the profile's plugins), and with the commit (the router-side entries and the
cost model's bookkeeping), per policy, interleaved so that every policy sees the same
machine state; p50 and p99 in µs. Every pod has been scraped (running and waiting
counts), and the garbage collector runs with `kvgate serve`'s thresholds, as in a live
gateway.

`--step-ends N`: between decisions, N random pods (at most `--pods`) see a step end (the
first chunk of a pod's streamed answers after a quiet spell, as the proxy reports it to
the cost model): each such pod is estimated again at the next decision. A fleet of 64
pods streaming at 25 ms steps ends ~2,600 steps a second, so N is that rate divided by the
decisions per second.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bench.results_io import (
    add_output_arguments,
    figure,
    have_matplotlib,
    percentile,
    print_table,
    write_json,
)
from gateway.control.discovery import Pod
from gateway.control.registry import PodRegistry, PodState
from gateway.routing.metrics import RouterMetrics
from gateway.routing.routed import Routed
from gateway.routing.router import Kind, Router, build_policies
from gateway.runtime import tune_gc
from gateway.settings import Settings
from indexer import IndexConfig, SyncPrefixHashTable
from predictor import Predictor

MODEL = "bench-model"
BLOCK = 16
POLICIES = ("prefix-cache", "prefix-share", "round-robin")
TARGET_P50_US = 100.0


@dataclass(frozen=True, slots=True)
class _Stored:
    """A BlockStored event as the subscriber's decoder yields it."""

    block_hashes: Sequence[int]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    block_size: int = BLOCK
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = "GPU"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--pods", type=int, default=64, help="pods in the fleet (64)")
    add("--requests", type=int, default=3000, help="decisions per policy")
    add("--seed", type=int, default=0)
    add("--step-ends", type=int, default=0, metavar="N",
        help="pods whose step ends between two decisions (0)")  # fmt: skip
    add_output_arguments(parser, "decision")


def run(args: argparse.Namespace) -> int:
    if args.pods < 1 or args.requests < 10 or args.step_ends < 0:
        print("kvgate bench decision: --pods >= 1, --requests >= 10 and --step-ends >= 0")
        return 2
    previous_gc = tune_gc()  # as `kvgate serve` runs (gateway/runtime.py)
    thresholds = list(gc.get_threshold())
    try:
        results = asyncio.run(_measure(args.pods, args.requests, args.seed, args.step_ends))
    finally:
        gc.set_threshold(*previous_gc)
    rows = []
    for policy, figures in results.items():
        note = ""
        if policy == "prefix-cache":
            ok = figures["p50_us"] <= TARGET_P50_US
            note = f"target p50 ≤ {TARGET_P50_US:.0f} µs {'✓' if ok else '✗'}"
        decision = f"{figures['p50_us']:.1f} / {figures['p99_us']:.1f} µs"
        rows.append((f"{policy} decision p50 / p99", decision, note))
        route = f"{figures['route_p50_us']:.1f} / {figures['route_p99_us']:.1f} µs"
        rows.append((f"{policy} + commit p50 / p99", route, "router-side entries, cost model"))
    between = f", {args.step_ends} step ends between decisions" if args.step_ends else ""
    print_table(f"routing decision, {args.pods} pods, tokenization excluded{between}", rows)
    document = {
        "pods": args.pods,
        "requests": args.requests,
        "step_ends_per_decision": args.step_ends,
        "gc_thresholds": thresholds,
        "policies": results,
    }
    print(f"results: {write_json(args.json, document)}")
    _plot(args.plot, results)
    return 0


async def _measure(
    pods: int, requests: int, seed: int, step_ends: int
) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    settings = Settings(index=IndexConfig(block_size=BLOCK))
    table = SyncPrefixHashTable(settings.index)
    registry = PodRegistry(table=table, subscribers=None)
    names = [f"pod-{i:03d}" for i in range(pods)]
    for name in names:
        await registry.upsert_pod(Pod(name=name, url=f"http://{name}:8000", model=MODEL))
        table.register_pod(name, MODEL, publishes_events=True)
    for state in registry.serving(MODEL):  # as the metrics scraper leaves them
        state.scraped_at, state.running, state.waiting = 0.0, float(rng.randrange(8)), 1.0
    systems = [[rng.randrange(1, 50_000) for _ in range(1024)] for _ in range(16)]
    engine_hash = 1
    for system in systems:
        for name in rng.sample(names, max(1, pods // 4)):
            parent = None
            for start in range(0, len(system), BLOCK):
                stored = _Stored([engine_hash], parent, system[start : start + BLOCK])
                table.apply_stored(name, stored)
                parent, engine_hash = engine_hash, engine_hash + 1
    # With step ends, the cost model runs on a clock of its own, 2.5 ms a decision: every
    # step end is then a new step (two chunks closer than 2 ms are one step's), and the
    # run stays under the 10 s after which an unanswered pod would be probed.
    model_time = [0.0]
    cost = Predictor(settings.cost_params(), clock=(lambda: model_time[0]) if step_ends else None)
    router = _TimedRouter(
        registry=registry,
        table=table,
        tokenizer=None,
        policies=build_policies(settings, rng, cost=cost),
        default_policy="prefix-cache",
        metrics=RouterMetrics(CollectorRegistry()),
        cost=cost,
    )
    routes: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    decisions: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    profiles = {policy: router.policy(policy) for policy in POLICIES}
    clock = _cpu_clock
    for index in range(requests):
        prompt = rng.choice(systems) + [rng.randrange(1, 50_000) for _ in range(1024)]
        body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "stream": True}
        order = POLICIES if index % 2 == 0 else tuple(reversed(POLICIES))
        for policy in order:
            started = clock()
            routed = await router.route("completion", body, profiles[policy], body_bytes=8192)
            took = clock() - started
            routes[policy].append(took)
            decisions[policy].append(took - router.dispatch_s - router.tokenize_s)
            router.finish(routed)
        if step_ends:
            model_time[0] += 0.0025
            for name in rng.sample(names, min(step_ends, pods)):
                cost.pulse(name)
    return {
        policy: {
            "p50_us": percentile(decisions[policy], 50) * 1e6,
            "p99_us": percentile(decisions[policy], 99) * 1e6,
            "route_p50_us": percentile(routes[policy], 50) * 1e6,
            "route_p99_us": percentile(routes[policy], 99) * 1e6,
        }
        for policy in POLICIES
    }


_cpu_clock = time.thread_time
"""This thread's CPU time: what a decision costs the gateway, without the time the shared
machine's other processes held the core (a wall clock counts that in, at random)."""


class _TimedRouter(Router):
    """The gateway's router, timing apart from the decision its tokenization (here: the
    client's token ids read and checked) and the commit of each decision (router-side
    index entries for the prompt's blocks and the cost model's bookkeeping)."""

    dispatch_s = 0.0
    tokenize_s = 0.0

    async def _tokenize(
        self,
        kind: Kind,
        body: Mapping[str, Any],
        routable: Sequence[PodState],
        *,
        for_prefix: bool = True,
        refusal_is_final: bool = False,
    ) -> list[int] | None:
        started = _cpu_clock()
        tokens = await super()._tokenize(
            kind, body, routable, for_prefix=for_prefix, refusal_is_final=refusal_is_final
        )
        self.tokenize_s = _cpu_clock() - started
        return tokens

    def dispatch(self, routed: Routed, state: PodState) -> None:
        started = _cpu_clock()
        super().dispatch(routed, state)
        self.dispatch_s = _cpu_clock() - started


def _plot(path: Path, results: dict[str, dict[str, float]]) -> None:
    if not have_matplotlib():
        return
    with figure(path, figsize=(6, 3.5)) as (_, axes):
        names = list(results)
        axes.bar([n + " p50" for n in names], [results[n]["p50_us"] for n in names])
        axes.bar([n + " p99" for n in names], [results[n]["p99_us"] for n in names])
        axes.axhline(TARGET_P50_US, linestyle="--", color="grey")
        axes.set_ylabel("µs per decision")
        axes.tick_params(axis="x", rotation=30)
