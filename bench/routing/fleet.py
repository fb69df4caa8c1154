"""The benchmark's engines: N simulated engines, each its own process, sized per workload.

Sizing: together the engines' caches hold the workload's working set, but one holds at
most a quarter of it, so no router can keep everything everywhere and where a
conversation goes matters (never less than two of the largest requests). Capacity is
the rate the fleet could serve if every request found its reusable prefix cached, from the
simulator's own latency model; `--load 0.8` is 80 % of it, so a router that loses the
cache needs more engine time per request and saturates earlier.

A replayed trace's working set is far beyond any fleet's memory, so its engines are sized
as real ones are instead: each holds what the calibrated model's KV cache gets on one
80 GB GPU (`TRACE_KV_TOKENS`), and its ideal capacity counts as cached only what one
least-recently-used cache of the whole fleet's size would hold (the best a router could
keep), not the trace's unbounded reuse.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.harness.fleet import SimOptions, SimProcess
from bench.routing.script import Script
from bench.routing.trace import TraceRequest, cached_tokens, reused_blocks
from simulator.latency import LatencyModel

BLOCK_SIZE = 16
WALL_RATE = 40.0
"""Requests per wall second at 100 % load, unless a run sets its time scale: what the
machine's cores carry beside the engines' and routers' own work."""
TRACE_WALL_RATE = 12.0
"""The same for a replayed trace, whose prompts are ten times longer (more CPU each to
tokenize, hash and relay): at it, a trace run keeps under one of 2 cores busy."""
TEMPLATE_MARGIN = 64
"""Context a trace's engines allow beyond its longest request: the chat template's tokens."""
TRACE_KV_TOKENS = 320_000
"""KV cache tokens per engine for a replayed trace: the latency calibration's model
(Qwen3-14B: 40 layers × 8 KV heads × 128 dims × K and V × 2 bytes = 160 KiB a token) on one
80 GB GPU at vLLM's default `gpu_memory_utilization` of 0.9 (72 GB), less ~16 GB of FP8
weights and ~4 GB of activations: ~52 GB, ~320 k tokens."""
SIM_TOPIC = "kv-events"
"""`kvgate sim --topic`'s default."""


@dataclass(frozen=True, slots=True)
class FleetPlan:
    engines: int
    gpu_blocks: int
    time_scale: float
    max_batch: int = 32
    latency: LatencyModel = field(default_factory=LatencyModel)
    slowdown: float = 1.0
    """The second half of the engines (e4..e7 of 8) are this much slower at everything."""
    block_hash: str = "sim"
    """`kvgate sim --block-hash`: the simulator's own scheme, or vLLM's `sha256_cbor`."""
    topic: str = SIM_TOPIC
    max_model_len: int = 32768
    """The engines' context length: a longer request is refused, as vLLM refuses it."""
    flavor: str = "vllm"
    """`kvgate sim --flavor`: SGLang engines tokenize no chat (kvgate then tokenizes
    in-process with the simulated model's files)."""

    def vllm_like(self) -> FleetPlan:
        """Engines that publish exactly as a vLLM started with PYTHONHASHSEED=0 and default
        KV events does: sha256_cbor block hashes, on vLLM's default topic ''."""
        return replace(self, block_hash="sha256_cbor", topic="")

    def slow(self, index: int) -> bool:
        return self.slowdown != 1.0 and index >= self.engines - self.engines // 2

    def engine_latency(self, index: int) -> LatencyModel:
        if not self.slow(index):
            return self.latency
        factor = self.slowdown
        latency = self.latency
        return dataclasses.replace(
            latency,
            request_overhead_ms=latency.request_overhead_ms * factor,
            prefill_us_per_token=latency.prefill_us_per_token * factor,
            prefill_us_per_token_sq=latency.prefill_us_per_token_sq * factor,
            decode_ms_per_token=latency.decode_ms_per_token * factor,
            decode_ms_per_seq=latency.decode_ms_per_seq * factor,
        )

    def sim_args(self, index: int = 0) -> list[str]:
        latency = self.engine_latency(index)
        hashing = [] if self.block_hash == "sim" else ["--block-hash", self.block_hash]
        topic = [] if self.topic == SIM_TOPIC else [f"--topic={self.topic}"]
        flavor = [] if self.flavor == "vllm" else ["--flavor", self.flavor]
        return [
            *hashing,
            *topic,
            *flavor,
            "--request-overhead-ms", str(latency.request_overhead_ms),
            "--prefill-us-per-token", str(latency.prefill_us_per_token),
            "--prefill-us-per-token-sq", str(latency.prefill_us_per_token_sq),
            "--decode-ms-per-token", str(latency.decode_ms_per_token),
            "--decode-ms-per-seq", str(latency.decode_ms_per_seq),
        ]  # fmt: skip


def plan_fleet(
    script: Script,
    engines: int,
    time_scale: float,
    *,
    slack: float = 1.5,
    max_batch: int = 32,
    latency: LatencyModel | None = None,
    slowdown: float = 1.0,
) -> FleetPlan:
    working_set = script.working_set_tokens()
    per_engine = working_set / engines
    if engines >= 4:
        per_engine = min(slack * per_engine, working_set / 4)
    blocks = math.ceil(per_engine / BLOCK_SIZE)
    floor = 2 * math.ceil(script.longest_request_tokens() / BLOCK_SIZE) + 8
    return FleetPlan(
        engines, max(blocks, floor), time_scale, max_batch, latency or LatencyModel(), slowdown
    )


def plan_trace_fleet(
    requests: Sequence[TraceRequest],
    engines: int,
    time_scale: float,
    *,
    max_batch: int = 32,
    kv_tokens: int = TRACE_KV_TOKENS,
) -> FleetPlan:
    """Engines as real ones for a trace: `kv_tokens` of KV cache each (a trace scaled down
    gets its share), a context length that admits its longest request."""
    longest = max(r.input_length + r.output_length for r in requests) + TEMPLATE_MARGIN
    blocks = kv_tokens // BLOCK_SIZE
    return FleetPlan(engines, blocks, time_scale, max_batch, max_model_len=longest)


def trace_service_seconds(requests: Sequence[TraceRequest], plan: FleetPlan) -> float:
    """Mean model seconds of engine time per request when every prefix that one LRU cache
    of the whole fleet's size would hold is cached (the best any router can do)."""
    latency = plan.latency
    fleet_blocks = plan.engines * plan.gpu_blocks * BLOCK_SIZE // requests[0].block_tokens
    decode_per_token = latency.decode_ms_per_token / plan.max_batch + latency.decode_ms_per_seq
    total = 0.0
    for request, reused in zip(requests, reused_blocks(requests, fleet_blocks), strict=True):
        cached = cached_tokens(request, reused, BLOCK_SIZE)
        total += latency.prefill_seconds(request.input_length - cached, cached)
        total += request.output_length * decode_per_token / 1e3
    return total / len(requests)


def ideal_service_seconds(script: Script, plan: FleetPlan, index: int = 0) -> float:
    """Mean model seconds of engine `index`'s time per request when every reusable prefix
    is cached."""
    latency = plan.engine_latency(index)
    total = 0.0
    decode_per_token = latency.decode_ms_per_token / plan.max_batch + latency.decode_ms_per_seq
    for conversation in script.conversations:
        reusable = script.shared_prefixes.get(conversation.shared_prefix or "", 0)
        for turn in conversation.turns:
            prompt = turn.prompt_tokens()
            cached = min(prompt - 1, reusable) // BLOCK_SIZE * BLOCK_SIZE
            total += latency.prefill_seconds(prompt - cached, cached)
            total += turn.max_tokens * decode_per_token / 1e3
            reusable = prompt
    return total / script.requests


def capacity_rps(script: Script, plan: FleetPlan) -> float:
    """Ideal fleet capacity in requests per model second (each engine at its own speed)."""
    fast = ideal_service_seconds(script, plan, 0)
    slow = ideal_service_seconds(script, plan, plan.engines - 1) if plan.slowdown != 1.0 else fast
    return sum(1 / (slow if plan.slow(i) else fast) for i in range(plan.engines))


def engine_processes(plan: FleetPlan, log_dir: Path, seed: int) -> list[SimProcess]:
    """`plan.engines` engine processes, each with its own name, seed and latency model."""
    return [
        SimProcess(
            SimOptions(plan.gpu_blocks, plan.time_scale, plan.max_batch, plan.max_model_len,
                       seed=seed + index, extra=tuple(plan.sim_args(index))),
            log_dir / f"engine-{index}.log",
            fleet=1,
            name=f"e{index}",
        )
        for index in range(plan.engines)
    ]  # fmt: skip
