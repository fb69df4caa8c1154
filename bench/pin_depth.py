"""`kvgate bench pin-depth`: seed 001's V5 depth sweep on simulated SGLang engines; the
protocol and figures are in docs/pinning.md ("Benchmark").

Per depth, a fresh pair of identical engines, each behind its own gateway: warm-up of the
VIP conversation through the gateway (pinned on one), a flood straight to the engine sized
from measured numbers (seed gotcha 8), then the measured turn, streamed, its TTFT and
cached tokens from the same stream (gotcha 9). The gateway's subscriber is connected
before the warm-up (gotcha 10).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.harness.engine_stats import cache_capacity_tokens
from bench.harness.fleet import EngineEndpoint, SimOptions, SimProcess, write_pods_file
from bench.harness.gateway import AdminClient, serve_in_process
from bench.harness.readiness import eventually, wait_http
from bench.harness.streaming import post_chat
from bench.results_io import RUNS_DIR, figure, write_json
from bench.workloads.pin_depth import (
    FloodTraffic,
    PinDepthWorkloadConfig,
    VipConversation,
    trie_tokens,
    vip_conversation,
)
from gateway.http.server import GatewayServer
from gateway.settings import Settings

ADMIN_TOKEN = "pin-depth-bench"
PIN_HEADERS = {"x-kvgate-pin": "ttl=3600", "x-kvgate-pin-token": ADMIN_TOKEN,
               "x-session-id": "vip"}  # fmt: skip
PROBE_SESSIONS = 6


@dataclass(frozen=True)
class Plan:
    depths: tuple[int, ...]
    gpu_blocks: int
    block_size: int
    time_scale: float
    flood_concurrency: int
    flood_osl: int
    cycles: float
    workload: PinDepthWorkloadConfig
    seed: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        workload = (
            PinDepthWorkloadConfig(
                vip_system_words=600, vip_user_words=250, vip_assistant_words=60, vip_messages=8,
                flood_system_words=100, flood_message_words=30, flood_turns=12, seed=args.seed,
            )
            if quick
            else PinDepthWorkloadConfig(seed=args.seed)
        )  # fmt: skip
        depths = tuple(args.depths) if args.depths else ((0, 2, 6) if quick else (0, 2, 6, 10, 16))
        plan = cls(
            depths=depths,
            gpu_blocks=args.gpu_blocks or (256 if quick else 2676),
            block_size=args.block_size,
            time_scale=args.time_scale or (20.0 if quick else 10.0),
            flood_concurrency=args.flood_concurrency,
            flood_osl=args.flood_osl,
            cycles=args.cycles,
            workload=workload,
            seed=args.seed,
        )
        if max(depths) + 2 > workload.vip_messages:
            plan = replace(plan, workload=replace(workload, vip_messages=max(depths) + 2))
        return plan


@dataclass(frozen=True)
class FloodPlan:
    capacity_tokens: int
    unique_tokens_per_request: float
    requests: int
    traffic: FloodTraffic


async def _tokenize(client: httpx.AsyncClient, url: str, model: str, chat: Any) -> list[int]:
    answer = await client.post(f"{url}/tokenize", json={"model": model, "messages": chat})
    answer.raise_for_status()
    tokens: list[int] = answer.json()["tokens"]
    return tokens


async def plan_flood(
    plan: Plan, client: httpx.AsyncClient, engine: EngineEndpoint, tokenizer: str
) -> FloodPlan:
    """The seed's rule, with both of its numbers measured: the capacity on the engine, the
    prompts' tokens at `tokenizer` (SGLang's /tokenize applies no chat template)."""
    capacity = await cache_capacity_tokens(client, engine.url)
    probe = FloodTraffic(plan.workload, PROBE_SESSIONS)
    prompts = [
        await _tokenize(client, tokenizer, engine.model, probe.request(j))
        for j in range(probe.capacity)
    ]
    unique = (trie_tokens(prompts) + len(prompts) * plan.flood_osl) / len(prompts)
    requests = math.ceil(capacity * plan.cycles / unique)
    sessions = math.ceil(requests / plan.workload.flood_turns)
    return FloodPlan(capacity, unique, requests, FloodTraffic(plan.workload, sessions))


async def _start_gateway(pods_file: Path, tokenizer: str) -> GatewayServer:
    # SGLang engines tokenize no chat messages: a vLLM tokenizer of the model does.
    settings = Settings(pods_file=pods_file, admin_token=ADMIN_TOKEN, pin_interval_s=0.2,
                        drain_timeout_s=2.0, tokenizer_endpoint=tokenizer)  # fmt: skip
    return await serve_in_process(settings)


async def _flood(
    client: httpx.AsyncClient, plan: Plan, flood: FloodPlan, url: str, model: str
) -> None:
    queue = iter(range(flood.requests))

    async def worker() -> None:
        for index in queue:
            body = {"model": model, "messages": flood.traffic.request(index),
                    "max_tokens": plan.flood_osl}  # fmt: skip
            (await client.post(f"{url}/v1/chat/completions", json=body)).raise_for_status()

    await asyncio.gather(*(worker() for _ in range(plan.flood_concurrency)))

    async def drained() -> bool:
        load: int = (await client.get(f"{url}/load")).json()["server_load"]
        return load == 0

    await eventually(drained, "the engine drained")


async def _caught_up(admin: AdminClient, engine: str) -> None:
    """Wait until the gateway has applied every event batch of the flood: the measured
    request must not queue behind the gateway's own backlog."""

    async def applied() -> bool:
        stats = (await admin.client.get(f"{engine}/sim/stats")).json()
        published = stats["publisher"]["next_seq"]
        subscriber = (await admin.pods())[0]["subscriber"] or {}
        return bool(subscriber.get("last_seq") == published - 1)

    await eventually(applied, "the gateway applied the flood's events")


async def _measure(
    client: httpx.AsyncClient, gateway: str, model: str, chat: Any
) -> tuple[float, int, int]:
    """TTFT (wall s) from the stream, and prompt / cached tokens from its usage chunk."""
    body = {"model": model, "messages": chat, "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    url = f"{gateway}/v1/chat/completions"
    answer = await post_chat(client, url, body, {"x-session-id": "vip"})
    if answer.error is not None:
        raise RuntimeError(f"the measured request failed: {answer.error}")
    assert answer.ttft_s is not None, "the stream carried no content"
    return answer.ttft_s, answer.usage_int("prompt_tokens"), answer.cached_tokens


async def run_phase(
    plan: Plan,
    phase: str,
    depth: int,
    engine: EngineEndpoint,
    vip: VipConversation,
    flood: FloodPlan,
    workdir: Path,
    tokenizer: str,
) -> dict[str, Any]:
    pods_file = write_pods_file(workdir / f"pods-{phase}-{depth}.json", [engine])
    gateway = await _start_gateway(pods_file, tokenizer)
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            admin = AdminClient(client, gateway.url, ADMIN_TOKEN)
            await wait_http(f"{gateway.url}/ready", timeout_s=30)
            body = {"model": engine.model, "messages": vip.chat(depth), "max_tokens": 1}
            headers = PIN_HEADERS if phase == "pinned" else {"x-session-id": "vip"}
            warm = await client.post(f"{gateway.url}/v1/chat/completions", json=body,
                                     headers=headers)  # fmt: skip
            warm.raise_for_status()
            blocks = 0
            if phase == "pinned":

                async def pinned() -> int:
                    pins = await admin.get("/admin/pins")
                    lease = pins["pins"][0] if pins["pins"] else None
                    return lease["blocks"] if lease and lease["state"] == "pinned" else 0

                blocks = await eventually(pinned, "the VIP conversation pinned", 30)
            await _flood(client, plan, flood, engine.url, engine.model)
            await _caught_up(admin, engine.url)
            ttft, prompt_tokens, cached = await _measure(
                client, gateway.url, engine.model, vip.chat(depth + 1)
            )
    finally:
        await gateway.stop()
    return {
        "phase": phase,
        "depth": depth,
        "prompt_tokens": prompt_tokens,
        "ttft_ms": ttft * plan.time_scale * 1000,
        "ttft_wall_ms": ttft * 1000,
        "cached_tokens": cached,
        "cached_pct": 100.0 * cached / prompt_tokens if prompt_tokens else 0.0,
        "blocks_pinned": blocks,
        "flood_requests": flood.requests,
    }


async def run_sweep(plan: Plan, workdir: Path) -> tuple[list[dict[str, Any]], FloodPlan]:
    vip = vip_conversation(plan.workload)
    spec = SimOptions(gpu_blocks=plan.gpu_blocks, time_scale=plan.time_scale, max_batch=32,
                      seed=plan.seed)  # fmt: skip
    sglang = replace(spec, extra=("--flavor", "sglang", "--block-size", str(plan.block_size)))
    rng = random.Random(plan.seed)
    rows: list[dict[str, Any]] = []
    flood: FloodPlan | None = None
    # SGLang's /tokenize applies no chat template: a vLLM tokenizer of the model does, for
    # the flood plan and for the gateway (AIBRIX_REMOTE_TOKENIZER_ENDPOINT), as deployed.
    tokenizer_fleet = SimProcess(spec, workdir / "tokenizer.log", fleet=1)
    await tokenizer_fleet.start(rng)
    tokenizer = tokenizer_fleet.endpoints[0].url
    try:
        for depth in plan.depths:
            fleet = SimProcess(sglang, workdir / "engines.log", fleet=2)
            await fleet.start(rng)
            try:
                baseline_engine, pinned_engine = fleet.endpoints
                if flood is None:
                    async with httpx.AsyncClient(timeout=30) as client:
                        flood = await plan_flood(plan, client, baseline_engine, tokenizer)
                    print(
                        f"flood: capacity {flood.capacity_tokens:,} tokens, "
                        f"{flood.unique_tokens_per_request:.0f} unique tokens per request -> "
                        f"{flood.requests} requests per depth ({plan.cycles:g}× the cache)",
                        flush=True,
                    )
                for phase, engine in (("baseline", baseline_engine), ("pinned", pinned_engine)):
                    row = await run_phase(plan, phase, depth, engine, vip, flood, workdir,
                                          tokenizer)  # fmt: skip
                    rows.append(row)
                    print(f"depth {depth:>2} {phase:<8} TTFT {row['ttft_ms']:8.1f} ms  "
                          f"cached {row['cached_pct']:5.1f}%", flush=True)  # fmt: skip
            finally:
                await fleet.stop()
    finally:
        await tokenizer_fleet.stop()
    assert flood is not None
    return rows, flood


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_depth: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_depth.setdefault(row["depth"], {})[row["phase"]] = row
    out = []
    for depth, phases in sorted(by_depth.items()):
        base, pinned = phases["baseline"], phases["pinned"]
        out.append(
            {
                "depth": depth,
                "prompt_tokens": pinned["prompt_tokens"],
                "ttft_baseline_ms": base["ttft_ms"],
                "ttft_pinned_ms": pinned["ttft_ms"],
                "speedup": base["ttft_ms"] / pinned["ttft_ms"] if pinned["ttft_ms"] else 0.0,
                "cached_baseline_pct": base["cached_pct"],
                "cached_pinned_pct": pinned["cached_pct"],
                "blocks_pinned": pinned["blocks_pinned"],
            }
        )
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    header = ("| Depth | Prompt Tokens | BL TTFT | PIN TTFT | Speedup | BL cached | PIN cached "
              "| Blocks Pinned |")  # fmt: skip
    print("\n" + header)
    print("|" + "|".join("-" * (len(cell) + 0) for cell in header.split("|")[1:-1]) + "|")
    for r in summary:
        print(
            f"| {r['depth']} | {r['prompt_tokens']:,} | {r['ttft_baseline_ms']:,.1f}ms "
            f"| {r['ttft_pinned_ms']:,.1f}ms | **{r['speedup']:.1f}x** "
            f"| {r['cached_baseline_pct']:.0f}% | {r['cached_pinned_pct']:.0f}% "
            f"| {r['blocks_pinned']} |"
        )
    print()


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    depths = [r["depth"] for r in summary]
    with figure(path, figsize=(7, 4.2), dpi=120) as (_fig, ax):
        ax.plot(depths, [r["ttft_baseline_ms"] for r in summary], "o-", label="baseline (no pin)")
        ax.plot(depths, [r["ttft_pinned_ms"] for r in summary], "s-", label="pinned by kvgate")
        ax.set_xlabel("conversation depth (messages before the measured turn)")
        ax.set_ylabel("TTFT after the flood (model ms)")
        ax.set_title("VIP conversation TTFT after a flood that cycles the cache")
        ax.grid(alpha=0.3)
        ax.legend()


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--quick", action="store_true", help="small cache and conversation, depths 0 2 6")
    add("--depths", type=int, nargs="+", default=None, help="depths (default 0 2 6 10 16)")
    add("--gpu-blocks", type=int, default=None, help="engine KV blocks (2676; quick 256)")
    add("--block-size", type=int, default=16, help="engine page size in tokens (default 16)")
    add("--time-scale", type=float, default=None, help="engine --time-scale (10; quick 20)")
    add("--flood-concurrency", type=int, default=8, help="flood requests in flight (8)")
    add("--flood-osl", type=int, default=4, help="answer tokens per flood request (4)")
    add("--cycles", type=float, default=3.0, help="times the flood cycles the cache (3)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, default=RUNS_DIR / "pin-depth", metavar="DIR",
        help="where results.json and ttft.png go (default bench/results/runs/pin-depth; "
        "with --keep bench/results/pin-depth)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    plan = Plan.from_args(args)
    print(f"pin-depth: depths {list(plan.depths)}, {plan.gpu_blocks} blocks × "
          f"{plan.block_size} tokens, time scale {plan.time_scale:g}", flush=True)  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvgate-pin-depth-") as tmp:
        rows, flood = asyncio.run(run_sweep(plan, Path(tmp)))
    summary = table(rows)
    print_table(summary)
    out: Path = args.out
    params = {**asdict(plan), "workload": asdict(plan.workload)}
    document = {
        "benchmark": "pin-depth",
        "params": params,
        "flood": {
            "capacity_tokens": flood.capacity_tokens,
            "unique_tokens_per_request": round(flood.unique_tokens_per_request, 1),
            "requests_per_depth": flood.requests,
        },
        "summary": summary,
        "runs": rows,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    json_path = write_json(out / "results.json", document)
    plot(summary, out / "ttft.png")
    print(f"wrote {json_path} and {out / 'ttft.png'}")
    return 0
