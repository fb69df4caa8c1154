"""The demo, start to finish, and its signal handling.

One process runs the gateway (in-process uvicorn) and the load generator (asyncio tasks);
the engines run in a child process (`bench.harness.SimProcess`). SIGINT and SIGTERM set one event:
while the benchmark runs it is cancelled (exit 130), while serving the demo returns 0;
either way the gateway stops first, then the engine process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench.demo.instructions import serving_instructions
from bench.demo.loadgen import LoadSpec, run_load
from bench.demo.plan import DemoPlan
from bench.demo.progress import ProgressBar
from bench.demo.report import RunSummary, format_table, headline, plot, summarize
from bench.harness.engine_stats import deltas, read_counters, reset_prefix_caches
from bench.harness.fleet import SimOptions, SimProcess, write_pods_file
from bench.harness.gateway import AdminClient, serve_in_process
from bench.harness.probe import LoopLagProbe
from bench.harness.readiness import StartError
from bench.harness.streaming import RequestRecord
from bench.results_io import write_json
from bench.workloads.chat import ChatWorkload
from gateway.settings import Settings

POLICIES = ("round-robin", "prefix-cache")
"""The default comparison: the baseline first, then the policy it is compared with."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    plan: DemoPlan
    port: int
    out_dir: Path
    serve: bool
    quiet: bool
    progress: bool
    policies: tuple[str, str] = POLICIES
    """(baseline, candidate): the table's two columns, run in this order."""


@dataclass(slots=True)
class _Phase:
    serving: bool = False


def run_demo(options: DemoOptions) -> int:
    return asyncio.run(_main(options))


async def _main(options: DemoOptions) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    phase = _Phase()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        demo = asyncio.create_task(_demo(options, stop, phase), name="kvgate-demo")
        stopper = asyncio.create_task(stop.wait(), name="kvgate-demo-stop")
        await asyncio.wait({demo, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if demo.done():
            try:
                return demo.result()
            except (StartError, TimeoutError, OSError, httpx.HTTPError) as exc:
                print(f"kvgate demo: {type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
        if phase.serving:
            return await demo  # sees `stop` and shuts down in order
        _say(options, "\ninterrupted: stopping the gateway and the engines")
        demo.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await demo
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _demo(options: DemoOptions, stop: asyncio.Event, phase: _Phase) -> int:
    plan = options.plan
    workload = plan.workload()
    spec = SimOptions(
        gpu_blocks=plan.gpu_blocks(workload),
        time_scale=plan.time_scale,
        max_batch=plan.max_batch,
        seed=workload.config.seed,
    )
    rng = random.Random()
    token = secrets.token_urlsafe(12)
    async with contextlib.AsyncExitStack() as stack:
        _say(options, _intro(plan, workload, spec))
        fleet = SimProcess(spec, options.out_dir / "sim.log", fleet=plan.engines)
        stack.push_async_callback(fleet.stop)
        await fleet.start(rng)
        pods_file = write_pods_file(options.out_dir / "pods.json", fleet.endpoints)
        # The engines run at `time_scale` model seconds per wall second: the cost model's
        # prior (a 14B model on one GPU, as the engines are in model time) is told so.
        settings = Settings(pods_file=pods_file, admin_token=token, drain_timeout_s=2.0,
                            cost_prior_scale=1.0 / plan.time_scale)  # fmt: skip
        gateway = await serve_in_process(settings, options.port)
        stack.push_async_callback(gateway.stop)
        if options.port and gateway.port != options.port:
            _say(options, f"port {options.port} is taken: the gateway listens on {gateway.port}")
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=10.0))
        admin = AdminClient(client, gateway.url, token)
        await admin.wait_whole()
        _say(options, f"gateway {gateway.url}: {len(fleet.endpoints)} pods, subscribers whole")
        runs: list[tuple[RunSummary, list[RequestRecord]]] = []
        for policy in options.policies:
            runs.append(await _run_policy(options, policy, workload, fleet, admin, client,
                                          gateway.url))  # fmt: skip
        (base, _), (best, _) = runs
        print()
        print(f"kvgate demo: {workload.requests} requests per policy, {plan.engines} engines")
        print(format_table(base, best))
        print(f"\n=> {best.policy} vs {base.policy}: {headline(base, best)}")
        paths = _write_results(options.out_dir, plan, spec, runs)
        print("results: " + ", ".join(str(p) for p in paths))
        errors = base.errors + best.errors
        if errors:
            print(f"{errors} requests failed, e.g. {(base.first_errors or best.first_errors)[:1]}")
        if not options.serve:
            return 1 if errors else 0
        model = fleet.endpoints[0].model
        print(serving_instructions(gateway.url, model, token, plan.engines), flush=True)
        phase.serving = True
        await stop.wait()
        _say(options, "stopping the gateway and the engines")
    return 0


async def _run_policy(
    options: DemoOptions,
    policy: str,
    workload: ChatWorkload,
    fleet: SimProcess,
    admin: AdminClient,
    client: httpx.AsyncClient,
    gateway_url: str,
) -> tuple[RunSummary, list[RequestRecord]]:
    """Reset every engine's cache, wait until the index is empty, run the workload."""
    await reset_prefix_caches(client, [e.url for e in fleet.endpoints])
    await admin.wait_whole(empty=True)
    before = await read_counters(client, fleet.endpoints)
    cpu_before = (time.process_time(), fleet.cpu_total(), time.perf_counter())
    bar = ProgressBar(policy, workload.requests, enabled=options.progress)
    drawing = asyncio.create_task(bar.run(), name="kvgate-demo-progress")
    try:
        async with LoopLagProbe().running() as probe:
            model = fleet.endpoints[0].model
            spec = LoadSpec(gateway_url, model, policy, options.plan.time_scale)
            records = await run_load(spec, workload, bar.done)
    finally:
        drawing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drawing
    after = await read_counters(client, fleet.endpoints)
    elapsed = time.perf_counter() - cpu_before[2]
    cpu = {
        "gateway_and_load_generator": (time.process_time() - cpu_before[0]) / elapsed,
        "engines": (fleet.cpu_total() - cpu_before[1]) / elapsed,
    }
    engines = deltas(after, before)
    summary = summarize(policy, records, engines, options.plan.time_scale, probe.summary_ms(), cpu)
    if not options.progress:
        _say(options, f"{policy}: {summary.requests} requests in {summary.duration_s:.1f} s")
    return summary, records


def _intro(plan: DemoPlan, workload: ChatWorkload, spec: SimOptions) -> str:
    config = workload.config
    return (
        f"kvgate demo: {plan.engines} simulated engines ({spec.gpu_blocks} KV blocks of 16 "
        f"tokens each, time scale {spec.time_scale:g}), {config.sessions} chat sessions × "
        f"{config.turns} turns over {config.system_prompts} shared system prompts "
        f"(working set ≈ {workload.working_set_tokens():,} tokens), seed {config.seed}"
    )


def _write_results(
    out_dir: Path,
    plan: DemoPlan,
    spec: SimOptions,
    runs: list[tuple[RunSummary, list[RequestRecord]]],
) -> list[Path]:
    document = {
        "engines": plan.engines,
        "gpu_blocks_per_engine": spec.gpu_blocks,
        "time_scale": spec.time_scale,
        "workload": asdict(plan.workload_config),
        "runs": {summary.policy: summary.as_json(records) for summary, records in runs},
    }
    paths = [write_json(out_dir / "demo.json", document)]
    if plot(out_dir / "demo.png", runs):
        paths.append(out_dir / "demo.png")
    return paths


def _say(options: DemoOptions, message: str) -> None:
    if not options.quiet:
        print(message, file=sys.stderr, flush=True)
