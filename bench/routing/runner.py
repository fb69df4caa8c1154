"""`kvgate bench routing`, start to finish.

Per workload: build the script, size and start the engines (one process each), warm them
up with a few requests of their own, then for every offered load and every router, one
after the other on the same fleet: reset every engine's prefix cache, start the router (its
own process), run the load generator (its own process), read the engines' counters before
and after, stop the router. Then the table, the target checks, JSON and PNGs under
`out_dir`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import simulator.tokenizer
from bench.harness.engine_stats import deltas, read_counters, reset_prefix_caches
from bench.harness.fleet import MODEL
from bench.harness.processes import ChildProcess
from bench.harness.streaming import RequestRecord
from bench.results_io import write_json
from bench.routing.engines import RealEngines, RealFleet, RunFleet, SimFleet
from bench.routing.failover import (
    ReplicaKill,
    channel_target,
    failover_figures,
    failover_targets,
    kill_and_replace,
    sync_cpu_share,
)
from bench.routing.fleet import (
    TRACE_KV_TOKENS,
    TRACE_WALL_RATE,
    WALL_RATE,
    FleetPlan,
    capacity_rps,
    plan_fleet,
    plan_trace_fleet,
    trace_service_seconds,
)
from bench.routing.loadgen import LoadSpec
from bench.routing.report import (
    check_targets,
    epp_targets,
    format_table,
    plot_all,
    prediction_lines,
    title,
)
from bench.routing.routers import KVGATE_POLICIES, make_router, needs_vllm_like_engines
from bench.routing.script import Script, trace_speed
from bench.routing.summary import RunResult, median_of, spread_of, summarize
from bench.routing.trace import TraceRequest, TraceSpec, describe, load_trace
from bench.routing.workloads import WorkloadSize, script_of, slowdown
from simulator.latency import LatencyModel


@dataclass(frozen=True, slots=True)
class RoutingOptions:
    workloads: list[str]
    routers: list[str]
    engines: int
    loads: list[float]
    """Offered loads, fractions of the fleet's ideal capacity (open loop)."""
    mode: str
    concurrency: int
    size: WorkloadSize
    time_scale: float | None
    """None: per workload, so that its ideal capacity is `wall_rate` requests per wall
    second (the machine's budget), whatever the workload's request sizes."""
    seed: int
    out_dir: Path
    wall_rate: float | None = None
    """Requests per wall second at 100 % load when `time_scale` is None (None: `WALL_RATE`,
    `TRACE_WALL_RATE` for a trace, whose long prompts cost more CPU each)."""
    slack: float = 1.5
    quiet: bool = False
    replicas: list[tuple[int, bool]] = dataclasses.field(default_factory=lambda: [(1, False)])
    """(gateway replicas, sharing decisions) per run of each of kvgate's policies."""
    kill_replica: bool = False
    """In each run with several replicas, kill one under load and replace it
    (bench/routing/failover.py)."""
    ramp_s: float | None = None
    """Closed loop: model seconds over which the users join; None: at `RAMP_LOAD` of the
    fleet's ideal capacity (see `ramp_for`); 0: all at once."""
    repeat: int = 1
    """Rounds of the routers per workload and load, in alternating order: on a shared
    machine one run's figures move by 10 % or more, and the router running second on a
    fleet is not in the first one's conditions. The report uses each figure's median."""
    slo_tpot_ms: float | None = None
    """Every request carries `x-slo-tpot-ms` (model ms, sent in wall ms); the report gives
    the share of answers whose mean inter-token gap met it."""
    send_slo: bool = True
    """False: `slo_tpot_ms` is only measured against, not sent."""
    keep_records: bool = False
    """Keep each run's per-request records (`logs/<workload>/load-*.records.json`: sent,
    pod, TTFT, kvgate's prediction...), for analysis beyond the report's figures."""
    routing_config: Path | None = None
    """A routing config laid over the built-in policies of every kvgate in the run
    (`KVGATE_ROUTING_CONFIG`); the run folder keeps a copy."""
    config_profiles: tuple[str, ...] = ()
    """The profiles `routing_config` declares: kvgate routers too."""
    traces: tuple[TraceSpec, ...] = ()
    """Replayed traces; each is a workload named `trace:<file stem>` in `workloads`."""
    real_engines: bool = False
    """Real vLLM engines on CPU (`engines` of them) instead of simulated ones."""
    engine_flavor: str = "vllm"
    """The simulated engines' flavour (`--engines sglang:N`: SGLang)."""
    trace_speed: float | None = None
    """Replay every trace this many times faster than recorded instead of at `loads`."""
    vias: tuple[str, ...] = ("proxy",)
    """How the load reaches the engines (`--mode`), each kvgate policy run once per way:
    `proxy` (through `kvgate serve`), `epp` (picked by `kvgate epp`, sent straight to the
    engine as Envoy does; one replica). Other routers run as proxies only."""

    def trace(self, workload: str) -> TraceSpec | None:
        """The trace workload `workload` replays, if it is one."""
        return next((t for t in self.traces if t.name == workload), None)

    @property
    def kvgate_routers(self) -> tuple[str, ...]:
        """The routers that are kvgate policies: the built-ins and `config_profiles`."""
        return (*KVGATE_POLICIES, *self.config_profiles)


SIM_TOKENIZERS = f"{MODEL}={Path(simulator.tokenizer.__file__).parent}"
"""`KVGATE_TOKENIZERS` of a kvgate in front of simulated SGLang engines: the simulated
model's own files (SGLang's /tokenize renders no chat)."""
RAMP_LOAD = 0.8
"""Closed-loop users join at the rate of the open loop's default load."""


def ramp_for(options: RoutingOptions, capacity_rps: float) -> float:
    """Model seconds over which the closed loop's users join. Users of a service do not
    all send their first request in the same millisecond, and a fleet hit by every user's
    cold first turn at once is in an overload no steady state has (160 chat users joining
    within 0.5 s put a median 4.6 s on the first tenth of the answers, and threw the cost
    model off for most of the run)."""
    if options.ramp_s is not None:
        return options.ramp_s
    return options.concurrency / (RAMP_LOAD * capacity_rps) if capacity_rps > 0 else 0.0


def run_routing(options: RoutingOptions) -> int:
    if options.routing_config is not None:  # what the run's kvgate profiles were
        kept = options.out_dir / f"routing-config{options.routing_config.suffix or '.toml'}"
        options.out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(options.routing_config, kept)
    return asyncio.run(_main(options))


async def _main(options: RoutingOptions) -> int:
    results: list[RunResult] = []
    medians: list[dict[str, Any]] = []
    ttfts: dict[str, list[float]] = {}
    predictions: dict[str, list[tuple[float, float]]] = {}
    plans: dict[str, dict[str, Any]] = {}
    rng = random.Random()
    logs = options.out_dir / "logs"
    real = RealEngines(options.out_dir) if options.real_engines else None
    async with httpx.AsyncClient(timeout=10.0) as client:
        if real is not None:
            await real.prepare()
        for workload in options.workloads:
            workload_logs = logs / _folder(workload)
            prepared = await _prepare(options, workload, client, real, workload_logs, rng)
            script, plan, capacity, fleet = prepared
            plans[workload] = _describe(options, workload, script, plan, capacity)
            ramp = ramp_for(options, capacity)
            if options.mode == "closed":
                plans[workload]["closed_ramp_s"] = ramp
            _say(options, _intro(script, plan, capacity))
            try:
                for load, rate in _points(options, script, capacity):
                    rounds: list[list[RunResult]] = []
                    for round_index in range(options.repeat):
                        order = _runs(options)
                        if round_index % 2:
                            order.reverse()
                        point: list[RunResult] = []
                        for router, (replicas, shared), via in order:
                            await fleet.before_run(client, fresh=bool(script.arrivals))
                            result, values, pairs = await _run_one(
                                options, client, script, plan, fleet, router, load, rate,
                                replicas, shared, ramp_s=ramp,
                                vocabulary=real.vocabulary if real is not None else None,
                                via=via,
                            )  # fmt: skip
                            result = dataclasses.replace(result, round=round_index)
                            point.append(result)
                            if round_index == 0:  # the plots show the first round
                                ttfts[f"{workload}|{result.label}|{load}"] = values
                                predictions[f"{workload}|{result.label}|{load}"] = pairs
                            _say(options, _line(result))
                        results.extend(point)
                        rounds.append(point)
                        if options.repeat > 1:
                            print(f"\n{title(point[0])}, round {round_index + 1} of "
                                  f"{options.repeat}")  # fmt: skip
                            print(format_table(point))
                    if options.repeat == 1:
                        _report(rounds[0], title(rounds[0][0]))
                        continue
                    merged = _medians(rounds)
                    _report([m for m, _spread in merged],
                            f"{title(rounds[0][0])}: median of {options.repeat} rounds, "
                            "the routers' order reversed in every other one",
                            {m.label: spread for m, spread in merged})  # fmt: skip
                    print("spread over the rounds (lowest – highest):")
                    print("\n".join(_spread_line(m, spread) for m, spread in merged))
                    medians += [{**m.as_json(), "rounds": options.repeat, "spread": spread}
                                for m, spread in merged]  # fmt: skip
            finally:
                await fleet.stop()
    document: dict[str, Any] = {
        "options": {
            **dataclasses.asdict(options),
            "out_dir": str(options.out_dir),
            "routing_config": options.routing_config and str(options.routing_config),
        },
        "fleets": plans,
        "runs": [r.as_json() for r in results],
    }
    if medians:
        document["medians"] = medians
    paths = [write_json(options.out_dir / "routing.json", document)]
    first_round = [r for r in results if r.round == 0]
    paths += plot_all(options.out_dir, first_round, ttfts, predictions)
    print("\nresults: " + ", ".join(str(p) for p in paths))
    # Requests lost with a replica killed on purpose are that experiment's figure.
    unexpected = [r.errors - r.replica_kill.get("lost_on_killed", 0) for r in results]
    return 1 if any(unexpected) else 0


async def _prepare(
    options: RoutingOptions,
    workload: str,
    client: httpx.AsyncClient,
    real: RealEngines | None,
    log_dir: Path,
    rng: random.Random,
) -> tuple[Script, FleetPlan, float, RunFleet]:
    """Workload `workload`'s script, its fleet's plan (at its time scale), the fleet's
    ideal capacity (requests per model second), and the fleet, started."""
    trace = options.trace(workload)
    script = script_of(workload, options.size, options.seed, trace)
    requests = load_trace(trace) if trace is not None else None
    if requests is not None:
        kv_tokens = round(TRACE_KV_TOKENS * trace.scale) if trace is not None else 0
        plan = plan_trace_fleet(requests, options.engines, 1.0, kv_tokens=kv_tokens)
    else:
        plan = plan_fleet(
            script, options.engines, 1.0, slack=options.slack, slowdown=slowdown(workload)
        )
    if real is not None:
        plan = real.context(plan, script.longest_request_tokens())
        fleet: RunFleet = await RealFleet.start(plan, real.model_dir, log_dir, client)
        try:
            await real.measure(client, fleet.endpoints[0], plan.max_model_len)
        except BaseException:
            await fleet.stop()
            raise
        plan = real.plan(plan)
        if trace is not None:  # its prompts in the words the engines hold as one token
            script = script_of(workload, options.size, options.seed, trace, real.vocabulary)
        return script, plan, _capacity(script, plan, requests), fleet
    capacity = _capacity(script, plan, requests)
    wall_rate = options.wall_rate or (TRACE_WALL_RATE if trace is not None else WALL_RATE)
    plan = dataclasses.replace(plan, time_scale=options.time_scale or wall_rate / capacity)
    if needs_vllm_like_engines(options.routers):
        plan = plan.vllm_like()
    plan = dataclasses.replace(plan, flavor=options.engine_flavor)
    sim = SimFleet(plan, log_dir, options.seed, rng)
    await sim.start(client)
    return script, plan, capacity, sim


def _capacity(script: Script, plan: FleetPlan, requests: list[TraceRequest] | None) -> float:
    if requests is not None:
        return plan.engines / trace_service_seconds(requests, plan)
    return capacity_rps(script, plan)


def _points(
    options: RoutingOptions, script: Script, capacity: float
) -> list[tuple[float | None, float]]:
    """(load, offered requests per model second) of each point of the run: a trace
    replayed at `--trace-speed` is one point, its load what that speed offers."""
    if options.mode == "closed":
        return [(None, 0.0)]
    if script.arrivals and options.trace_speed is not None:
        rate = options.trace_speed * script.natural_rate
        return [(rate / capacity, rate)]
    return [(load, load * capacity) for load in options.loads]


def _folder(workload: str) -> str:
    """A workload's folder name (`trace:x` is `trace-x`: no colon in a path)."""
    return workload.replace(":", "-")


def _report(
    point: list[RunResult],
    heading: str,
    spreads: dict[str, dict[str, list[float]]] | None = None,
) -> None:
    """The table, the prediction accuracy and the targets of one workload at one load
    (`spreads`: each label's ranges over the rounds)."""
    print(f"\n{heading}")
    print(format_table(point))
    met = [f"  {r.label}: {r.tpot_met:.1%}" for r in point if r.tpot_met is not None]
    if met:
        print("TPOT objective met (mean inter-token gap of each answer):")
        print("\n".join(met))
    accuracy = prediction_lines(point)
    if accuracy:
        print("TTFT predictions (observed at the client vs kvgate's, model ms):")
        print("\n".join(accuracy))
    targets = check_targets(point) + epp_targets(point, spreads)
    for each in point:
        targets += channel_target(each.label, each.replica_sync_cpu_share)
        targets += failover_targets(each.label, each.replica_kill)
    if targets:
        print("targets:")
        print("\n".join(targets))


def _medians(rounds: list[list[RunResult]]) -> list[tuple[RunResult, dict[str, list[float]]]]:
    """Per router (in the first round's order), the median of its runs and their spread."""
    merged = []
    for first in rounds[0]:
        runs = [r for point in rounds for r in point if r.label == first.label]
        merged.append((median_of(runs), spread_of(runs)))
    return merged


def _spread_line(result: RunResult, spread: dict[str, list[float]]) -> str:
    parts = [
        f"TTFT p50 {_range(spread['ttft_p50'])}",
        f"p90 {_range(spread['ttft_p90'])}",
        f"p99 {_range(spread['ttft_p99'])} ms",
        f"hit rate {spread['hit_rate'][0]:.1%}–{spread['hit_rate'][1]:.1%}",
    ]
    if "rel_err_p90" in spread:
        low, high = spread["rel_err_p90"]
        parts.append(f"prediction |error| p90 {low:.0%}–{high:.0%}")
    parts += [
        f"{name.removesuffix('_ttft_p90')} p90 {_range(values)} ms"
        for name, values in spread.items()
        if name.endswith("_ttft_p90") and name != "ttft_p90"
    ]
    return f"  {result.label}: " + ", ".join(parts)


def _range(values: list[float]) -> str:
    return f"{values[0]:,.0f}–{values[1]:,.0f}"


async def _run_one(
    options: RoutingOptions,
    client: httpx.AsyncClient,
    script: Script,
    plan: FleetPlan,
    fleet: RunFleet,
    router_name: str,
    load: float | None,
    rate: float,
    replicas: int = 1,
    shared: bool = False,
    *,
    ramp_s: float = 0.0,
    vocabulary: tuple[str, ...] | None = None,
    via: str = "proxy",
) -> tuple[RunResult, list[float], list[tuple[float, float]]]:
    engines, endpoints = fleet.processes, fleet.endpoints
    await reset_prefix_caches(client, [e.url for e in endpoints])
    await fleet.after_reset(client)
    logs = options.out_dir / "logs" / _folder(script.name)
    routers = [
        make_router(router_name, fleet.pods, endpoints, logs, random.Random(), plan.block_hash,
                    replica=index if replicas > 1 else None, prior_scale=_prior_scale(plan),
                    routing_config=options.routing_config, profiles=options.kvgate_routers,
                    engine_block_size=fleet.block_size,
                    tokenizers=SIM_TOKENIZERS if plan.flavor == "sglang" else None, via=via)
        for index in range(replicas)
    ]  # fmt: skip
    router = routers[0]
    killing = options.kill_replica and replicas > 1
    if killing:  # one admin token: a replacement bootstraps its index from a peer's
        for each in routers[1:]:
            each.env["KVGATE_ADMIN_TOKEN"] = routers[0].env["KVGATE_ADMIN_TOKEN"]
            each.admin_token = routers[0].admin_token
    kill = ReplicaKill()
    if shared:  # each replica publishes on its port + 1 (reserved with it) to the others
        sync = [f"tcp://127.0.0.1:{each.port + 1}" for each in routers]
        for each, own in zip(routers, sync, strict=True):
            each.env["KVGATE_REPLICA_SYNC_BIND"] = own
            each.env["KVGATE_REPLICA_PEERS"] = ",".join(e for e in sync if e != own)
    try:
        for each in routers:
            await each.start()
        for each in routers:
            await each.wait_ready(client)
        before = await read_counters(client, endpoints)
        spec = LoadSpec(
            router_url=router.url,
            replica_urls=tuple(each.url for each in routers) if replicas > 1 else (),
            model=endpoints[0].model,
            workload=script.name,
            size=options.size,
            seed=options.seed,
            mode=options.mode,
            rate=rate,
            concurrency=options.concurrency,
            time_scale=plan.time_scale,
            ramp_s=ramp_s,
            slo_tpot_ms=options.slo_tpot_ms if options.send_slo else None,
            trace=options.trace(script.name),
            vocabulary=vocabulary,
            picker=router.grpc_target,
        )
        cpu_before = (_cpu_of(engines), _cpu_of(routers), time.perf_counter())
        suffix = (f"x{replicas}" + ("" if shared else "i")) if replicas > 1 else ""
        suffix += "" if via == "proxy" else f"@{via}"
        killer = (
            asyncio.create_task(kill_and_replace(client, routers, script.requests, kill))
            if killing
            else None
        )
        try:
            stem = logs / f"load-{router_name}{suffix}-{load}"
            records = await _load(spec, stem, keep=options.keep_records)
        finally:
            if killer is not None:
                if not killer.done():  # the run ended before a third was answered
                    killer.cancel()
                await asyncio.gather(killer, return_exceptions=True)
        wall = time.perf_counter() - cpu_before[2]
        router_cpu = _cpu_of(routers) + kill.victim_cpu_s
        cpu = {
            "engines": (_cpu_of(engines) - cpu_before[0]) / wall,
            "router": (router_cpu - cpu_before[1]) / wall,
        }
        after = await read_counters(client, endpoints)
        channel = await sync_cpu_share(client, routers) if shared else None
    finally:
        for each in routers:
            await each.stop()
    result = summarize(
        workload=script.name,
        router=router_name,
        load=load,
        rate_rps=rate,
        records=records,
        engines=deltas(after, before),
        time_scale=plan.time_scale,
        slo_tpot_ms=options.slo_tpot_ms,
        trace_speed=trace_speed(script, rate) if script.arrivals else None,
        real_engines=options.real_engines,
    )
    answered = max(1, result.requests - result.errors)
    result = dataclasses.replace(
        result,
        via=via,
        replicas=replicas,
        replica_sync=shared,
        replica_kill=failover_figures(records, kill, plan.time_scale * 1e3) if killing else {},
        replica_sync_cpu_share=channel,
        cpu_cores=cpu,
        router_cpu_ms_per_request=cpu["router"] * wall / answered * 1e3,
    )
    scale = plan.time_scale * 1e3
    ttfts = [r.ttft_s * scale for r in records if r.ttft_s is not None]
    pairs = [
        (r.ttft_s * scale, r.predicted_ttft_s * scale)
        for r in records
        if r.ttft_s is not None and r.predicted_ttft_s is not None
    ]
    return result, ttfts, pairs


async def _load(spec: LoadSpec, stem: Path, *, keep: bool = False) -> list[RequestRecord]:
    """The load generator in its own process; its records (`keep`: their file stays)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = stem.with_suffix(".spec.json"), stem.with_suffix(".records.json")
    spec_path.write_text(json.dumps(spec.to_json()))
    process = ChildProcess("load generator", stem.with_suffix(".log"))
    await process.spawn([sys.executable, "-m", "bench.routing.loadgen", str(spec_path),
                         str(out_path)])  # fmt: skip
    code = await process.wait()
    await process.stop()
    if code != 0:
        raise RuntimeError(f"load generator failed ({code}): see {stem.with_suffix('.log')}")
    records = [RequestRecord(**r) for r in json.loads(out_path.read_text())]
    if keep:  # one file per run: a later round of the same router gets the next number
        kept = next(
            path
            for n in itertools.count(1)
            if not (path := stem.with_name(f"{stem.name}.{n}.records.json")).exists()
        )
        out_path.rename(kept)
    else:
        out_path.unlink()
    return records


def _runs(options: RoutingOptions) -> list[tuple[str, tuple[int, bool], str]]:
    """(router, (replicas, shared), via) of each run: kvgate's policies once per replica
    setup through the proxy and once per other way (`vias`; one replica); the others once,
    as proxies."""
    runs: list[tuple[str, tuple[int, bool], str]] = []
    for router in options.routers:
        if router not in options.kvgate_routers:
            runs.append((router, (1, False), "proxy"))
            continue
        for via in options.vias:
            setups = options.replicas if via == "proxy" else [(1, False)]
            runs += [(router, setup, via) for setup in setups]
    return runs


def _prior_scale(plan: FleetPlan) -> float:
    """How many times slower than the cost model's prior (a calibrated 14B model on one
    GPU, which the simulator is in model time) the engines answer, as an operator tells it
    of slower GPUs: a simulated fleet runs its time scale faster; real engines as measured."""
    calibrated: float = LatencyModel().prefill_us_per_token
    return float(plan.latency.prefill_us_per_token) / calibrated / plan.time_scale


def _cpu_of(processes: Sequence[ChildProcess]) -> float:
    """CPU seconds of these processes and their reaped children (0 for one not known)."""
    return sum(p.cpu_seconds(with_children=True) or 0.0 for p in processes)


def _describe(
    options: RoutingOptions, workload: str, script: Script, plan: FleetPlan, capacity: float
) -> dict[str, Any]:
    working = script.working_set_tokens()
    described: dict[str, Any] = {
        "requests": script.requests,
        "conversations": len(script.conversations),
        "working_set_tokens": working,
        "engines": plan.engines,
        "gpu_blocks_per_engine": plan.gpu_blocks,
        "engine_share_of_working_set": plan.gpu_blocks * 16 / working,
        "time_scale": plan.time_scale,
        "max_batch": plan.max_batch,
        "max_model_len": plan.max_model_len,
        "block_hash": plan.block_hash,
        "topic": plan.topic,
        "latency": dataclasses.asdict(plan.latency),
        "slow_engines": plan.engines // 2 if plan.slowdown != 1.0 else 0,
        "slowdown": plan.slowdown,
        "ideal_capacity_rps": capacity,
        "engine_kind": "vllm" if options.real_engines else f"sim-{options.engine_flavor}",
    }
    trace = options.trace(workload)
    if trace is not None:
        figures = describe(load_trace(trace))
        described["trace"] = {**trace.to_json(), **figures, "natural_rate_rps": script.natural_rate}
    return described


def _intro(script: Script, plan: FleetPlan, capacity: float) -> str:
    working = script.working_set_tokens()
    what = (
        f"{script.requests} requests over {script.arrivals[-1] - script.arrivals[0]:,.0f} s "
        f"({script.natural_rate:.2f} req/s)"
        if script.arrivals
        else f"{script.requests} requests in {len(script.conversations)} conversations"
    )
    return (
        f"\n== workload {script.name}: {what}, working set {working:,} tokens; "
        f"{plan.engines} engines × {plan.gpu_blocks} blocks "
        f"({plan.gpu_blocks * 16 / working:.0%} of it each), time scale {plan.time_scale:g}, "
        f"ideal capacity {capacity:.1f} req/s (model time)"
    )


def _line(result: RunResult) -> str:
    return (
        f"  {result.label:<18} {result.requests} req, {result.errors} err, "
        f"hit {result.hit_rate:.1%}, TTFT p90 {result.ttft_ms['p90']:,.0f} ms, "
        f"{result.duration_s:.1f} s wall, cpu engines {result.cpu_cores.get('engines', 0):.2f} "
        f"router {result.cpu_cores.get('router', 0):.2f} "
        f"({result.router_cpu_ms_per_request:.2f} ms/request)"
        + (
            f", prediction |error| p50/p90 {result.prediction['rel_err_p50']:.0%}"
            f"/{result.prediction['rel_err_p90']:.0%}"
            if result.prediction
            else ""
        )
        + (
            f", pick p50/p90 {result.pick_ms['p50']:,.0f}/{result.pick_ms['p90']:,.0f} ms"
            if result.pick_ms
            else ""
        )
    )


def _say(options: RoutingOptions, message: str) -> None:
    if not options.quiet:
        print(message, file=sys.stderr, flush=True)
