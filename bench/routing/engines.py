"""The engines a routing run sends to: simulated ones (the default, `--engines N`) or real
vLLM engines on CPU (`--engines vllm:N`), behind one interface the runner drives.

Simulated engines are sized per workload (`fleet.plan_fleet` / `plan_trace_fleet`) and run
faster than the modelled GPU by the plan's time scale. Real engines run in real time: each
on its own core with one thread (`bench/harness/vllm_fleet.py`), serving the benchmark's
small Llama with dummy weights, publishing real KV events. Their latency model is measured
on them once per run (`vllm_latency`), and it sizes the load as the simulator's own model
does for simulated engines; their KV cache is sized by the same rules, in vLLM's 32-token
CPU blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.fleet import (
    EngineEndpoint,
    endpoints_of,
    start_all,
    warm_up,
    write_pods_file,
)
from bench.harness.processes import ChildProcess
from bench.harness.vllm_fleet import VllmFleet, single_token_words, start_vllm_fleet
from bench.harness.vllm_latency import measure_latency
from bench.harness.vllm_model import BENCH_SHAPE, build_bench_model, vllm_python
from bench.routing.fleet import FleetPlan, engine_processes
from bench.routing.workloads import WorkloadSize
from bench.workloads.chat import WORDS as VOCABULARY
from simulator.latency import LatencyModel

VLLM_BLOCK_TOKENS = 32
"""vLLM's CPU attention takes block sizes that are multiples of 32 only."""
REAL_SIZE = WorkloadSize(
    conversations=24, turns=4, system_words=384, user_words_median=60, answer_tokens_median=12
)
"""The built-in workloads' size on real CPU engines: a prompt's prefill there takes ~5 ms a
token, so a run of ~100 requests at 80 % of two engines' capacity lasts about a minute."""
REAL_TRACE_SCALE = 1 / 16
"""A trace's lengths on real CPU engines: its 512-token blocks become 32 tokens, one vLLM
block (a conversation-trace prompt of 7 k tokens at p50 becomes ~430)."""


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """`--engines`: how many, and whether simulated vLLM (`8`), simulated SGLang (`sglang:8`)
    or real vLLM (`vllm:2`)."""

    count: int
    kind: str = "sim"

    @property
    def real(self) -> bool:
        return self.kind == "vllm"

    @property
    def flavor(self) -> str:
        """The simulated engines' flavour (`kvgate sim --flavor`)."""
        return "sglang" if self.kind == "sglang" else "vllm"

    @classmethod
    def parse(cls, raw: str) -> EngineChoice:
        match = re.fullmatch(r"(?:(vllm|sglang):)?(\d+)", raw.strip())
        if match is None or int(match.group(2)) < 1:
            raise argparse.ArgumentTypeError(
                "a count of simulated engines (8), sglang:N (simulated SGLang) or vllm:N"
            )
        return cls(int(match.group(2)), match.group(1) or "sim")


class RunFleet:
    """One workload's engines, for the runs of every router on it."""

    processes: Sequence[ChildProcess]
    endpoints: list[EngineEndpoint]
    pods: Path
    block_size: int = 16
    """Tokens per KV block of the engines (what their events' blocks hold)."""

    async def before_run(self, client: httpx.AsyncClient, fresh: bool) -> None:
        """Ready for the next router (the runner resets the prefix caches after this);
        `fresh`: on new engines, where that is cheap."""

    async def after_reset(self, client: httpx.AsyncClient) -> None:
        """Once the prefix caches are reset: until the engines have published it."""

    async def stop(self) -> None:
        raise NotImplementedError


class SimFleet(RunFleet):
    def __init__(self, plan: FleetPlan, log_dir: Path, seed: int, rng: random.Random) -> None:
        self.plan = plan
        self.processes = self._engines = engine_processes(plan, log_dir, seed)
        self.pods = log_dir / "pods.json"
        self._rng = rng

    async def start(self, client: httpx.AsyncClient) -> None:
        await start_all(self._engines, self._rng)
        self.endpoints = endpoints_of(self._engines)
        await warm_up(client, self.endpoints)  # every router then finds them warm
        write_pods_file(self.pods, self.endpoints, self.plan.topic)

    async def before_run(self, client: httpx.AsyncClient, fresh: bool) -> None:
        # A trace's routers each get new engines: a long trace leaves thousands of event
        # batches of long prompts in every engine's replay buffer, which each new gateway
        # would replay at start-up (minutes, for nothing: the cache was reset since).
        if fresh:
            await self.stop()
            await self.start(client)

    async def stop(self) -> None:
        await asyncio.gather(*(engine.stop() for engine in self._engines))


class RealFleet(RunFleet):
    """vLLM engines for one workload (started per workload: their KV cache and context
    length are set at start-up)."""

    block_size = VLLM_BLOCK_TOKENS

    def __init__(self, fleet: VllmFleet, pods: Path) -> None:
        self._fleet = fleet
        self.processes = fleet.engines
        self.endpoints = fleet.endpoints
        self.pods = pods

    @classmethod
    async def start(
        cls, plan: FleetPlan, model_dir: Path, log_dir: Path, client: httpx.AsyncClient
    ) -> RealFleet:
        tokens = plan.gpu_blocks * 16
        blocks = max(math.ceil(tokens / VLLM_BLOCK_TOKENS),
                     math.ceil(plan.max_model_len / VLLM_BLOCK_TOKENS) + 1)  # fmt: skip
        fleet = await start_vllm_fleet(
            plan.engines, log_dir, num_blocks=blocks, max_model_len=plan.max_model_len,
            model_dir=model_dir,
        )  # fmt: skip
        pods = write_pods_file(log_dir / "pods.json", fleet.endpoints, fleet.topic)
        await warm_up(client, fleet.endpoints)
        return cls(fleet, pods)

    async def after_reset(self, client: httpx.AsyncClient) -> None:
        """vLLM publishes a reset (AllBlocksCleared) at its next step: each engine runs
        one on a prompt shorter than a block, which stores none. Without it a new gateway
        replays the blocks stored before the reset and finds them in no engine."""

        async def step(endpoint: EngineEndpoint) -> None:
            body = {"model": endpoint.model, "prompt": "reset", "max_tokens": 1}
            answer = await client.post(f"{endpoint.url}/v1/completions", json=body)
            answer.raise_for_status()

        await asyncio.gather(*(step(endpoint) for endpoint in self.endpoints))

    async def stop(self) -> None:
        await self._fleet.stop()


class RealEngines:
    """What a run on real engines shares across its workloads: the model (built once),
    its single-token words and its measured latency model."""

    def __init__(self, out_dir: Path) -> None:
        self.model_dir = out_dir / "logs" / "model"
        self.latency: LatencyModel | None = None
        self.measured_len = 0
        """The context length the latency model was measured under (its longest prompts)."""
        self.vocabulary: tuple[str, ...] | None = None

    async def prepare(self) -> None:
        await asyncio.to_thread(vllm_python)  # no vLLM venv: say so before building anything
        await asyncio.to_thread(build_bench_model, self.model_dir)

    async def measure(
        self, client: httpx.AsyncClient, endpoint: EngineEndpoint, max_model_len: int
    ) -> None:
        """The words its tokenizer holds as one token, and the engines' latency model:
        measured once (every workload's engines are the same model on the same cores),
        and again where a workload's engines admit longer prompts than it was measured on
        (`max_model_len`: the profile's prompts stay within the engines' context)."""
        if self.vocabulary is None:
            words = await single_token_words(client, endpoint, VOCABULARY)
            self.vocabulary = tuple(words)
        if self.latency is None or max_model_len > self.measured_len:
            self.latency = await measure_latency(
                client, endpoint, self.vocabulary, max_model_len=max_model_len
            )
            self.measured_len = max_model_len

    def plan(self, plan: FleetPlan) -> FleetPlan:
        """`plan` for these engines: real time, vLLM's hashes and topic, measured latency."""
        latency = self.latency or plan.latency
        return dataclasses.replace(plan.vllm_like(), time_scale=1.0, latency=latency)

    @staticmethod
    def context(plan: FleetPlan, longest: int) -> FleetPlan:
        """A context length that admits the workload's longest request (rounded up to
        vLLM's block, and no longer than the model's)."""
        length = math.ceil((longest + 64) / VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS
        return dataclasses.replace(plan, max_model_len=min(length, BENCH_SHAPE.max_model_len))
